/*
 * What the `kvdepot` subcommands that talk to a kvdepotd share (stats, put
 * and get in daemon_cmds.c, bench in bench_cmd.c): the two connection
 * options every one of them takes, opening a store in daemon mode through
 * the public API (include/kvdepot/store.h), object keys written as hex on
 * the command line, and loading one object into the arena.
 *
 * Connection options, resolved like every kvdepot setting (call > env >
 * file > default): `--address unix:PATH` sets store.address and
 * `--timeout DURATION` store.timeout as call parameters; without them the
 * store takes KVDEPOT_STORE_ADDRESS / KVDEPOT_STORE_TIMEOUT or its
 * defaults. store.mode is always `daemon`.
 *
 * Threading: kvd_cli_conn_* on one thread (bench opens every client's
 * store on its main thread before starting the clients); the stores they
 * open are used as store.h allows.
 */
#ifndef KVD_CLI_DAEMON_INT_H
#define KVD_CLI_DAEMON_INT_H

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kvdepot/common.h"
#include "kvdepot/store.h"

/* The long options every daemon subcommand adds to its table. */
#define KVD_CLI_CONN_OPT_ADDRESS 'A'
#define KVD_CLI_CONN_OPT_TIMEOUT 'T'
/* Above every subcommand's own option values (they start at 256). */
#define KVD_CLI_CONN_OPT_TOKEN_FILE 0x1001
#define KVD_CLI_CONN_OPT_TLS_CA 0x1002
#define KVD_CLI_CONN_OPT_TLS_CERT 0x1003
#define KVD_CLI_CONN_OPT_TLS_KEY 0x1004
#define KVD_CLI_CONN_OPT_IS(ch)                                                \
    ((ch) == KVD_CLI_CONN_OPT_ADDRESS || (ch) == KVD_CLI_CONN_OPT_TIMEOUT ||   \
     (ch) == KVD_CLI_CONN_OPT_TOKEN_FILE || (ch) == KVD_CLI_CONN_OPT_TLS_CA || \
     (ch) == KVD_CLI_CONN_OPT_TLS_CERT || (ch) == KVD_CLI_CONN_OPT_TLS_KEY)
#define KVD_CLI_CONN_LONGOPTS                                                  \
    {"address", required_argument, NULL, KVD_CLI_CONN_OPT_ADDRESS},            \
        {"timeout", required_argument, NULL, KVD_CLI_CONN_OPT_TIMEOUT},        \
        {"auth-file", required_argument, NULL, KVD_CLI_CONN_OPT_TOKEN_FILE},   \
        {"tls-ca", required_argument, NULL, KVD_CLI_CONN_OPT_TLS_CA},          \
        {"tls-cert", required_argument, NULL, KVD_CLI_CONN_OPT_TLS_CERT},      \
    {                                                                          \
        "tls-key", required_argument, NULL, KVD_CLI_CONN_OPT_TLS_KEY           \
    }

/* The help lines of those options, for the usage printers. */
#define KVD_CLI_CONN_HELP                                                      \
    "      --address unix:PATH  the kvdepotd socket (default: "                \
    "KVDEPOT_STORE_ADDRESS,\n"                                                 \
    "                           else unix:/run/kvdepot/kvdepotd.sock), or\n"   \
    "      --address tcp:HOST:PORT  a kvdepotd's server.tcp_address, for the " \
    "calls\n"                                                                  \
    "                           that need no arena (ping, stats, ls, "         \
    "lookup,\n"                                                                \
    "                           evict, drain)\n"                               \
    "      --auth-file FILE     tcp: the bearer token (mode 0600)\n"           \
    "      --tls-ca FILE        tcp: TLS, the CA of the daemon's "             \
    "certificate\n"                                                            \
    "      --tls-cert FILE, --tls-key FILE  tcp: TLS, this client's "          \
    "certificate\n"                                                            \
    "                           and key (signed by the daemon's "              \
    "tls_client_ca)\n"                                                         \
    "      --timeout DURATION   deadline of each call to the daemon, e.g. "    \
    "5s\n"                                                                     \
    "                           (default: KVDEPOT_STORE_TIMEOUT, else 2s)\n"

