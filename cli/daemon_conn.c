/*
 * Connection, keys and loads shared by the `kvdepot` subcommands that talk
 * to a kvdepotd (contract in daemon_int.h).
 *
 * The tool goes through include/kvdepot/store.h like any engine would, so
 * what it shows is what a worker sees: a store opened with store.mode
 * daemon maps the daemon's arena and sends every call over the socket.
 * Only the flags the user gave are set in the config; everything else
 * resolves through the store's own table (environment, then defaults), and
 * the values it settled on are read back from kvd_store_print_config, so
 * this file repeats none of the store's defaults (only a fallback for the
 * get deadline, should that read-back fail for lack of memory).
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "cli/daemon_int.h"
#include "common/time_int.h"

/* store.timeout's range in store.c: 1 ms .. 10 min. */
#define KVD_CLI_TIMEOUT_MAX_MS 600000u

bool kvd_cli_conn_init(kvd_cli_conn_t *conn, const char *cmd)
{
    memset(conn, 0, sizeof(*conn));
    conn->cmd = cmd;
    if (kvd_config_create(&conn->config) != KVD_OK ||
        kvd_config_set(conn->config, "store.mode", "daemon") != KVD_OK) {
        fprintf(stderr, "kvdepot %s: out of memory\n", cmd);
        kvd_config_destroy(conn->config);
        conn->config = NULL;
        return false;
    }
    return true;
}

void kvd_cli_conn_cleanup(kvd_cli_conn_t *conn)
{
    kvd_config_destroy(conn->config);
    conn->config = NULL;
}

bool kvd_cli_conn_option(kvd_cli_conn_t *conn, int ch, const char *arg)
{
    const char *key;
    if (ch == KVD_CLI_CONN_OPT_ADDRESS) {
        /* The client checks this too, but only once connecting; a typo on
         * the command line is a usage error. */
        if ((strncmp(arg, "unix:", 5) != 0 || arg[5] == '\0') &&
            (strncmp(arg, "tcp:", 4) != 0 || strchr(arg + 4, ':') == NULL)) {
            fprintf(stderr,
                    "kvdepot %s: --address '%s': need unix:PATH (the "
                    "kvdepotd socket on this node) or tcp:HOST:PORT\n",
                    conn->cmd, arg);
            return false;
        }
        key = "store.address";
    } else if (ch == KVD_CLI_CONN_OPT_TOKEN_FILE) {
        key = "store.token_file";
    } else if (ch == KVD_CLI_CONN_OPT_TLS_CA) {
        key = "store.tls_ca";
    } else if (ch == KVD_CLI_CONN_OPT_TLS_CERT) {
        key = "store.tls_cert";
    } else if (ch == KVD_CLI_CONN_OPT_TLS_KEY) {
        key = "store.tls_key";
    } else {
        uint64_t ms = 0;
        if (kvd_parse_duration_ms(arg, &ms) != KVD_OK || ms == 0 ||
            ms > KVD_CLI_TIMEOUT_MAX_MS) {
            fprintf(stderr,
                    "kvdepot %s: --timeout '%s': need a duration from 1ms "
                    "to 10m (e.g. 500ms, 5s)\n",
                    conn->cmd, arg);
            return false;
        }
        key = "store.timeout";
    }
    kvd_status_t st = kvd_config_set(conn->config, key, arg);
    if (st != KVD_OK) {
        fprintf(stderr, "kvdepot %s: %s: %s\n", conn->cmd, key,
                kvd_status_str(st));
        return false;
    }
    return true;
}

