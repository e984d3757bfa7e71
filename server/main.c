/*
 * kvdepotd: the store daemon's command line.
 *
 *   kvdepotd [--config FILE] [--set key=value ...] [--ready-file PATH]
 *   kvdepotd [--config FILE] [--set key=value ...] --print-config
 *   kvdepotd [--config FILE] [--set key=value ...] --check-config
 *   kvdepotd --version | --help
 *
 * --print-config prints every setting, then checks their values as a
 * start would (exit code 2, one line per error naming the key and the
 * reason). --check-config runs those checks and also looks at the
 * directories the start writes in (the unix socket's, store.disk_path),
 * without printing the settings and without starting, binding or creating
 * anything: exit 0 when the start would accept the configuration, else 1
 * with one line per error. kvd_server_open runs the same checks first, so
 * what the start refuses for a value both refuse. An unknown --set key is
 * refused before anything else, with the known key closest to it ("did you
 * mean").
 *
 * Settings resolve as everywhere in kvdepot: --set > KVDEPOT_* environment >
 * the YAML file > defaults (--print-config shows each with its source). A
 * bad setting fails at start with its key and the reason, exit code 2;
 * every error is printed once, on stderr.
 * Signals: SIGTERM / SIGINT stop gracefully (exit 0); SIGHUP reloads the
 * file and applies what can change while running (log.level); other
 * changes are reported as needing a restart.
 * --ready-file: once every listener is up, PATH is written (atomically)
 * with `pid=`, `tcp_port=` and `metrics_port=` lines, for tests and for
 * supervisors that pick ports at run time. It is removed as the stop
 * begins, so "the file exists" means "the daemon is serving".
 * systemd (server_notify.c; deploy/systemd/kvdepotd.service is
 * Type=notify): STATUS= lines during the start, READY=1 when serving,
 * STOPPING=1 as the stop begins, and WATCHDOG=1 every WatchdogSec/2 while
 * the service's housekeeping thread keeps passing (a stuck daemon stops
 * feeding it and systemd restarts it). When stderr is the journal
 * ($JOURNAL_STREAM) or log.syslog_prefix is on, every line carries its
 * syslog priority ("<3>" error ... "<7>" debug).
 * server.exit_when_idle: the daemon stops as on SIGTERM (exit 0) once it
 * has had no local client for that long (server/server_handoff.c).
 * File descriptors: the soft RLIMIT_NOFILE is raised to the hard limit (at
 * most 1,048,576) before anything opens, because the hand-off socket, gRPC
 * and the metrics listener share them and a client can hold one per
 * connection (the shipped systemd unit sets both to 65,536; a bare shell or
 * container often starts at a soft 1,024). Nothing in the daemon uses
 * select(), so descriptors above 1,023 are fine.
 */
#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "server/server_int.h"

typedef struct main_settings {
    char log_level[KVD_CONFIG_STRING_MAX];
    int syslog_prefix; /* MAIN_PREFIX_* */
} main_settings_t;

enum { MAIN_PREFIX_AUTO, MAIN_PREFIX_ON, MAIN_PREFIX_OFF };

static const char *const prefix_choices[] = {"auto", "on", "off", NULL};

static const kvd_config_field_t main_fields[] = {
    {"log.level", "info",
     "error, warn, info or debug (SIGHUP applies a new value)",
     kvd_config_parse_string, offsetof(main_settings_t, log_level), 0, 0, NULL},
    {"log.syslog_prefix", "auto",
     "start each log line with its syslog priority (<3> error, <4> warn, "
     "<6> info, <7> debug) for journald: auto (when stderr is the journal, "
     "$JOURNAL_STREAM), on or off",
     kvd_config_parse_enum, offsetof(main_settings_t, syslog_prefix), 0, 0,
     prefix_choices},
};

#define MAIN_NFIELDS (sizeof main_fields / sizeof main_fields[0])

/* Exit codes: a configuration the start refuses is 2 (1 for
 * --check-config, which answers only "acceptable or not"). */
enum { MAIN_EXIT_OK = 0, MAIN_EXIT_FAIL = 1, MAIN_EXIT_CONFIG = 2 };

