/*
 * `kvdepot ls`, `kvdepot evict` and `kvdepot drain`: a running kvdepotd's
 * contents per namespace and tenant, removing objects, and draining a
 * daemon before a restart. They use the daemon's operator calls (Admin
 * list_namespaces / drop_namespace / drain, and Delete through
 * kvd_store_delete) on a store opened in daemon mode (daemon_int.h).
 */
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli_int.h"
#include "cli/daemon_int.h"
#include "client/client.h"
#include "common/time_int.h"

#define EVICT_MAX_HASHES 4096
/* drain --wait: how often it asks, how long by default and at most. */
#define DRAIN_POLL_MS 250
#define DRAIN_WAIT_DEFAULT_MS 30000u
#define DRAIN_WAIT_MAX_MS (24u * 3600u * 1000u)

void kvd_cli_ls_usage(FILE *out)
{
    fprintf(
        out,
        "usage: kvdepot ls [--json] [--address unix:PATH] [--timeout "
        "DURATION]\n\n"
        "Lists what a running kvdepotd stores: per namespace the "
        "objects in the\nhost arena and on disk and their bytes; per "
        "tenant the objects and bytes,\nunder the name the daemon's settings "
        "give it (the name evict --tenant takes).\n\n"
        "      --json               one JSON object: namespaces[], "
        "tenants[] (id, name)\n" KVD_CLI_CONN_HELP);
}

void kvd_cli_evict_usage(FILE *out)
{
    fprintf(out,
            "usage: kvdepot evict --namespace HEX32 [--hash HEX64 ...] "
            "[--address unix:PATH]\n"
            "                     [--timeout DURATION]\n"
            "       kvdepot evict --tenant NAME [--address unix:PATH] "
            "[--timeout DURATION]\n\n"
            "Removes objects from every tier of a running kvdepotd: the "
            "given hashes of\nthe namespace, or, without --hash, the whole "
            "namespace, or everything a\ntenant saved. Objects an engine "
            "holds (leased) or is writing are kept; the\ntool says how "
            "many.\n\n"
            "  -n, --namespace HEX32    the namespace digest, 16 bytes as 32 "
            "hex digits\n"
            "  -k, --hash HEX64         a block hash, 32 bytes as 64 hex "
            "digits (repeatable)\n"
            "  -t, --tenant NAME        every object of this "
            "tenant\n" KVD_CLI_CONN_HELP);
}

void kvd_cli_drain_usage(FILE *out)
{
    fprintf(out,
            "usage: kvdepot drain on|off [--address unix:PATH] "
            "[--timeout DURATION]\n"
            "       kvdepot drain on --wait [--wait-timeout DURATION] "
            "[--address unix:PATH]\n\n"
            "on: the daemon refuses new saves and reports not ready on "
            "/readyz while it\nkeeps serving loads; wait for the leases and "
            "reservations shown to reach 0,\nthen restart it. off: saves "
            "are taken again.\n"
            "--wait: after turning drain on, asks every 250 ms until no "
            "lease and no\nreservation is held (a line each time the figures "
            "change); exit 0 once\ndrained, 1 if --wait-timeout (default "
            "30s) passes first.\n\n"
            "      --wait               wait until drained (with on)\n"
            "      --wait-timeout D     give up after D (default "
            "30s)\n" KVD_CLI_CONN_HELP);
}

void kvd_cli_config_usage(FILE *out)
{
    fprintf(out,
            "usage: kvdepot config [--address unix:PATH] [--timeout "
            "DURATION]\n\n"
            "Every server.* and store.* setting the daemon started with, "
            "its value and\nwhere the value came from (file, env, call, "
            "default); server.token is\nshown as <redacted>. Needs an "
            "operator's credentials (not a tenant's).\n\n" KVD_CLI_CONN_HELP);
}

/* Parses the connection options plus the command's own; returns -1 to go
 * on, else the exit code. */
