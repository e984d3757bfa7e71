/*
 * kvdepotd: the store daemon's command line.
 *
 *   kvdepotd [--config FILE] [--set key=value ...] [--ready-file PATH]
 *   kvdepotd [--config FILE] [--set key=value ...] --print-config
 *
 * --print-config prints every setting, then checks them all as a start
 * would (exit code 2 naming the key and the reason when one is bad).
 *
 * Settings resolve as everywhere in kvdepot: --set > KVDEPOT_* environment >
 * the YAML file > defaults (--print-config shows each with its source). A
 * bad setting fails at start with its key and the reason, exit code 2.
 * Signals: SIGTERM / SIGINT stop gracefully (exit 0); SIGHUP reloads the
 * file and applies what can change while running (log.level); other
 * changes are reported as needing a restart.
 * --ready-file: once every listener is up, PATH is written (atomically)
 * with `pid=`, `tcp_port=` and `metrics_port=` lines, for tests and for
 * supervisors that pick ports at run time. It is removed as the stop
 * begins, so "the file exists" means "the daemon is serving".
 * server.exit_when_idle: the daemon stops as on SIGTERM (exit 0) once it
 * has had no local client for that long (server/server_handoff.c).
 * File descriptors: the soft RLIMIT_NOFILE is raised to the hard limit (at
 * most 1,048,576) before anything opens, because the hand-off socket, gRPC
 * and the metrics listener share them and a client can hold one per
 * connection (the shipped systemd unit sets both to 65,536; a bare shell or
 * container often starts at a soft 1,024). Nothing in the daemon uses
 * select(), so descriptors above 1,023 are fine.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "server/server_int.h"

typedef struct main_settings {
    char log_level[KVD_CONFIG_STRING_MAX];
} main_settings_t;

static const kvd_config_field_t main_fields[] = {
    {"log.level", "info",
     "error, warn, info or debug (SIGHUP applies a new value)",
     kvd_config_parse_string, offsetof(main_settings_t, log_level), 0, 0, NULL},
};

/* Raises the soft descriptor limit to the hard one (see the top). */
static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) {
        return;
    }
    rlim_t want = rl.rlim_max < (rlim_t)1 << 20 ? rl.rlim_max : (rlim_t)1 << 20;
    if (rl.rlim_cur >= want) {
        return;
    }
    rlim_t was = rl.rlim_cur;
    rl.rlim_cur = want;
    if (setrlimit(RLIMIT_NOFILE, &rl) == 0) {
        KVD_LOG_INFO("kvdepotd: file descriptor limit raised from %llu to %llu",
                     (unsigned long long)was, (unsigned long long)want);
    } else {
        KVD_LOG_WARN("kvdepotd: file descriptor limit stays %llu (cannot "
                     "raise it to %llu)",
                     (unsigned long long)was, (unsigned long long)want);
    }
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: kvdepotd [--config FILE] [--set key=value ...] "
            "[--ready-file PATH] [--print-config]\n"
            "  --config FILE     YAML settings (deploy/config/kvdepotd.yaml "
            "documents every key)\n"
            "  --set key=value   one setting, highest precedence\n"
            "  --ready-file PATH write pid and bound ports once ready\n"
            "  --print-config    show every setting, its value and source, "
            "then exit\n");
}

/* Builds the configuration from the file and the --set pairs. */
static int load_config(const char *file, char **sets, int nsets,
                       kvd_config_t **out)
{
    kvd_config_t *cfg = NULL;
    char err[512] = "";
    if (kvd_config_create(&cfg) != KVD_OK) {
        fprintf(stderr, "kvdepotd: out of memory\n");
        return 1;
    }
    if (file != NULL &&
        kvd_config_load_file(cfg, file, err, sizeof err) != KVD_OK) {
        fprintf(stderr, "kvdepotd: --config %s: %s\n", file, err);
        kvd_config_destroy(cfg);
        return 2;
    }
    for (int i = 0; i < nsets; i++) {
        char *eq = strchr(sets[i], '=');
        if (eq == NULL || eq == sets[i]) {
            fprintf(stderr, "kvdepotd: --set %s: want key=value\n", sets[i]);
            kvd_config_destroy(cfg);
            return 2;
        }
        *eq = '\0';
        kvd_status_t s = kvd_config_set(cfg, sets[i], eq + 1);
        *eq = '=';
        if (s != KVD_OK) {
            fprintf(stderr, "kvdepotd: --set %s: %s\n", sets[i],
                    kvd_status_str(s));
            kvd_config_destroy(cfg);
            return 2;
        }
    }
    *out = cfg;
    return 0;
}

