/*
 * `kvdepot stats`, `kvdepot put` and `kvdepot get`: an operator's view of a
 * running kvdepotd, and a way to move one object in or out by hand.
 *
 * All three go through the public store API in daemon mode (daemon_int.h),
 * exactly as an engine's worker does, so a put here is a real save
 * (reserve a slot, write the bytes into the shared arena, commit) and a get
 * a real load (lookup leases the object, a disk-tier object is brought into
 * the arena first, the bytes are copied out, the lease is given back). An
 * object is opaque bytes under (namespace, block hash); the tool names them
 * in hex because that is how engines' logs and the daemon's metrics print
 * them.
 *
 * `get` writes FILE.tmp and renames it over FILE only once every byte is
 * on disk, so FILE is never left half written.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli_int.h"
#include "cli/daemon_int.h"

typedef enum daemon_cmd_kind {
    DAEMON_CMD_STATS,
    DAEMON_CMD_PUT,
    DAEMON_CMD_GET
} daemon_cmd_kind_t;

/* A parsed command line. */
typedef struct daemon_args {
    daemon_cmd_kind_t kind;
    const char *cmd;
    kvd_cli_conn_t conn;
    bool json;
    const char *ns_hex, *hash_hex;
    kvd_namespace_t ns;
    kvd_block_hash_t hash;
    const char *file;
} daemon_args_t;

#define KEY_HELP                                                               \
    "  -n, --namespace HEX32    the namespace digest, 16 bytes as 32 hex "     \
    "digits\n"                                                                 \
    "  -k, --hash HEX64         the block hash, 32 bytes as 64 hex digits\n"

void kvd_cli_stats_usage(FILE *out)
{
    fprintf(out, "usage: kvdepot stats [--json] [--address unix:PATH] "
                 "[--timeout DURATION]\n"
                 "\n"
                 "Shows a running kvdepotd's figures per tier (host arena, "
                 "NVMe disk):\n"
                 "capacity, bytes used, objects, lookup hits and misses, "
                 "evictions, bytes\n"
                 "read and written, I/O and checksum errors; the leases "
                 "held now, and\n"
                 "the disk writes dropped and pending. A caller bound to a "
                 "tenant sees its\n"
                 "tenant's figures only.\n"
                 "\n"
                 "      --json               one JSON object instead of "
                 "the table\n" KVD_CLI_CONN_HELP
                 "  -h, --help               this text\n"
                 "\n"
                 "Exit status: 0 success, 1 the daemon cannot be reached, 2 "
                 "bad command line.\n");
}

void kvd_cli_put_usage(FILE *out)
{
    fprintf(out, "usage: kvdepot put --namespace HEX32 --hash HEX64 FILE\n"
                 "                   [--address unix:PATH] [--timeout "
                 "DURATION]\n"
                 "\n"
                 "Stores the bytes of FILE (a regular file, at least one "
                 "byte, at most one\n"
                 "arena chunk: store.arena_chunk of the daemon) as one "
                 "object: reserves an\n"
                 "arena slot, reads FILE into it and commits.\n"
                 "\n" KEY_HELP KVD_CLI_CONN_HELP
                 "  -h, --help               this text\n"
                 "\n"
                 "Exit status: 0 stored, 1 not stored (the key exists "
                 "already, no arena space,\n"
                 "unreadable FILE, no daemon), 2 bad command line.\n");
}

void kvd_cli_get_usage(FILE *out)
{
    fprintf(out, "usage: kvdepot get --namespace HEX32 --hash HEX64 FILE\n"
                 "                   [--address unix:PATH] [--timeout "
                 "DURATION]\n"
                 "\n"
                 "Loads one object into FILE (written as FILE.tmp, then "
                 "renamed). An object\n"
                 "on the disk tier is read into the arena first, within "
                 "--timeout.\n"
                 "\n" KEY_HELP KVD_CLI_CONN_HELP
                 "  -h, --help               this text\n"
                 "\n"
                 "Exit status: 0 loaded, 1 not found or not loaded, 2 bad "
                 "command line.\n");
}

static void daemon_usage(daemon_cmd_kind_t kind, FILE *out)
{
    switch (kind) {
    case DAEMON_CMD_STATS: kvd_cli_stats_usage(out); break;
    case DAEMON_CMD_PUT: kvd_cli_put_usage(out); break;
    case DAEMON_CMD_GET: kvd_cli_get_usage(out); break;
    }
}