/* One line of the command line's own on stderr, with its syslog priority
 * when the log lines carry theirs. */
__attribute__((format(printf, 1, 2))) static void main_error(const char *fmt,
                                                             ...)
{
    char msg[1200];
    va_list ap;
    va_start(ap, fmt);
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%skvdepotd: %s\n",
            kvd_log_syslog_prefix(KVD_LOG_LEVEL_ERROR), msg);
}

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
            "[--ready-file PATH]\n"
            "                [--print-config | --check-config]\n"
            "       kvdepotd --version | --help\n"
            "  -c, --config FILE     YAML settings "
            "(deploy/config/kvdepotd.yaml documents every key)\n"
            "  -s, --set key=value   one setting, highest precedence "
            "(repeatable)\n"
            "  -r, --ready-file PATH write pid and bound ports once ready\n"
            "  -p, --print-config    show every setting, its value and "
            "source, check them, exit\n"
            "  -C, --check-config    check the settings as a start would "
            "(binds nothing), exit 0 or 1\n"
            "  -V, --version         print the version and exit\n"
            "  -h, --help            this text\n");
}

typedef enum { MAIN_RUN, MAIN_PRINT, MAIN_CHECK } main_mode_t;

typedef struct main_args {
    const char *file;
    const char *ready;
    main_mode_t mode;
    char **sets;
    int nsets;
} main_args_t;

/* getopt_long over argv: MAIN_EXIT_OK to go on, else the exit code (-1:
 * --help or --version answered, exit 0). */
static int parse_args(int argc, char **argv, main_args_t *a)
{
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"set", required_argument, NULL, 's'},
        {"ready-file", required_argument, NULL, 'r'},
        {"print-config", no_argument, NULL, 'p'},
        {"check-config", no_argument, NULL, 'C'},
        {"version", no_argument, NULL, 'V'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int c;
    opterr = 0; /* our own messages, printed once */
    while ((c = getopt_long(argc, argv, ":c:s:r:pCVh", opts, NULL)) != -1) {
        switch (c) {
        case 'c': a->file = optarg; break;
        case 's': a->sets[a->nsets++] = optarg; break;
        case 'r': a->ready = optarg; break;
        case 'p': a->mode = MAIN_PRINT; break;
        case 'C': a->mode = MAIN_CHECK; break;
        case 'V': printf("kvdepotd %s\n", kvd_version()); return -1;
        case 'h': usage(stdout); return -1;
        case ':':
            main_error("%s needs a value", argv[optind - 1]);
            usage(stderr);
            return MAIN_EXIT_CONFIG;
        default:
            main_error("unknown argument %s", argv[optind - 1]);
            usage(stderr);
            return MAIN_EXIT_CONFIG;
        }
    }
    if (optind < argc) {
        main_error("unexpected argument %s", argv[optind]);
        usage(stderr);
        return MAIN_EXIT_CONFIG;
    }
    return MAIN_EXIT_OK;
}

/* One --set key=value into `cfg`: a key kvdepotd knows, or an error with
 * the nearest known key. */
static int apply_set(kvd_config_t *cfg, char *pair)
{
    char *eq = strchr(pair, '=');
    if (eq == NULL || eq == pair) {
        main_error("--set %s: want key=value", pair);
        return MAIN_EXIT_CONFIG;
    }
    *eq = '\0';
    const char *closest = NULL;
    int rc = MAIN_EXIT_OK;
    if (!kvd_server_config_known(pair, main_fields, MAIN_NFIELDS, &closest)) {
        if (closest != NULL) {
            main_error("--set %s: unknown setting; did you mean %s?", pair,
                       closest);
        } else {
            main_error("--set %s: unknown setting (--print-config lists "
                       "them)",
                       pair);
        }
        rc = MAIN_EXIT_CONFIG;
    } else {
        kvd_status_t s = kvd_config_set(cfg, pair, eq + 1);
        if (s != KVD_OK) {
            main_error("--set %s: %s", pair, kvd_status_str(s));
            rc = MAIN_EXIT_CONFIG;
        }
    }
    *eq = '=';
    return rc;
}