static int admin_parse(const char *cmd, int argc, char **argv,
                       kvd_cli_conn_t *conn, const char **ns_hex,
                       const char **hashes, size_t *n_hashes,
                       const char **tenant, void (*usage)(FILE *))
{
    static const struct option opts[] = {
        {"namespace", required_argument, NULL, 'n'},
        {"hash", required_argument, NULL, 'k'},
        {"tenant", required_argument, NULL, 't'},
        {"help", no_argument, NULL, 'h'},
        KVD_CLI_CONN_LONGOPTS,
        {NULL, 0, NULL, 0}};
    if (!kvd_cli_conn_init(conn, cmd)) {
        return KVD_CLI_EXIT_FAILURE;
    }
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "n:k:t:h", opts, NULL)) != -1) {
        if (ch == 'h') {
            usage(stdout);
            kvd_cli_conn_cleanup(conn);
            return KVD_CLI_EXIT_OK;
        }
        if (ch == 'n' && ns_hex != NULL) {
            *ns_hex = optarg;
            continue;
        }
        if (ch == 't' && tenant != NULL) {
            *tenant = optarg;
            continue;
        }
        if (ch == 'k' && hashes != NULL && *n_hashes < EVICT_MAX_HASHES) {
            hashes[(*n_hashes)++] = optarg;
            continue;
        }
        if (KVD_CLI_CONN_OPT_IS(ch) && kvd_cli_conn_option(conn, ch, optarg)) {
            continue;
        }
        if (!KVD_CLI_CONN_OPT_IS(ch)) {
            fprintf(stderr, "kvdepot %s: unknown or misplaced option %s\n", cmd,
                    argv[optind - 1]);
        }
        usage(stderr);
        kvd_cli_conn_cleanup(conn);
        return KVD_CLI_EXIT_USAGE;
    }
    return -1;
}

static void human_bytes(uint64_t b, char *out, size_t len)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = (double)b;
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, len, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
}

static void ls_json(const kvd_cli_conn_t *conn, const kvd_client_ns_usage_t *ns,
                    size_t nn, const kvd_client_tenant_usage_t *tn, size_t nt,
                    bool truncated)
{
    printf("{\"address\":");
    kvd_cli_json_string(conn->address);
    printf(",\"namespaces\":[");
    for (size_t i = 0; i < nn; i++) {
        char hex[2 * KVD_NAMESPACE_BYTES + 1];
        kvd_cli_hex_format(ns[i].ns.bytes, KVD_NAMESPACE_BYTES, hex);
        printf("%s{\"namespace\":\"%s\",\"host_objects\":%" PRIu64
               ",\"disk_objects\":%" PRIu64 ",\"bytes\":%" PRIu64 "}",
               i == 0 ? "" : ",", hex, ns[i].host_objects, ns[i].disk_objects,
               ns[i].bytes);
    }
    printf("],\"tenants\":[");
    for (size_t i = 0; i < nt; i++) {
        printf("%s{\"id\":%" PRIu32 ",\"name\":", i == 0 ? "" : ",",
               tn[i].tenant);
        if (tn[i].tenant == 0 || tn[i].name[0] != '\0') {
            kvd_cli_json_string(tn[i].name);
        } else {
            printf("null");
        }
        printf(",\"objects\":%" PRIu64 ",\"bytes\":%" PRIu64 "}", tn[i].objects,
               tn[i].bytes);
    }
    printf("],\"truncated\":%s}\n", truncated ? "true" : "false");
}

static void ls_text(const kvd_cli_conn_t *conn, const kvd_client_ns_usage_t *ns,
                    size_t nn, const kvd_client_tenant_usage_t *tn, size_t nt,
                    bool truncated)
{
    printf("kvdepotd at %s\n\n%-34s %12s %12s %12s\n", conn->address,
           "namespace", "host objs", "disk objs", "bytes");
    for (size_t i = 0; i < nn; i++) {
        char hex[2 * KVD_NAMESPACE_BYTES + 1], size[32];
        kvd_cli_hex_format(ns[i].ns.bytes, KVD_NAMESPACE_BYTES, hex);
        human_bytes(ns[i].bytes, size, sizeof size);
        printf("%-34s %12" PRIu64 " %12" PRIu64 " %12s\n", hex,
               ns[i].host_objects, ns[i].disk_objects, size);
    }
    printf("\n%-34s %12s %12s\n", "tenant", "objects", "bytes");
    for (size_t i = 0; i < nt; i++) {
        /* The name `evict --tenant` takes; an id no setting names is shown
         * as "id N" (its objects go with evict --namespace). */
        char id[300], size[32];
        if (tn[i].tenant == 0) {
            snprintf(id, sizeof id, "default");
        } else if (tn[i].name[0] != '\0') {
            snprintf(id, sizeof id, "%s", tn[i].name);
        } else {
            snprintf(id, sizeof id, "id %" PRIu32 " (not in the settings)",
                     tn[i].tenant);
        }
        human_bytes(tn[i].bytes, size, sizeof size);
        printf("%-34s %12" PRIu64 " %12s\n", id, tn[i].objects, size);
    }
    if (nn == 0) {
        printf("(the daemon stores nothing)\n");
    }
    if (truncated) {
        printf("(more namespaces or tenants than one reply lists)\n");
    }
}