/* Checks what the command needs beyond the options themselves. */
static bool daemon_check_args(daemon_args_t *a, int argc, char **argv)
{
    if (a->kind == DAEMON_CMD_STATS) {
        if (optind < argc) {
            fprintf(stderr, "kvdepot %s: unexpected argument '%s'\n", a->cmd,
                    argv[optind]);
            return false;
        }
        return true;
    }
    if (a->ns_hex == NULL || a->hash_hex == NULL) {
        fprintf(stderr, "kvdepot %s: %s is required\n", a->cmd,
                a->ns_hex == NULL ? "--namespace" : "--hash");
        return false;
    }
    if (optind >= argc) {
        fprintf(stderr, "kvdepot %s: FILE is required\n", a->cmd);
        return false;
    }
    if (optind + 1 < argc) {
        fprintf(stderr, "kvdepot %s: unexpected argument '%s'\n", a->cmd,
                argv[optind + 1]);
        return false;
    }
    a->file = argv[optind];
    return kvd_cli_hex_parse(a->cmd, "--namespace", a->ns_hex, a->ns.bytes,
                             sizeof(a->ns.bytes)) &&
           kvd_cli_hex_parse(a->cmd, "--hash", a->hash_hex, a->hash.bytes,
                             sizeof(a->hash.bytes));
}

/* Returns -1 to go on, or the exit code (help printed, or a usage error).
 * On -1 the caller owns a->conn. */
static int daemon_parse_args(daemon_cmd_kind_t kind, int argc, char **argv,
                             daemon_args_t *a)
{
    /* stats takes --json, put and get a key: each only its own. */
    static const struct option stats_opts[] = {
        {"json", no_argument, NULL, 'j'},
        {"help", no_argument, NULL, 'h'},
        KVD_CLI_CONN_LONGOPTS,
        {NULL, 0, NULL, 0},
    };
    static const struct option key_opts[] = {
        {"namespace", required_argument, NULL, 'n'},
        {"hash", required_argument, NULL, 'k'},
        {"help", no_argument, NULL, 'h'},
        KVD_CLI_CONN_LONGOPTS,
        {NULL, 0, NULL, 0},
    };
    bool stats = kind == DAEMON_CMD_STATS;
    memset(a, 0, sizeof(*a));
    a->kind = kind;
    a->cmd = argv[0];
    if (!kvd_cli_conn_init(&a->conn, a->cmd)) {
        return KVD_CLI_EXIT_FAILURE;
    }
    optind = 1;
    opterr = 0;
    int ch;
    bool ok = true;
    while (ok &&
           (ch = getopt_long(argc, argv, stats ? ":h" : ":n:k:h",
                             stats ? stats_opts : key_opts, NULL)) != -1) {
        switch (ch) {
        case 'j': a->json = true; break;
        case 'n': a->ns_hex = optarg; break;
        case 'k': a->hash_hex = optarg; break;
        case KVD_CLI_CONN_OPT_ADDRESS:
        case KVD_CLI_CONN_OPT_TIMEOUT:
        case KVD_CLI_CONN_OPT_TOKEN_FILE:
        case KVD_CLI_CONN_OPT_TLS_CA:
        case KVD_CLI_CONN_OPT_TLS_CERT:
        case KVD_CLI_CONN_OPT_TLS_KEY:
            ok = kvd_cli_conn_option(&a->conn, ch, optarg);
            break;
        case 'h':
            daemon_usage(kind, stdout);
            kvd_cli_conn_cleanup(&a->conn);
            return KVD_CLI_EXIT_OK;
        case ':':
            fprintf(stderr, "kvdepot %s: %s needs a value\n", a->cmd,
                    argv[optind - 1]);
            ok = false;
            break;
        default:
            fprintf(stderr, "kvdepot %s: unknown option '%s'\n", a->cmd,
                    argv[optind - 1]);
            ok = false;
            break;
        }
    }
    if (ok) {
        ok = daemon_check_args(a, argc, argv);
    }
    if (!ok) {
        fprintf(stderr, "Try 'kvdepot help %s'.\n", a->cmd);
        kvd_cli_conn_cleanup(&a->conn);
        return KVD_CLI_EXIT_USAGE;
    }
    return -1;
}

/* ---- stats ---------------------------------------------------------------
 */

static void stats_json_tier(const char *name, const kvd_store_tier_stats_t *t)
{
    printf("\"%s\":{\"capacity_bytes\":%" PRIu64 ",\"used_bytes\":%" PRIu64
           ",\"objects\":%" PRIu64 ",\"hits\":%" PRIu64 ",\"misses\":%" PRIu64
           ",\"evictions\":%" PRIu64 ",\"bytes_read\":%" PRIu64
           ",\"bytes_written\":%" PRIu64 ",\"errors\":%" PRIu64 "}",
           name, t->capacity_bytes, t->bytes, t->objects, t->hits, t->misses,
           t->evictions, t->bytes_read, t->bytes_written, t->errors);
}