static int apply_log_level(const kvd_config_t *cfg)
{
    main_settings_t ms;
    char err[512] = "";
    kvd_log_level_t level;
    if (kvd_config_apply(cfg, main_fields, 1, &ms, err, sizeof err) != KVD_OK) {
        fprintf(stderr, "kvdepotd: %s\n", err);
        return 2;
    }
    if (kvd_log_level_parse(ms.log_level, &level) != KVD_OK) {
        fprintf(stderr,
                "kvdepotd: log.level \"%s\": want error, warn, info "
                "or debug\n",
                ms.log_level);
        return 2;
    }
    kvd_log_set_level(level);
    return 0;
}

static int write_ready(const char *path, const kvd_server_t *srv)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "we");
    if (f == NULL) {
        perror("kvdepotd: --ready-file");
        return -1;
    }
    fprintf(f, "pid=%d\ntcp_port=%d\nmetrics_port=%d\n", (int)getpid(),
            kvd_server_tcp_port(srv), kvd_server_metrics_port(srv));
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        perror("kvdepotd: --ready-file");
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *file = NULL, *ready = NULL;
    bool print = false;
    char **sets = calloc((size_t)argc, sizeof *sets);
    int nsets = 0;
    if (sets == NULL) {
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--config") == 0 && i + 1 < argc) {
            file = argv[++i];
        } else if (strcmp(argv[i], "--set") == 0 && i + 1 < argc) {
            sets[nsets++] = argv[++i];
        } else if (strcmp(argv[i], "--ready-file") == 0 && i + 1 < argc) {
            ready = argv[++i];
        } else if (strcmp(argv[i], "--print-config") == 0) {
            print = true;
        } else if (strcmp(argv[i], "--help") == 0 ||
                   strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            free(sets);
            return 0;
        } else {
            fprintf(stderr, "kvdepotd: unknown argument %s\n", argv[i]);
            usage(stderr);
            free(sets);
            return 2;
        }
    }
    kvd_config_t *cfg = NULL;
    int rc = load_config(file, sets, nsets, &cfg);
    if (rc == 0) {
        rc = apply_log_level(cfg);
    }
    if (rc != 0) {
        kvd_config_destroy(cfg);
        free(sets);
        return rc;
    }
    if (print) {
        /* Print, then check: an operator sees every key and learns which
         * one would stop the start (exit code 2, as the start would). */
        kvd_config_print(cfg, main_fields, 1, stdout);
        kvd_status_t s = kvd_server_print_config(cfg, stdout);
        char err[512] = "";
        if (s == KVD_OK) {
            s = kvd_server_check_config(cfg, err, sizeof err);
            if (s != KVD_OK) {
                fprintf(stderr, "kvdepotd: %s\n",
                        err[0] ? err : kvd_status_str(s));
            }
        }
        kvd_config_destroy(cfg);
        free(sets);
        return s == KVD_OK ? 0 : 2;
    }

    /* Signals go to this thread only: block them before any thread starts
     * (threads inherit the mask), then wait for them synchronously. */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();

    kvd_server_t *srv = NULL;
    char err[512] = "";
    kvd_status_t s = kvd_server_open(cfg, &srv, err, sizeof err);
    if (s != KVD_OK) {
        fprintf(stderr, "kvdepotd: %s%s%s\n", err[0] ? err : "",
                err[0] ? ": " : "", kvd_status_str(s));
        kvd_config_destroy(cfg);
        free(sets);
        return s == KVD_ERR_NOMEM || s == KVD_ERR_IO ? 1 : 2;
    }
    if (ready != NULL && write_ready(ready, srv) != 0) {
        kvd_server_stop(srv);
        kvd_config_destroy(cfg);
        free(sets);
        return 1;
    }
    for (;;) {
        /* Woken by a signal, or every 100 ms to see whether
         * server.exit_when_idle has passed. */
        struct timespec tick = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
        int sig = sigtimedwait(&set, NULL, &tick);
        if (sig < 0) {
            if (kvd_server_idle_expired(srv)) {
                break;
            }
            continue;
        }
        if (sig == SIGHUP) {
            kvd_config_t *fresh = NULL;
            if (load_config(file, sets, nsets, &fresh) == 0 &&
                apply_log_level(fresh) == 0) {
                KVD_LOG_INFO("kvdepotd: SIGHUP: configuration reloaded "
                             "(log.level applied; other keys take effect "
                             "at restart)");
            } else {
                KVD_LOG_WARN("kvdepotd: SIGHUP: configuration not reloaded "
                             "(see the error above); running as before");
            }
            kvd_config_destroy(fresh);
            continue;
        }
        break;
    }
    if (ready != NULL) {
        (void)unlink(ready);
    }
    kvd_server_stop(srv);
    kvd_config_destroy(cfg);
    free(sets);
    return 0;
}