static bool ls_option(void *ctx, int ch, const char *arg)
{
    (void)arg;
    if (ch == 'j') {
        *(bool *)ctx = true;
        return true;
    }
    return false;
}

int kvd_cli_ls_run(int argc, char **argv)
{
    static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         KVD_CLI_CONN_LONGOPTS,
                                         {NULL, 0, NULL, 0}};
    kvd_cli_conn_t conn;
    bool json = false;
    if (!kvd_cli_conn_init(&conn, "ls")) {
        return KVD_CLI_EXIT_FAILURE;
    }
    int rc = kvd_cli_conn_getopt(&conn, argc, argv, "h", opts, kvd_cli_ls_usage,
                                 ls_option, &json);
    if (rc < 0 && optind != argc) {
        fprintf(stderr, "kvdepot ls: unexpected argument %s\n", argv[optind]);
        rc = KVD_CLI_EXIT_USAGE;
    }
    if (rc >= 0) {
        kvd_cli_conn_cleanup(&conn);
        return rc;
    }
    kvd_store_t *store = NULL;
    kvd_client_ns_usage_t *ns = NULL;
    kvd_client_tenant_usage_t *tn = NULL;
    size_t nn = 0, nt = 0;
    bool truncated = false;
    rc = KVD_CLI_EXIT_FAILURE;
    if (!kvd_cli_conn_open(&conn, &store)) {
        goto out;
    }
    kvd_status_t st =
        kvd_client_list(kvd_client_of(store), &ns, &nn, &tn, &nt, &truncated);
    if (st != KVD_OK) {
        fprintf(stderr, "kvdepot ls: the daemon at %s did not answer: %s\n",
                conn.address, kvd_status_str(st));
        goto out;
    }
    if (json) {
        ls_json(&conn, ns, nn, tn, nt, truncated);
    } else {
        ls_text(&conn, ns, nn, tn, nt, truncated);
    }
    rc = KVD_CLI_EXIT_OK;
out:
    free(ns);
    free(tn);
    kvd_store_close(store);
    kvd_cli_conn_cleanup(&conn);
    return rc;
}