static void stats_print_json(const char *address, const kvd_store_stats_t *s)
{
    printf("{\"address\":");
    kvd_cli_json_string(address);
    putchar(',');
    stats_json_tier("host", &s->host);
    putchar(',');
    stats_json_tier("disk", &s->disk);
    printf(",\"active_leases\":%" PRIu64 ",\"dropped_writes\":%" PRIu64
           ",\"writes_pending\":%" PRIu64 "}\n",
           s->leases, s->dropped_writes, s->writes_pending);
}

/* One table row: a count per tier; the disk column is "-" without one. */
static void stats_row(const char *label, uint64_t host, uint64_t disk,
                      bool has_disk)
{
    char d[32] = "-";
    if (has_disk) {
        snprintf(d, sizeof(d), "%" PRIu64, disk);
    }
    printf("  %-14s %18" PRIu64 " %18s\n", label, host, d);
}

/* One table row of sizes, human-readable. */
static void stats_row_bytes(const char *label, uint64_t host, uint64_t disk,
                            bool has_disk)
{
    char h[32], d[32] = "-";
    kvd_cli_size_format(host, h, sizeof(h));
    if (has_disk) {
        kvd_cli_size_format(disk, d, sizeof(d));
    }
    printf("  %-14s %18s %18s\n", label, h, d);
}

static void stats_print_table(const char *address, const kvd_store_stats_t *s)
{
    const kvd_store_tier_stats_t *h = &s->host, *d = &s->disk;
    bool has_disk = d->capacity_bytes > 0;
    char used[2][48];
    const kvd_store_tier_stats_t *tiers[2] = {h, d};
    for (int i = 0; i < 2; i++) {
        char sz[32];
        kvd_cli_size_format(tiers[i]->bytes, sz, sizeof(sz));
        double pct = tiers[i]->capacity_bytes
                         ? 100.0 * (double)tiers[i]->bytes /
                               (double)tiers[i]->capacity_bytes
                         : 0.0;
        snprintf(used[i], sizeof(used[i]), "%s (%.1f%%)", sz, pct);
    }
    printf("kvdepotd at %s\n\n", address);
    printf("  %-14s %18s %18s\n", "", "host (arena)", "disk (NVMe)");
    stats_row_bytes("capacity", h->capacity_bytes, d->capacity_bytes, has_disk);
    printf("  %-14s %18s %18s\n", "used", used[0], has_disk ? used[1] : "-");
    stats_row("objects", h->objects, d->objects, has_disk);
    stats_row("hits", h->hits, d->hits, has_disk);
    stats_row("misses", h->misses, d->misses, has_disk);
    stats_row("evictions", h->evictions, d->evictions, has_disk);
    stats_row_bytes("bytes read", h->bytes_read, d->bytes_read, has_disk);
    stats_row_bytes("bytes written", h->bytes_written, d->bytes_written,
                    has_disk);
    stats_row("errors", h->errors, d->errors, has_disk);
    printf("\nactive leases: %" PRIu64 "\n", s->leases);
    if (has_disk) {
        printf("disk writes dropped: %" PRIu64 ", pending: %" PRIu64 "\n",
               s->dropped_writes, s->writes_pending);
    }
    if (!has_disk) {
        printf("disk tier: not configured (store.disk_path)\n");
    }
}

int kvd_cli_stats_run(int argc, char **argv)
{
    daemon_args_t a;
    int rc = daemon_parse_args(DAEMON_CMD_STATS, argc, argv, &a);
    if (rc >= 0) {
        return rc;
    }
    kvd_store_t *store = NULL;
    rc = KVD_CLI_EXIT_FAILURE;
    if (!kvd_cli_conn_open(&a.conn, &store)) {
        goto out;
    }
    kvd_store_stats_t s;
    kvd_status_t st = kvd_store_stats(store, &s);
    if (st != KVD_OK) {
        fprintf(stderr, "kvdepot stats: the daemon at %s did not answer: %s\n",
                a.conn.address, kvd_status_str(st));
        goto out;
    }
    if (a.json) {
        stats_print_json(a.conn.address, &s);
    } else {
        stats_print_table(a.conn.address, &s);
    }
    rc = KVD_CLI_EXIT_OK;
out:
    kvd_store_close(store);
    kvd_cli_conn_cleanup(&a.conn);
    return rc;
}