int kvd_cli_conn_getopt(kvd_cli_conn_t *conn, int argc, char **argv,
                        const char *shortopts, const struct option *longopts,
                        void (*usage)(FILE *),
                        bool (*own)(void *ctx, int ch, const char *arg),
                        void *ctx)
{
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, shortopts, longopts, NULL)) != -1) {
        if (ch == 'h') {
            usage(stdout);
            return KVD_CLI_EXIT_OK;
        }
        bool ok;
        if (KVD_CLI_CONN_OPT_IS(ch)) {
            ok = kvd_cli_conn_option(conn, ch, optarg);
        } else if (ch != '?' && ch != ':' && own != NULL) {
            ok = own(ctx, ch, optarg);
        } else {
            fprintf(stderr,
                    "kvdepot %s: unknown option or missing value: "
                    "%s\n",
                    conn->cmd, argv[optind - 1]);
            ok = false;
        }
        if (!ok) {
            usage(stderr);
            return KVD_CLI_EXIT_USAGE;
        }
    }
    return -1;
}

/* Copies the value of `name` from kvd_store_print_config's lines
 * ("name = value  # doc (default: d, from: s)") into out. */
static bool conn_setting(const char *text, const char *name, char *out,
                         size_t out_len)
{
    size_t name_len = strlen(name);
    for (const char *line = text; *line != '\0';) {
        const char *eol = strchr(line, '\n');
        if (eol == NULL) {
            eol = line + strlen(line);
        }
        if (strncmp(line, name, name_len) == 0 &&
            strncmp(line + name_len, " = ", 3) == 0) {
            const char *v = line + name_len + 3;
            const char *end = strstr(v, "  # ");
            if (end == NULL || end > eol) {
                end = eol;
            }
            size_t n = (size_t)(end - v);
            if (n >= out_len) {
                return false;
            }
            memcpy(out, v, n);
            out[n] = '\0';
            return true;
        }
        line = *eol == '\n' ? eol + 1 : eol;
    }
    return false;
}

/* Fills conn->address and conn->timeout_ms with what the store resolved. */
static void conn_resolve(kvd_cli_conn_t *conn)
{
    char *text = NULL;
    size_t len = 0;
    char timeout[64] = "";
    FILE *mem = open_memstream(&text, &len);
    snprintf(conn->address, sizeof(conn->address), "(store.address)");
    conn->timeout_ms = 2000;
    if (mem == NULL) {
        return;
    }
    kvd_status_t st = kvd_store_print_config(conn->config, mem);
    if (fclose(mem) == 0 && st == KVD_OK && text != NULL) {
        char addr[KVD_CONFIG_STRING_MAX];
        uint64_t ms = 0;
        if (conn_setting(text, "store.address", addr, sizeof(addr))) {
            memcpy(conn->address, addr, sizeof(addr));
        }
        if (conn_setting(text, "store.timeout", timeout, sizeof(timeout)) &&
            kvd_parse_duration_ms(timeout, &ms) == KVD_OK && ms > 0) {
            conn->timeout_ms = ms;
        }
    }
    free(text);
}

bool kvd_cli_conn_open(kvd_cli_conn_t *conn, kvd_store_t **store_out)
{
    char err[512] = "";
    kvd_store_t *store = NULL;
    kvd_status_t st = kvd_store_open(conn->config, &store, err, sizeof(err));
    if (st != KVD_OK) {
        fprintf(stderr,
                "kvdepot %s: cannot connect to kvdepotd: %s%s%s\n"
                "kvdepot %s: is kvdepotd running there? (--address "
                "unix:PATH or tcp:HOST:PORT, or KVDEPOT_STORE_ADDRESS)\n",
                conn->cmd, err, err[0] != '\0' ? ": " : "", kvd_status_str(st),
                conn->cmd);
        return false;
    }
    if (conn->timeout_ms == 0) {
        conn_resolve(conn);
    }
    *store_out = store;
    return true;
}

void kvd_cli_json_string(const char *text)
{
    putchar('"');
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        if (*p == '"' || *p == '\\') {
            printf("\\%c", *p);
        } else if (*p < 0x20) {
            printf("\\u%04x", *p);
        } else {
            putchar(*p);
        }
    }
    putchar('"');
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