int kvd_cli_evict_run(int argc, char **argv)
{
    kvd_cli_conn_t conn;
    const char *ns_hex = NULL, *tenant = NULL;
    const char **hashes = calloc(EVICT_MAX_HASHES, sizeof *hashes);
    kvd_store_key_t *keys = calloc(EVICT_MAX_HASHES, sizeof *keys);
    size_t n = 0;
    if (hashes == NULL || keys == NULL) {
        free(hashes);
        free(keys);
        fprintf(stderr, "kvdepot evict: out of memory\n");
        return KVD_CLI_EXIT_FAILURE;
    }
    int rc = admin_parse("evict", argc, argv, &conn, &ns_hex, hashes, &n,
                         &tenant, kvd_cli_evict_usage);
    if (rc >= 0) {
        free(hashes);
        free(keys);
        return rc;
    }
    kvd_namespace_t ns;
    rc = KVD_CLI_EXIT_USAGE;
    if (tenant != NULL) {
        if (ns_hex != NULL || n > 0 || optind != argc) {
            fprintf(stderr, "kvdepot evict: --tenant goes alone\n");
            kvd_cli_evict_usage(stderr);
            goto out_args;
        }
        kvd_store_t *store = NULL;
        rc = KVD_CLI_EXIT_FAILURE;
        if (kvd_cli_conn_open(&conn, &store)) {
            uint64_t dropped = 0;
            kvd_status_t st =
                kvd_client_drop_tenant(kvd_client_of(store), tenant, &dropped);
            if (st == KVD_OK) {
                printf("evicted %" PRIu64 " objects of tenant %s (leased "
                       "ones, if any, were kept)\n",
                       dropped, tenant);
                rc = KVD_CLI_EXIT_OK;
            } else {
                fprintf(stderr, "kvdepot evict: %s\n", kvd_status_str(st));
            }
        }
        kvd_store_close(store);
        goto out_args;
    }
    if (ns_hex == NULL || optind != argc) {
        fprintf(stderr, "kvdepot evict: %s\n",
                ns_hex == NULL ? "--namespace is required"
                               : "unexpected argument");
        kvd_cli_evict_usage(stderr);
        goto out_args;
    }
    if (!kvd_cli_hex_parse("evict", "--namespace", ns_hex, ns.bytes,
                           sizeof ns.bytes)) {
        goto out_args;
    }
    for (size_t i = 0; i < n; i++) {
        keys[i].ns = ns;
        if (!kvd_cli_hex_parse("evict", "--hash", hashes[i], keys[i].hash.bytes,
                               sizeof keys[i].hash.bytes)) {
            goto out_args;
        }
    }
    kvd_store_t *store = NULL;
    rc = KVD_CLI_EXIT_FAILURE;
    if (!kvd_cli_conn_open(&conn, &store)) {
        goto out_args;
    }
    if (n == 0) {
        uint64_t dropped = 0;
        kvd_status_t st =
            kvd_client_drop_namespace(kvd_client_of(store), &ns, &dropped);
        if (st == KVD_OK) {
            printf("evicted %" PRIu64 " objects of namespace %s (leased ones, "
                   "if any, were kept)\n",
                   dropped, ns_hex);
            rc = KVD_CLI_EXIT_OK;
        } else {
            fprintf(stderr, "kvdepot evict: %s\n", kvd_status_str(st));
        }
    } else {
        size_t deleted = 0;
        kvd_status_t st = kvd_store_delete(store, keys, n, &deleted);
        if (st == KVD_OK || st == KVD_ERR_BUSY) {
            printf("evicted %zu of %zu objects%s\n", deleted, n,
                   st == KVD_ERR_BUSY
                       ? "; some are held by an engine and were kept"
                       : "");
            rc = KVD_CLI_EXIT_OK;
        } else {
            fprintf(stderr, "kvdepot evict: %s\n", kvd_status_str(st));
        }
    }
    kvd_store_close(store);
out_args:
    kvd_cli_conn_cleanup(&conn);
    free(hashes);
    free(keys);
    return rc;
}

typedef struct drain_args {
    bool wait;
    uint64_t wait_ms;
} drain_args_t;

enum { DRAIN_OPT_WAIT = 256, DRAIN_OPT_WAIT_TIMEOUT };

static bool drain_option(void *ctx, int ch, const char *arg)
{
    drain_args_t *a = ctx;
    if (ch == DRAIN_OPT_WAIT) {
        a->wait = true;
        return true;
    }
    if (ch == DRAIN_OPT_WAIT_TIMEOUT &&
        kvd_parse_duration_ms(arg, &a->wait_ms) == KVD_OK && a->wait_ms > 0 &&
        a->wait_ms <= DRAIN_WAIT_MAX_MS) {
        return true;
    }
    fprintf(stderr,
            "kvdepot drain: --wait-timeout '%s': need a duration from 1ms to "
            "24h (e.g. 30s)\n",
            arg);
    return false;
}

/* Asks Admin drain(on) again every DRAIN_POLL_MS until the daemon reports
 * no lease and no reservation, or `wait_ms` has passed; a progress line
 * each time the figures change. Exit code. */
static int drain_wait(kvd_client_t *c, uint64_t wait_ms, uint64_t leases,
                      uint64_t resv)
{
    uint64_t deadline = kvd_time_deadline_ns((int64_t)wait_ms);
    uint64_t t0 = kvd_time_now_ns();
    while (leases != 0 || resv != 0) {
        if (kvd_time_remaining_ms(deadline) == 0) {
            fprintf(stderr,
                    "kvdepot drain: not drained after %.1f s: %" PRIu64
                    " leases and %" PRIu64 " reservations still held\n",
                    (double)wait_ms / 1e3, leases, resv);
            return KVD_CLI_EXIT_FAILURE;
        }
        struct timespec ts = {0, DRAIN_POLL_MS * 1000000L};
        nanosleep(&ts, NULL);
        uint64_t l = 0, r = 0;
        kvd_status_t st = kvd_client_drain(c, true, &l, &r);
        if (st != KVD_OK) {
            fprintf(stderr, "kvdepot drain: %s\n", kvd_status_str(st));
            return KVD_CLI_EXIT_FAILURE;
        }
        if (l != leases || r != resv) {
            printf("waiting: %" PRIu64 " leases and %" PRIu64
                   " reservations (%.1f s)\n",
                   l, r, (double)(kvd_time_now_ns() - t0) / 1e9);
            fflush(stdout);
        }
        leases = l;
        resv = r;
    }
    printf("drained: no lease or reservation held (%.1f s)\n",
           (double)(kvd_time_now_ns() - t0) / 1e9);
    return KVD_CLI_EXIT_OK;
}