/* ---- put ----------------------------------------------------------------- */

/* Opens FILE and checks it can be an object. Returns the fd or -1 after
 * printing why. */
static int put_open_file(const char *path, uint64_t *size_out)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "kvdepot put: %s: %s\n", path, strerror(errno));
        return -1;
    }
    struct stat sb;
    const char *why = NULL;
    if (fstat(fd, &sb) != 0) {
        why = strerror(errno);
    } else if (!S_ISREG(sb.st_mode)) {
        why = "not a regular file";
    } else if (sb.st_size == 0) {
        why = "empty: an object holds at least one byte";
    }
    if (why != NULL) {
        fprintf(stderr, "kvdepot put: %s: %s\n", path, why);
        close(fd);
        return -1;
    }
    *size_out = (uint64_t)sb.st_size;
    return fd;
}

/* Reads exactly `len` bytes of fd into dst. Returns false after printing
 * why (an I/O error, or FILE shrank since fstat). */
static bool put_read_file(int fd, const char *path, uint8_t *dst, uint64_t len)
{
    uint64_t done = 0;
    while (done < len) {
        ssize_t n = pread(fd, dst + done, len - done, (off_t)done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            fprintf(stderr, "kvdepot put: %s: %s\n", path,
                    n < 0 ? strerror(errno)
                          : "shorter than when it was opened (changed while "
                            "being read)");
            return false;
        }
        done += (uint64_t)n;
    }
    return true;
}

/* Says why reserve gave no slot. */
static void put_report_refusal(const daemon_args_t *a, kvd_status_t st,
                               uint64_t size)
{
    switch (st) {
    case KVD_ERR_EXISTS:
        fprintf(stderr,
                "kvdepot put: the object exists already (namespace %s, "
                "hash %s): not stored again\n",
                a->ns_hex, a->hash_hex);
        break;
    case KVD_ERR_NOSPACE:
        fprintf(stderr,
                "kvdepot put: no space: the daemon could free no arena slot "
                "of %" PRIu64 " bytes (every object leased or being "
                "written), or it did not answer in time\n",
                size);
        break;
    case KVD_ERR_QUOTA:
        fprintf(stderr,
                "kvdepot put: the default tenant's quota cannot fit "
                "%" PRIu64 " more bytes\n",
                size);
        break;
    case KVD_ERR_INVALID:
        fprintf(stderr,
                "kvdepot put: %s: %" PRIu64 " bytes is larger than the "
                "daemon's biggest object (one arena chunk, "
                "store.arena_chunk)\n",
                a->file, size);
        break;
    default:
        fprintf(stderr, "kvdepot put: reserve failed: %s\n",
                kvd_status_str(st));
        break;
    }
}

/* Reserve, fill from fd, commit. Returns an exit code. */
static int put_store(const daemon_args_t *a, kvd_store_t *store, int fd,
                     uint64_t size)
{
    kvd_store_reservation_t r;
    kvd_status_t st =
        kvd_store_reserve(store, &a->ns, &a->hash, 1, size, 0, &r);
    if (st == KVD_OK) {
        st = r.status;
    }
    if (st != KVD_OK) {
        put_report_refusal(a, st, size);
        return KVD_CLI_EXIT_FAILURE;
    }
    kvd_store_key_t key = {.ns = a->ns, .hash = a->hash};
    uint8_t *dst = kvd_store_reservation_ptr(store, &r, size);
    if (dst == NULL) {
        fprintf(stderr,
                "kvdepot put: slot %" PRIu64 " (+%" PRIu64
                ") is outside the arena it was given in, or the daemon "
                "restarted since\n",
                r.arena_offset, size);
        goto err_abort;
    }
    if (!put_read_file(fd, a->file, dst, size)) {
        goto err_abort;
    }
    kvd_status_t cst = KVD_OK;
    st = kvd_store_commit(store, &key, 1, &cst);
    if (st != KVD_OK) {
        fprintf(stderr, "kvdepot put: commit failed: %s\n", kvd_status_str(st));
        return KVD_CLI_EXIT_FAILURE;
    }
    printf("stored %s: %" PRIu64 " bytes, namespace %s, hash %s\n", a->file,
           size, a->ns_hex, a->hash_hex);
    return KVD_CLI_EXIT_OK;

err_abort:
    (void)kvd_store_abort(store, &key, 1, NULL);
    return KVD_CLI_EXIT_FAILURE;
}