bool kvd_cli_hex_parse(const char *cmd, const char *opt, const char *text,
                       uint8_t *out, size_t len)
{
    size_t n = strlen(text);
    if (n != 2 * len) {
        fprintf(stderr,
                "kvdepot %s: %s '%s': need %zu hex digits (%zu bytes), got "
                "%zu characters\n",
                cmd, opt, text, 2 * len, len, n);
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        if (hex_digit(text[i]) < 0) {
            fprintf(stderr,
                    "kvdepot %s: %s '%s': '%c' at position %zu is not a hex "
                    "digit\n",
                    cmd, opt, text, text[i], i + 1);
            return false;
        }
    }
    /* Every digit was checked above: the casts only tell the compiler. */
    for (size_t i = 0; i < len; i++) {
        out[i] = (uint8_t)((unsigned)hex_digit(text[2 * i]) << 4 |
                           (unsigned)hex_digit(text[2 * i + 1]));
    }
    return true;
}

void kvd_cli_hex_format(const uint8_t *bytes, size_t len, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[bytes[i] >> 4];
        out[2 * i + 1] = digits[bytes[i] & 15];
    }
    out[2 * len] = '\0';
}

/* Waits for the completion of the get tagged `tag` (the only one this
 * thread has in flight on the store). */
static kvd_status_t load_wait(kvd_store_t *store, uint64_t tag,
                              uint64_t deadline_ns,
                              kvd_store_lease_t *lease_out)
{
    for (;;) {
        kvd_store_completion_t c;
        while (kvd_store_poll(store, &c, 1) == 1) {
            if (c.user_data != tag) {
                continue; /* not ours: the caller has nothing else queued */
            }
            if (c.status != KVD_OK) {
                return c.status;
            }
            *lease_out = c.lease;
            return KVD_OK;
        }
        int left = kvd_time_remaining_ms(deadline_ns);
        if (left == 0) {
            return KVD_ERR_TIMEOUT;
        }
        kvd_status_t st = kvd_store_wait(store, left);
        if (st != KVD_OK && st != KVD_ERR_TIMEOUT) {
            return st;
        }
    }
}

kvd_status_t kvd_cli_object_load(kvd_store_t *store, const kvd_namespace_t *ns,
                                 const kvd_block_hash_t *hash,
                                 uint64_t timeout_ms,
                                 kvd_store_lease_t *lease_out)
{
    kvd_store_lease_t lease;
    size_t matched = 0;
    kvd_status_t st = kvd_store_lookup(store, ns, hash, 1, &lease, &matched);
    if (st != KVD_OK) {
        return st;
    }
    if (matched == 0) {
        return KVD_ERR_NOT_FOUND;
    }
    if (lease.tier == KVD_STORE_TIER_HOST) {
        *lease_out = lease;
        return KVD_OK;
    }
    /* On NVMe: bring it into the arena, bounded like any daemon call. */
    uint64_t deadline_ns = kvd_time_deadline_ns((int64_t)timeout_ms);
    static const uint64_t tag = 0x6b76646570677400ull; /* "kvdepgt" */
    kvd_store_get_t get = {.lease = lease, .user_data = tag};
    size_t accepted = 0;
    st = kvd_store_get_submit(store, &get, 1, &accepted);
    if (st != KVD_OK || accepted != 1) {
        (void)kvd_store_release(store, &lease, 1);
        return st != KVD_OK ? st : KVD_ERR_BUSY;
    }
    return load_wait(store, tag, deadline_ns, lease_out);
}

void kvd_cli_size_format(uint64_t bytes, char *out, size_t out_len)
{
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bytes < 1024) {
        snprintf(out, out_len, "%" PRIu64 " B", bytes);
        return;
    }
    double v = (double)bytes / 1024.0;
    size_t u = 0;
    while (v >= 1024.0 && u + 1 < sizeof(units) / sizeof(units[0])) {
        v /= 1024.0;
        u++;
    }
    snprintf(out, out_len, "%.1f %s", v, units[u]);
}
