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

#include "cli/cli_int.h"
#include "cli/daemon_int.h"
#include "client/client.h"

#define EVICT_MAX_HASHES 4096

void kvd_cli_ls_usage(FILE *out)
{
    fprintf(out,
            "usage: kvdepot ls [--address unix:PATH] [--timeout DURATION]"
            "\n\n"
            "Lists what a running kvdepotd stores: per namespace the "
            "objects in the\nhost arena and on disk and their bytes; per "
            "tenant (quota id) the objects\nand bytes.\n\n" KVD_CLI_CONN_HELP);
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
            "[--timeout DURATION]\n\n"
            "on: the daemon refuses new saves and reports not ready on "
            "/readyz while it\nkeeps serving loads; wait for the leases and "
            "reservations shown to reach 0,\nthen restart it. off: saves "
            "are taken again.\n\n" KVD_CLI_CONN_HELP);
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
        if ((ch == KVD_CLI_CONN_OPT_ADDRESS ||
             ch == KVD_CLI_CONN_OPT_TIMEOUT) &&
            kvd_cli_conn_option(conn, ch, optarg)) {
            continue;
        }
        if (ch != KVD_CLI_CONN_OPT_ADDRESS && ch != KVD_CLI_CONN_OPT_TIMEOUT) {
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

int kvd_cli_ls_run(int argc, char **argv)
{
    kvd_cli_conn_t conn;
    int rc = admin_parse("ls", argc, argv, &conn, NULL, NULL, NULL, NULL,
                         kvd_cli_ls_usage);
    if (rc >= 0) {
        return rc;
    }
    if (optind != argc) {
        fprintf(stderr, "kvdepot ls: unexpected argument %s\n", argv[optind]);
        kvd_cli_conn_cleanup(&conn);
        return KVD_CLI_EXIT_USAGE;
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
    printf("kvdepotd at %s\n\n%-34s %12s %12s %12s\n", conn.address,
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
        char id[16], size[32];
        snprintf(id, sizeof id, "%" PRIu32, tn[i].tenant);
        human_bytes(tn[i].bytes, size, sizeof size);
        printf("%-34s %12" PRIu64 " %12s\n", tn[i].tenant == 0 ? "default" : id,
               tn[i].objects, size);
    }
    if (nn == 0) {
        printf("(the daemon stores nothing)\n");
    }
    if (truncated) {
        printf("(more namespaces or tenants than one reply lists)\n");
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

int kvd_cli_drain_run(int argc, char **argv)
{
    kvd_cli_conn_t conn;
    int rc = admin_parse("drain", argc, argv, &conn, NULL, NULL, NULL, NULL,
                         kvd_cli_drain_usage);
    if (rc >= 0) {
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
            rc = KVD_CLI_EXIT_OK;
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