/* Builds the configuration from the file and the --set pairs. */
static int load_config(const main_args_t *a, kvd_config_t **out)
{
    kvd_config_t *cfg = NULL;
    char err[512] = "";
    if (kvd_config_create(&cfg) != KVD_OK) {
        main_error("out of memory");
        return MAIN_EXIT_FAIL;
    }
    if (a->file != NULL &&
        kvd_config_load_file(cfg, a->file, err, sizeof err) != KVD_OK) {
        main_error("--config %s: %s", a->file, err);
        kvd_config_destroy(cfg);
        return MAIN_EXIT_CONFIG;
    }
    for (int i = 0; i < a->nsets; i++) {
        int rc = apply_set(cfg, a->sets[i]);
        if (rc != MAIN_EXIT_OK) {
            kvd_config_destroy(cfg);
            return rc;
        }
    }
    *out = cfg;
    return MAIN_EXIT_OK;
}

/* log.level and log.syslog_prefix. */
static int apply_log_settings(const kvd_config_t *cfg)
{
    main_settings_t ms;
    char err[512] = "";
    kvd_log_level_t level;
    if (kvd_config_apply(cfg, main_fields, MAIN_NFIELDS, &ms, err,
                         sizeof err) != KVD_OK) {
        main_error("%s", err);
        return MAIN_EXIT_CONFIG;
    }
    if (kvd_log_level_parse(ms.log_level, &level) != KVD_OK) {
        main_error("log.level \"%s\": want error, warn, info or debug",
                   ms.log_level);
        return MAIN_EXIT_CONFIG;
    }
    kvd_log_set_syslog_prefix(
        ms.syslog_prefix == MAIN_PREFIX_ON ||
        (ms.syslog_prefix == MAIN_PREFIX_AUTO && kvd_log_stderr_is_journal()));
    kvd_log_set_level(level);
    return MAIN_EXIT_OK;
}