int kvd_cli_put_run(int argc, char **argv)
{
    daemon_args_t a;
    int rc = daemon_parse_args(DAEMON_CMD_PUT, argc, argv, &a);
    if (rc >= 0) {
        return rc;
    }
    rc = KVD_CLI_EXIT_FAILURE;
    kvd_store_t *store = NULL;
    uint64_t size = 0;
    int fd = put_open_file(a.file, &size);
    if (fd < 0) {
        goto out;
    }
    if (kvd_cli_conn_open(&a.conn, &store)) {
        rc = put_store(&a, store, fd, size);
    }
    close(fd);
out:
    kvd_store_close(store);
    kvd_cli_conn_cleanup(&a.conn);
    return rc;
}

/* ---- get ----------------------------------------------------------------- */

/* Writes src[0..len) to path + ".tmp", syncs it and renames it to path.
 * Returns false after printing why (the .tmp file is removed). */
static bool get_write_file(const char *path, const uint8_t *src, uint64_t len)
{
    size_t plen = strlen(path);
    char *tmp = malloc(plen + sizeof(".tmp"));
    if (tmp == NULL) {
        fprintf(stderr, "kvdepot get: out of memory\n");
        return false;
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", sizeof(".tmp"));
    const char *what = tmp;
    int err;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) {
        err = errno;
        goto err_free;
    }
    for (uint64_t done = 0; done < len;) {
        ssize_t n = write(fd, src + done, len - done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            err = errno;
            goto err_close;
        }
        done += (uint64_t)n;
    }
    /* Synced before the rename: FILE is either the old one or all of the
     * object, even after a crash. */
    if (fsync(fd) != 0) {
        err = errno;
        goto err_close;
    }
    if (close(fd) != 0) {
        err = errno;
        goto err_unlink;
    }
    if (rename(tmp, path) != 0) {
        err = errno;
        what = path;
        goto err_unlink;
    }
    free(tmp);
    return true;

err_close:
    (void)close(fd);
err_unlink:
    (void)unlink(tmp);
err_free:
    fprintf(stderr, "kvdepot get: %s: %s\n", what, strerror(err));
    free(tmp);
    return false;
}

/* Loads the object and writes it out. Returns an exit code. */
static int get_load(const daemon_args_t *a, kvd_store_t *store)
{
    kvd_store_lease_t lease;
    kvd_status_t st = kvd_cli_object_load(store, &a->ns, &a->hash,
                                          a->conn.timeout_ms, &lease);
    if (st == KVD_ERR_NOT_FOUND) {
        fprintf(stderr, "kvdepot get: not found: namespace %s, hash %s\n",
                a->ns_hex, a->hash_hex);
        return KVD_CLI_EXIT_FAILURE;
    }
    if (st == KVD_ERR_TIMEOUT) {
        fprintf(stderr,
                "kvdepot get: the object is on the disk tier and was not "
                "read into the arena within %" PRIu64 " ms (--timeout)\n",
                a->conn.timeout_ms);
        return KVD_CLI_EXIT_FAILURE;
    }
    if (st != KVD_OK) {
        fprintf(stderr, "kvdepot get: load failed: %s\n", kvd_status_str(st));
        return KVD_CLI_EXIT_FAILURE;
    }
    int rc = KVD_CLI_EXIT_FAILURE;
    const uint8_t *src = kvd_store_lease_ptr(store, &lease);
    if (src == NULL) {
        fprintf(stderr,
                "kvdepot get: lease %" PRIu64 " (+%" PRIu64
                ") is outside the arena it was given in, or the daemon "
                "restarted since\n",
                lease.arena_offset, lease.size_bytes);
    } else if (get_write_file(a->file, src, lease.size_bytes)) {
        printf("wrote %s: %" PRIu64 " bytes, namespace %s, hash %s\n", a->file,
               lease.size_bytes, a->ns_hex, a->hash_hex);
        rc = KVD_CLI_EXIT_OK;
    }
    /* The bytes are copied out: the slot may be reused from here on. */
    st = kvd_store_release(store, &lease, 1);
    if (st != KVD_OK) {
        fprintf(stderr, "kvdepot get: release: %s\n", kvd_status_str(st));
    }
    return rc;
}

int kvd_cli_get_run(int argc, char **argv)
{
    daemon_args_t a;
    int rc = daemon_parse_args(DAEMON_CMD_GET, argc, argv, &a);
    if (rc >= 0) {
        return rc;
    }
    rc = KVD_CLI_EXIT_FAILURE;
    kvd_store_t *store = NULL;
    if (kvd_cli_conn_open(&a.conn, &store)) {
        rc = get_load(&a, store);
    }
    kvd_store_close(store);
    kvd_cli_conn_cleanup(&a.conn);
    return rc;
}