/* A resolved connection: the config kvd_store_open gets, and what the
 * messages and deadlines need once a store is open. */
typedef struct kvd_cli_conn {
    const char *cmd;      /* subcommand name, for messages */
    kvd_config_t *config; /* store.mode=daemon plus the flags given */
    char address[KVD_CONFIG_STRING_MAX]; /* resolved at the first open */
    uint64_t timeout_ms;                 /* idem */
} kvd_cli_conn_t;

/* Creates the config (store.mode=daemon). Returns false after printing
 * "out of memory". */
bool kvd_cli_conn_init(kvd_cli_conn_t *conn, const char *cmd);
void kvd_cli_conn_cleanup(kvd_cli_conn_t *conn);

/* Handles one of the KVD_CLI_CONN_LONGOPTS (`ch` is its value). Returns
 * false after printing why `arg` is not usable (a usage error). */
bool kvd_cli_conn_option(kvd_cli_conn_t *conn, int ch, const char *arg);

/*
 * The option loop of a daemon subcommand: getopt_long over argv with
 * `shortopts` and `longopts` (which include KVD_CLI_CONN_LONGOPTS and
 * {"help", 'h'}); -h/--help prints usage(stdout); the connection options
 * go to kvd_cli_conn_option; every other option to own(ctx, ch, optarg),
 * which returns false after printing why it is bad (NULL own: none).
 * Returns -1 when the command goes on (optind at the first operand), else
 * the exit code (KVD_CLI_EXIT_OK after help, KVD_CLI_EXIT_USAGE after
 * printing the problem and usage(stderr)). The conn stays initialized.
 */
int kvd_cli_conn_getopt(kvd_cli_conn_t *conn, int argc, char **argv,
                        const char *shortopts, const struct option *longopts,
                        void (*usage)(FILE *),
                        bool (*own)(void *ctx, int ch, const char *arg),
                        void *ctx);

/*
 * Opens a store in daemon mode. On failure prints "kvdepot <cmd>: cannot
 * connect to kvdepotd ..." with the reason and returns false. The first
 * successful open fills conn->address and conn->timeout_ms. Close the
 * store with kvd_store_close.
 */
bool kvd_cli_conn_open(kvd_cli_conn_t *conn, kvd_store_t **store_out);

/* Parses exactly 2 * len hex digits (either case) into out[0..len).
 * Returns false after printing "kvdepot <cmd>: <opt> '<text>': ...". */
bool kvd_cli_hex_parse(const char *cmd, const char *opt, const char *text,
                       uint8_t *out, size_t len);

/* Writes 2 * len lower-case hex digits and a NUL into out. */
void kvd_cli_hex_format(const uint8_t *bytes, size_t len, char *out);

/*
 * Looks up (ns, hash) and returns a HOST lease on it in *lease_out: a lease
 * on the DISK tier is brought into the arena first (get_submit, then wait
 * and poll until `timeout_ms` has passed). The caller reads the object at
 * kvd_store_lease_ptr(store, lease_out) and gives the lease back with
 * kvd_store_release.
 * KVD_ERR_NOT_FOUND: not stored. KVD_ERR_TIMEOUT: the disk read did not
 * finish in time (its lease is dropped when the store closes). Any other
 * error comes from the store (the lease is already given back).
 * One thread per store at a time (it polls the store's completions).
 */
kvd_status_t kvd_cli_object_load(kvd_store_t *store, const kvd_namespace_t *ns,
                                 const kvd_block_hash_t *hash,
                                 uint64_t timeout_ms,
                                 kvd_store_lease_t *lease_out);

/* Formats `bytes` as "123 B", "100.0 KiB", "256.0 MiB", ... into out. */
void kvd_cli_size_format(uint64_t bytes, char *out, size_t out_len);

/* Writes `text` to stdout as a JSON string (quotes included, control
 * characters escaped). */
void kvd_cli_json_string(const char *text);

#endif /* KVD_CLI_DAEMON_INT_H */