static int write_ready(const char *path, const kvd_server_t *srv)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "we");
    if (f == NULL) {
        main_error("--ready-file %s: %s", tmp, strerror(errno));
        return -1;
    }
    fprintf(f, "pid=%d\ntcp_port=%d\nmetrics_port=%d\n", (int)getpid(),
            kvd_server_tcp_port(srv), kvd_server_metrics_port(srv));
    if (fclose(f) != 0 || rename(tmp, path) != 0) {
        main_error("--ready-file %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

static void report_error(void *ctx, const char *msg)
{
    (void)ctx;
    main_error("%s", msg);
}

/* --print-config and --check-config. */
static int print_or_check(const kvd_config_t *cfg, main_mode_t mode)
{
    if (mode == MAIN_PRINT) {
        /* Print, then check: an operator sees every key and learns which
         * ones would stop the start (exit code 2, as the start would). */
        kvd_status_t s =
            kvd_config_print(cfg, main_fields, MAIN_NFIELDS, stdout);
        if (s == KVD_OK) {
            s = kvd_server_print_config(cfg, stdout);
        }
        if (s != KVD_OK) {
            main_error("--print-config: %s", kvd_status_str(s));
            return MAIN_EXIT_FAIL;
        }
    }
    size_t n = kvd_server_check_config_each(cfg, mode == MAIN_CHECK,
                                            report_error, NULL);
    if (mode == MAIN_CHECK && n == 0) {
        printf("kvdepotd: configuration OK\n");
    }
    if (n == 0) {
        return MAIN_EXIT_OK;
    }
    return mode == MAIN_CHECK ? MAIN_EXIT_FAIL : MAIN_EXIT_CONFIG;
}

/* SIGHUP: reload the file and the --set pairs, apply log.level. */
static void reload(const main_args_t *a)
{
    kvd_config_t *fresh = NULL;
    if (load_config(a, &fresh) == 0 && apply_log_settings(fresh) == 0) {
        KVD_LOG_INFO("kvdepotd: SIGHUP: configuration reloaded "
                     "(log.level applied; other keys take effect "
                     "at restart)");
    } else {
        KVD_LOG_WARN("kvdepotd: SIGHUP: configuration not reloaded "
                     "(see the error above); running as before");
    }
    kvd_config_destroy(fresh);
}

/* Feeds systemd's watchdog every half interval while the service's
 * housekeeping thread keeps passing; a stuck daemon is left to be
 * restarted. */
static void watchdog_feed(kvd_server_t *srv, uint64_t usec, uint64_t *next_ms)
{
    uint64_t now = kvd_time_now_ms();
    if (usec == 0 || now < *next_ms) {
        return;
    }
    uint64_t half_ms = usec / 2000 > 0 ? usec / 2000 : 1;
    *next_ms = now + half_ms;
    if (kvd_server_alive(srv, half_ms > 1000 ? half_ms : 1000)) {
        kvd_server_notify("WATCHDOG=1");
    } else {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_ERROR, 10000,
                            "kvdepotd: the service's housekeeping thread "
                            "has not passed for %llu ms; not feeding the "
                            "systemd watchdog",
                            (unsigned long long)half_ms);
    }
}

/* Serves until SIGTERM / SIGINT or server.exit_when_idle. */
static void serve(kvd_server_t *srv, const main_args_t *a, sigset_t *set)
{
    uint64_t wd_usec = kvd_server_watchdog_usec();
    uint64_t wd_next = 0;
    for (;;) {
        watchdog_feed(srv, wd_usec, &wd_next);
        /* Woken by a signal, or every 100 ms to see whether
         * server.exit_when_idle has passed and to feed the watchdog. */
        struct timespec tick = {.tv_sec = 0, .tv_nsec = 100 * 1000 * 1000};
        int sig = sigtimedwait(set, NULL, &tick);
        if (sig < 0) {
            if (kvd_server_idle_expired(srv)) {
                break;
            }
            continue;
        }
        if (sig == SIGHUP) {
            reload(a);
            continue;
        }
        break;
    }
}

/* Starts the daemon, serves, stops: the exit code. */
static int run(kvd_config_t *cfg, const main_args_t *a)
{
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
    kvd_server_notify_status("starting");
    kvd_status_t s = kvd_server_open(cfg, &srv, err, sizeof err);
    if (s != KVD_OK) {
        /* The reason names the setting; the status only when there is
         * none (the store's reasons already end with it). */
        const char *why = err[0] != '\0' ? err : kvd_status_str(s);
        main_error("%s", why);
        kvd_server_notify_status("start failed: %s", why);
        return s == KVD_ERR_NOMEM || s == KVD_ERR_IO ? MAIN_EXIT_FAIL
                                                     : MAIN_EXIT_CONFIG;
    }
    if (a->ready != NULL && write_ready(a->ready, srv) != 0) {
        kvd_server_stop(srv);
        return MAIN_EXIT_FAIL;
    }
    kvd_server_notify_status("serving (tcp port %d, metrics port %d)",
                             kvd_server_tcp_port(srv),
                             kvd_server_metrics_port(srv));
    kvd_server_notify("READY=1");
    serve(srv, a, &set);
    kvd_server_notify("STOPPING=1");
    if (a->ready != NULL) {
        (void)unlink(a->ready);
    }
    kvd_server_stop(srv);
    return MAIN_EXIT_OK;
}

int main(int argc, char **argv)
{
    /* Before anything can print: lines to the journal carry a priority. */
    kvd_log_set_syslog_prefix(kvd_log_stderr_is_journal());
    main_args_t a = {.sets = calloc((size_t)argc, sizeof(char *))};
    if (a.sets == NULL) {
        return MAIN_EXIT_FAIL;
    }
    int rc = parse_args(argc, argv, &a);
    kvd_config_t *cfg = NULL;
    if (rc == MAIN_EXIT_OK) {
        rc = load_config(&a, &cfg);
    }
    if (rc == MAIN_EXIT_OK) {
        rc = apply_log_settings(cfg);
    }
    if (rc == MAIN_EXIT_OK) {
        rc = a.mode == MAIN_RUN ? run(cfg, &a) : print_or_check(cfg, a.mode);
    } else if (rc != -1 && a.mode == MAIN_CHECK) {
        rc = MAIN_EXIT_FAIL;
    }
    kvd_config_destroy(cfg);
    free(a.sets);
    return rc == -1 ? MAIN_EXIT_OK : rc;
}