int kvd_cli_drain_run(int argc, char **argv)
{
    static const struct option opts[] = {
        {"wait", no_argument, NULL, DRAIN_OPT_WAIT},
        {"wait-timeout", required_argument, NULL, DRAIN_OPT_WAIT_TIMEOUT},
        {"help", no_argument, NULL, 'h'},
        KVD_CLI_CONN_LONGOPTS,
        {NULL, 0, NULL, 0}};
    drain_args_t a = {.wait_ms = DRAIN_WAIT_DEFAULT_MS};
    kvd_cli_conn_t conn;
    if (!kvd_cli_conn_init(&conn, "drain")) {
        return KVD_CLI_EXIT_FAILURE;
    }
    int rc = kvd_cli_conn_getopt(&conn, argc, argv, "h", opts,
                                 kvd_cli_drain_usage, drain_option, &a);
    if (rc >= 0) {
        kvd_cli_conn_cleanup(&conn);
        return rc;
    }
    if (optind + 1 != argc ||
        (strcmp(argv[optind], "on") != 0 && strcmp(argv[optind], "off") != 0)) {
        fprintf(stderr, "kvdepot drain: want on or off\n");
        kvd_cli_drain_usage(stderr);
        kvd_cli_conn_cleanup(&conn);
        return KVD_CLI_EXIT_USAGE;
    }
    bool on = strcmp(argv[optind], "on") == 0;
    if (a.wait && !on) {
        fprintf(stderr, "kvdepot drain: --wait goes with on\n");
        kvd_cli_drain_usage(stderr);
        kvd_cli_conn_cleanup(&conn);
        return KVD_CLI_EXIT_USAGE;
    }
    kvd_store_t *store = NULL;
    rc = KVD_CLI_EXIT_FAILURE;
    if (kvd_cli_conn_open(&conn, &store)) {
        uint64_t leases = 0, resv = 0;
        kvd_status_t st =
            kvd_client_drain(kvd_client_of(store), on, &leases, &resv);
        if (st == KVD_OK) {
            printf("%s: %" PRIu64 " leases and %" PRIu64
                   " reservations still held by clients\n",
                   on ? "draining (new saves refused, /readyz not ready)"
                      : "drain off (saves taken again)",
                   leases, resv);
            fflush(stdout);
            rc = a.wait
                     ? drain_wait(kvd_client_of(store), a.wait_ms, leases, resv)
                     : KVD_CLI_EXIT_OK;
        } else {
            fprintf(stderr, "kvdepot drain: %s\n", kvd_status_str(st));
        }
    }
    kvd_store_close(store);
    kvd_cli_conn_cleanup(&conn);
    return rc;
}

int kvd_cli_config_run(int argc, char **argv)
{
    kvd_cli_conn_t conn;
    int rc = admin_parse("config", argc, argv, &conn, NULL, NULL, NULL, NULL,
                         kvd_cli_config_usage);
    if (rc >= 0) {
        return rc;
    }
    if (optind != argc) {
        fprintf(stderr, "kvdepot config: unexpected argument %s\n",
                argv[optind]);
        kvd_cli_config_usage(stderr);
        kvd_cli_conn_cleanup(&conn);
        return KVD_CLI_EXIT_USAGE;
    }
    kvd_store_t *store = NULL;
    rc = KVD_CLI_EXIT_FAILURE;
    if (kvd_cli_conn_open(&conn, &store)) {
        char *text = NULL;
        kvd_status_t st = kvd_client_config_dump(kvd_client_of(store), &text);
        if (st == KVD_OK) {
            fputs(text, stdout);
            rc = KVD_CLI_EXIT_OK;
        } else {
            fprintf(stderr, "kvdepot config: %s\n", kvd_status_str(st));
        }
        free(text);
    }
    kvd_store_close(store);
    kvd_cli_conn_cleanup(&conn);
    return rc;
}
