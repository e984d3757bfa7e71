/*
 * `kvdepot bench`: load on a running kvdepotd from N clients, the way
 * engine workers load it. Each client is a thread with its own store
 * opened in daemon mode (its own connection and arena mapping, as a worker
 * process has) and loops, for --seconds:
 *
 *   put: reserve a fresh key, copy the object into the arena, commit;
 *   get: lookup (lease), bring it into the arena if it is on disk, read
 *        every byte (XXH3) and check it is the object put, release.
 *
 * Keys are fresh (client, sequence number) under a namespace drawn at
 * random per run, so a run never collides with another or with real data;
 * the objects stay in the store until evicted (there is no client Delete).
 * Every object starts with its own 8-byte stamp and otherwise holds the
 * same random bytes, so a get that returned another object's slot, or torn
 * bytes, counts as an error.
 *
 * Everything is bounded: at most 64 clients, objects up to 64 MiB (one
 * arena chunk by default), one shared source buffer, and per client a
 * fixed log-linear latency histogram (1024 buckets, about 6% wide) instead
 * of a list of samples, so a long run costs no more memory than a short
 * one. Each call is bounded by store.timeout, so a dead daemon ends the
 * run at most that late.
 *
 * Threads: main opens every store, starts the clients, prints progress
 * from relaxed atomic counters once a second, then stops and joins them
 * and reads their histograms.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli_int.h"
#include "cli/daemon_int.h"
#include "common/time_int.h"

#define BENCH_MAX_CLIENTS 64
#define BENCH_MAX_SECONDS 3600
#define BENCH_MAX_SIZE ((uint64_t)64 << 20)
#define BENCH_DEFAULT_CLIENTS 4
#define BENCH_DEFAULT_SECONDS 10
#define BENCH_DEFAULT_SIZE ((uint64_t)64 << 10)
#define BENCH_STAMP_BYTES 8

/* Log-linear histogram of nanoseconds: values below 16 exactly, then 16
 * buckets per power of two. */
#define BENCH_SUB_BITS 4
#define BENCH_SUB (1u << BENCH_SUB_BITS)
#define BENCH_BUCKETS (64u * BENCH_SUB)

typedef enum bench_op { BENCH_PUT, BENCH_GET, BENCH_NUM_OPS } bench_op_t;

static const char *const bench_op_names[BENCH_NUM_OPS] = {"put", "get"};

typedef struct bench_hist {
    uint64_t counts[BENCH_BUCKETS];
    uint64_t n;
    uint64_t max_ns;
} bench_hist_t;

/* What every client reads and nobody writes while they run (but `stop`). */
typedef struct bench_shared {
    kvd_namespace_t ns;
    uint8_t salt[20]; /* the hashes' last bytes, per run */
    uint8_t *src;     /* size_bytes; the first 8 are replaced by a stamp */
    uint64_t size_bytes;
    uint64_t body_xxh3; /* XXH3 of src[8..size) */
    uint64_t timeout_ms;
    int stop; /* atomic: set once by main */
} bench_shared_t;

typedef struct bench_client {
    pthread_t thread;
    uint32_t index;
    kvd_store_t *store;
    const bench_shared_t *shared;
    /* Read by main's progress line while the client runs (atomic). */
    uint64_t ops, bytes, errors;
    /* The client's own until joined. */
    uint64_t get_misses; /* evicted between its commit and the lookup */
    uint64_t op_errors[BENCH_NUM_OPS];
    kvd_status_t last_error[BENCH_NUM_OPS];
    bench_hist_t hist[BENCH_NUM_OPS];
} bench_client_t;

typedef struct bench_opts {
    kvd_cli_conn_t conn;
    uint64_t clients, seconds, size_bytes;
} bench_opts_t;

void kvd_cli_bench_usage(FILE *out)
{
    fprintf(out,
            "usage: kvdepot bench [--clients N] [--seconds S] [--size BYTES]\n"
            "                     [--address unix:PATH] [--timeout "
            "DURATION]\n"
            "\n"
            "Loads a running kvdepotd from N clients (threads, each with "
            "its own\n"
            "connection and arena mapping). Each client puts an object "
            "under a fresh\n"
            "key (reserve, copy into the arena, commit), then gets it back "
            "(lookup,\n"
            "read every byte and check it, release), for S seconds. A "
            "progress line\n"
            "(ops/s, MB/s, errors) goes to stderr once a second; the "
            "summary gives\n"
            "ops/s, MB/s and p50/p99/max latency of put and get, errors, "
            "and misses\n"
            "(gets that found their object evicted already: not errors).\n"
            "\n"
            "  -c, --clients N          concurrent clients, 1..%d "
            "(default %d)\n"
            "  -s, --seconds S          how long, 1..%d (default %d)\n"
            "  -b, --size BYTES         object size, e.g. 4k, 1m; at most "
            "64m (default 64k)\n" KVD_CLI_CONN_HELP
            "  -h, --help               this text\n"
            "\n"
            "The objects are stored under a random namespace and stay "
            "until the daemon\n"
            "evicts them; once the arena is full they evict other objects "
            "too, so do not\n"
            "run it against a daemon serving engines. MB/s counts bytes put "
            "plus bytes\n"
            "got, 1 MB = 10^6 bytes.\n"
            "\n"
            "Exit status: 0 no errors, 1 some operation failed or the "
            "daemon cannot be\n"
            "reached, 2 bad command line.\n",
            BENCH_MAX_CLIENTS, BENCH_DEFAULT_CLIENTS, BENCH_MAX_SECONDS,
            BENCH_DEFAULT_SECONDS);
}

/* ---- histogram ----------------------------------------------------------- */

static unsigned bench_bucket(uint64_t ns)
{
    if (ns < BENCH_SUB) {
        return (unsigned)ns;
    }
    unsigned msb = 63u - (unsigned)__builtin_clzll(ns);
    unsigned sub = (unsigned)(ns >> (msb - BENCH_SUB_BITS)) & (BENCH_SUB - 1);
    return (msb - BENCH_SUB_BITS + 1) * BENCH_SUB + sub;
}

/* The middle of bucket b, in nanoseconds. */
static double bench_bucket_mid(unsigned b)
{
    if (b < BENCH_SUB) {
        return (double)b;
    }
    unsigned msb = b / BENCH_SUB + BENCH_SUB_BITS - 1;
    unsigned sub = b % BENCH_SUB;
    double width = (double)((uint64_t)1 << (msb - BENCH_SUB_BITS));
    return (double)(BENCH_SUB + sub) * width + width / 2;
}

static void bench_hist_add(bench_hist_t *h, uint64_t ns)
{
    h->counts[bench_bucket(ns)]++;
    h->n++;
    if (ns > h->max_ns) {
        h->max_ns = ns;
    }
}

static void bench_hist_merge(bench_hist_t *into, const bench_hist_t *h)
{
    for (unsigned b = 0; b < BENCH_BUCKETS; b++) {
        into->counts[b] += h->counts[b];
    }
    into->n += h->n;
    if (h->max_ns > into->max_ns) {
        into->max_ns = h->max_ns;
    }
}

/* The q-quantile (0 < q <= 1) in nanoseconds; 0 for an empty histogram. */
static double bench_hist_quantile(const bench_hist_t *h, double q)
{
    if (h->n == 0) {
        return 0;
    }
    uint64_t rank = (uint64_t)(q * (double)h->n + 0.999999);
    rank = rank == 0 ? 1 : rank;
    uint64_t seen = 0;
    for (unsigned b = 0; b < BENCH_BUCKETS; b++) {
        seen += h->counts[b];
        if (seen >= rank) {
            double mid = bench_bucket_mid(b);
            return mid < (double)h->max_ns ? mid : (double)h->max_ns;
        }
    }
    return (double)h->max_ns;
}

/* ---- one client ------------------------------------------------------------
 */

static void bench_key(const bench_shared_t *sh, uint32_t client, uint64_t seq,
                      kvd_block_hash_t *hash)
{
    memcpy(hash->bytes, &client, sizeof(client));
    memcpy(hash->bytes + 4, &seq, sizeof(seq));
    memcpy(hash->bytes + 12, sh->salt, sizeof(sh->salt));
}

static uint64_t bench_stamp(uint32_t client, uint64_t seq)
{
    return seq * 0x9e3779b97f4a7c15ull ^ ((uint64_t)client << 48) ^ 0x6b7664;
}

static kvd_status_t bench_put(bench_client_t *c, const kvd_block_hash_t *hash,
                              uint64_t stamp)
{
    const bench_shared_t *sh = c->shared;
    uint64_t size = sh->size_bytes;
    kvd_store_reservation_t r;
    kvd_status_t st =
        kvd_store_reserve(c->store, &sh->ns, hash, 1, size, 0, &r);
    if (st != KVD_OK || r.status != KVD_OK) {
        return st != KVD_OK ? st : r.status;
    }
    kvd_store_key_t key = {.ns = sh->ns, .hash = *hash};
    uint8_t *dst = kvd_store_reservation_ptr(c->store, &r, size);
    if (dst == NULL) {
        (void)kvd_store_abort(c->store, &key, 1, NULL);
        return KVD_ERR_PROTO;
    }
    memcpy(dst, sh->src, size);
    memcpy(dst, &stamp,
           size < BENCH_STAMP_BYTES ? (size_t)size : BENCH_STAMP_BYTES);
    return kvd_store_commit(c->store, &key, 1, NULL);
}

/* KVD_ERR_CHECKSUM when the bytes are not the object put. */
static kvd_status_t bench_get(bench_client_t *c, const kvd_block_hash_t *hash,
                              uint64_t stamp)
{
    const bench_shared_t *sh = c->shared;
    kvd_store_lease_t lease;
    kvd_status_t st =
        kvd_cli_object_load(c->store, &sh->ns, hash, sh->timeout_ms, &lease);
    if (st != KVD_OK) {
        return st;
    }
    const uint8_t *p = kvd_store_lease_ptr(c->store, &lease);
    if (p == NULL || lease.size_bytes != sh->size_bytes) {
        st = KVD_ERR_PROTO;
    } else {
        size_t head = sh->size_bytes < BENCH_STAMP_BYTES
                          ? (size_t)sh->size_bytes
                          : BENCH_STAMP_BYTES;
        uint64_t body = kvd_xxh3_64(p + head, sh->size_bytes - head);
        if (memcmp(p, &stamp, head) != 0 || body != sh->body_xxh3) {
            st = KVD_ERR_CHECKSUM;
        }
    }
    kvd_status_t rst = kvd_store_release(c->store, &lease, 1);
    return st != KVD_OK ? st : rst;
}

static void bench_record(bench_client_t *c, bench_op_t op, uint64_t t0,
                         kvd_status_t st)
{
    uint64_t ns = kvd_time_now_ns() - t0;
    bench_hist_add(&c->hist[op], ns);
    __atomic_fetch_add(&c->ops, 1, __ATOMIC_RELAXED);
    if (st == KVD_OK) {
        __atomic_fetch_add(&c->bytes, c->shared->size_bytes, __ATOMIC_RELAXED);
    } else if (op == BENCH_GET && st == KVD_ERR_NOT_FOUND) {
        /* Not a failure: the store may evict an object before anyone reads
         * it (other clients' puts needed the space). */
        c->get_misses++;
    } else {
        __atomic_fetch_add(&c->errors, 1, __ATOMIC_RELAXED);
        c->op_errors[op]++;
        c->last_error[op] = st;
    }
}

static void *bench_client_main(void *arg)
{
    bench_client_t *c = arg;
    for (uint64_t seq = 0; !__atomic_load_n(&c->shared->stop, __ATOMIC_ACQUIRE);
         seq++) {
        kvd_block_hash_t hash;
        bench_key(c->shared, c->index, seq, &hash);
        uint64_t stamp = bench_stamp(c->index, seq);
        uint64_t t0 = kvd_time_now_ns();
        kvd_status_t st = bench_put(c, &hash, stamp);
        bench_record(c, BENCH_PUT, t0, st);
        if (st != KVD_OK) {
            /* Nothing to get back. A daemon that went away fails every
             * call at once (the client reports no space): do not spin. */
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
            continue;
        }
        t0 = kvd_time_now_ns();
        st = bench_get(c, &hash, stamp);
        bench_record(c, BENCH_GET, t0, st);
    }
    return NULL;
}

/* ---- command line -------------------------------------------------------- */

static bool bench_parse_u64(const char *opt, const char *text, uint64_t min,
                            uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    bool ok = *text != '\0';
    for (const char *p = text; ok && *p != '\0'; p++) {
        ok = *p >= '0' && *p <= '9' && v <= (max - (uint64_t)(*p - '0')) / 10;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (!ok || v < min || v > max) {
        fprintf(stderr,
                "kvdepot bench: %s '%s': need an integer in %" PRIu64
                "..%" PRIu64 "\n",
                opt, text, min, max);
        return false;
    }
    *out = v;
    return true;
}

static bool bench_parse_size(const char *text, uint64_t *out)
{
    uint64_t v = 0;
    if (kvd_parse_size(text, &v) != KVD_OK || v == 0 || v > BENCH_MAX_SIZE) {
        fprintf(stderr,
                "kvdepot bench: --size '%s': need a size from 1 byte to "
                "64m (e.g. 4k, 64k, 1m)\n",
                text);
        return false;
    }
    *out = v;
    return true;
}

/* Returns -1 to go on (the caller owns o->conn), or the exit code. */
static int bench_parse_args(int argc, char **argv, bench_opts_t *o)
{
    static const struct option longopts[] = {
        {"clients", required_argument, NULL, 'c'},
        {"seconds", required_argument, NULL, 's'},
        {"size", required_argument, NULL, 'b'},
        {"help", no_argument, NULL, 'h'},
        KVD_CLI_CONN_LONGOPTS,
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof(*o));
    o->clients = BENCH_DEFAULT_CLIENTS;
    o->seconds = BENCH_DEFAULT_SECONDS;
    o->size_bytes = BENCH_DEFAULT_SIZE;
    if (!kvd_cli_conn_init(&o->conn, "bench")) {
        return KVD_CLI_EXIT_FAILURE;
    }
    optind = 1;
    opterr = 0;
    int ch;
    bool ok = true;
    while (ok &&
           (ch = getopt_long(argc, argv, ":c:s:b:h", longopts, NULL)) != -1) {
        switch (ch) {
        case 'c':
            ok = bench_parse_u64("--clients", optarg, 1, BENCH_MAX_CLIENTS,
                                 &o->clients);
            break;
        case 's':
            ok = bench_parse_u64("--seconds", optarg, 1, BENCH_MAX_SECONDS,
                                 &o->seconds);
            break;
        case 'b': ok = bench_parse_size(optarg, &o->size_bytes); break;
        case KVD_CLI_CONN_OPT_ADDRESS:
        case KVD_CLI_CONN_OPT_TIMEOUT:
            ok = kvd_cli_conn_option(&o->conn, ch, optarg);
            break;
        case 'h':
            kvd_cli_bench_usage(stdout);
            kvd_cli_conn_cleanup(&o->conn);
            return KVD_CLI_EXIT_OK;
        case ':':
            fprintf(stderr, "kvdepot bench: %s needs a value\n",
                    argv[optind - 1]);
            ok = false;
            break;
        default:
            fprintf(stderr, "kvdepot bench: unknown option '%s'\n",
                    argv[optind - 1]);
            ok = false;
            break;
        }
    }
    if (ok && optind < argc) {
        fprintf(stderr, "kvdepot bench: unexpected argument '%s'\n",
                argv[optind]);
        ok = false;
    }
    if (!ok) {
        fprintf(stderr, "Try 'kvdepot help bench'.\n");
        kvd_cli_conn_cleanup(&o->conn);
        return KVD_CLI_EXIT_USAGE;
    }
    return -1;
}

/* ---- the run ------------------------------------------------------------- */

/* The run's namespace, salt and source bytes. */
static bool bench_shared_init(bench_shared_t *sh, const bench_opts_t *o)
{
    memset(sh, 0, sizeof(*sh));
    uint8_t *src = malloc((size_t)o->size_bytes);
    if (src == NULL) {
        fprintf(stderr, "kvdepot bench: out of memory\n");
        return false;
    }
    uint8_t seed[sizeof(sh->ns.bytes) + sizeof(sh->salt)];
    if (getrandom(seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) {
        /* Only uniqueness matters here, not secrecy. */
        uint64_t t = kvd_time_now_ns() ^ ((uint64_t)getpid() << 32);
        for (size_t i = 0; i < sizeof(seed); i++) {
            t = t * 6364136223846793005ull + 1442695040888963407ull;
            seed[i] = (uint8_t)(t >> 56);
        }
    }
    memcpy(sh->ns.bytes, seed, sizeof(sh->ns.bytes));
    memcpy(sh->salt, seed + sizeof(sh->ns.bytes), sizeof(sh->salt));
    uint64_t x = 0x2545f4914f6cdd1dull;
    for (uint64_t i = 0; i < o->size_bytes; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        src[i] = (uint8_t)x;
    }
    size_t head = o->size_bytes < BENCH_STAMP_BYTES ? (size_t)o->size_bytes
                                                    : BENCH_STAMP_BYTES;
    sh->src = src;
    sh->size_bytes = o->size_bytes;
    sh->body_xxh3 = kvd_xxh3_64(src + head, o->size_bytes - head);
    sh->timeout_ms = o->conn.timeout_ms;
    return true;
}

static void bench_totals(const bench_client_t *cl, size_t n, uint64_t *ops,
                         uint64_t *bytes, uint64_t *errors)
{
    *ops = *bytes = *errors = 0;
    for (size_t i = 0; i < n; i++) {
        *ops += __atomic_load_n(&cl[i].ops, __ATOMIC_RELAXED);
        *bytes += __atomic_load_n(&cl[i].bytes, __ATOMIC_RELAXED);
        *errors += __atomic_load_n(&cl[i].errors, __ATOMIC_RELAXED);
    }
}

/* One line a second on stderr: rewritten in place on a terminal, one line
 * each otherwise (logs). */
static void bench_progress(bench_client_t *cl, size_t n, uint64_t start_ns,
                           uint64_t seconds, bool tty)
{
    uint64_t last_ops = 0, last_bytes = 0, last_ns = start_ns;
    for (uint64_t s = 1; s <= seconds; s++) {
        uint64_t wake = start_ns + s * KVD_NSEC_PER_SEC;
        struct timespec ts = {.tv_sec = (time_t)(wake / KVD_NSEC_PER_SEC),
                              .tv_nsec = (long)(wake % KVD_NSEC_PER_SEC)};
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) ==
               EINTR) {
        }
        uint64_t ops, bytes, errors, now = kvd_time_now_ns();
        bench_totals(cl, n, &ops, &bytes, &errors);
        double dt = (double)(now - last_ns) / 1e9;
        fprintf(stderr,
                "%s[%4" PRIu64 "s] %10.0f ops/s %10.1f MB/s  errors "
                "%" PRIu64 "%s",
                tty ? "\r" : "", s, (double)(ops - last_ops) / dt,
                (double)(bytes - last_bytes) / dt / 1e6, errors,
                tty ? "" : "\n");
        last_ops = ops;
        last_bytes = bytes;
        last_ns = now;
    }
    if (tty) {
        fputc('\n', stderr);
    }
}

static void bench_summary(const bench_opts_t *o, const bench_client_t *cl,
                          double elapsed_s)
{
    bench_hist_t all[BENCH_NUM_OPS];
    uint64_t errs[BENCH_NUM_OPS] = {0}, misses[BENCH_NUM_OPS] = {0};
    kvd_status_t last[BENCH_NUM_OPS] = {KVD_OK, KVD_OK};
    memset(all, 0, sizeof(all));
    for (size_t i = 0; i < o->clients; i++) {
        for (int op = 0; op < BENCH_NUM_OPS; op++) {
            bench_hist_merge(&all[op], &cl[i].hist[op]);
            errs[op] += cl[i].op_errors[op];
            if (cl[i].op_errors[op] != 0) {
                last[op] = cl[i].last_error[op];
            }
        }
        misses[BENCH_GET] += cl[i].get_misses;
    }
    printf("kvdepot bench: %" PRIu64 " client%s, %.2f s, %" PRIu64
           "-byte objects, kvdepotd at %s\n\n",
           o->clients, o->clients == 1 ? "" : "s", elapsed_s, o->size_bytes,
           o->conn.address);
    printf("%-6s %10s %11s %10s %10s %10s %10s %8s %8s\n", "op", "count",
           "ops/s", "MB/s", "p50 us", "p99 us", "max us", "errors", "misses");
    uint64_t total = 0, total_ok = 0, total_err = 0, total_miss = 0;
    for (int op = 0; op < BENCH_NUM_OPS; op++) {
        const bench_hist_t *h = &all[op];
        uint64_t ok = h->n - errs[op] - misses[op];
        printf("%-6s %10" PRIu64 " %11.1f %10.1f %10.1f %10.1f %10.1f %8" PRIu64
               " %8" PRIu64 "\n",
               bench_op_names[op], h->n, (double)h->n / elapsed_s,
               (double)(ok * o->size_bytes) / elapsed_s / 1e6,
               bench_hist_quantile(h, 0.50) / 1e3,
               bench_hist_quantile(h, 0.99) / 1e3, (double)h->max_ns / 1e3,
               errs[op], misses[op]);
        total += h->n;
        total_ok += ok;
        total_err += errs[op];
        total_miss += misses[op];
    }
    printf("%-6s %10" PRIu64 " %11.1f %10.1f %10s %10s %10s %8" PRIu64
           " %8" PRIu64 "\n",
           "total", total, (double)total / elapsed_s,
           (double)(total_ok * o->size_bytes) / elapsed_s / 1e6, "", "", "",
           total_err, total_miss);
    for (int op = 0; op < BENCH_NUM_OPS; op++) {
        if (errs[op] != 0) {
            printf("%s errors: %" PRIu64 ", last %s\n", bench_op_names[op],
                   errs[op], kvd_status_str(last[op]));
        }
    }
    if (total_miss != 0) {
        printf("misses: gets that found their object already evicted (the "
               "arena was full)\n");
    }
}

/* Starts the clients, prints progress, stops them. Returns the number of
 * seconds the clients ran, or a negative value if none could start. */
static double bench_run(const bench_opts_t *o, bench_shared_t *sh,
                        bench_client_t *cl)
{
    uint64_t start_ns = kvd_time_now_ns();
    size_t started = 0;
    for (size_t i = 0; i < o->clients; i++) {
        int rc = pthread_create(&cl[i].thread, NULL, bench_client_main, &cl[i]);
        if (rc != 0) {
            fprintf(stderr, "kvdepot bench: client %zu: %s\n", i, strerror(rc));
            break;
        }
        started++;
    }
    if (started == o->clients) {
        bench_progress(cl, started, start_ns, o->seconds, isatty(2) == 1);
    }
    __atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
    for (size_t i = 0; i < started; i++) {
        pthread_join(cl[i].thread, NULL);
    }
    if (started != o->clients) {
        return -1;
    }
    return (double)(kvd_time_now_ns() - start_ns) / 1e9;
}

int kvd_cli_bench_run(int argc, char **argv)
{
    bench_opts_t o;
    int rc = bench_parse_args(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    rc = KVD_CLI_EXIT_FAILURE;
    bench_shared_t sh = {0};
    bench_client_t *cl = calloc((size_t)o.clients, sizeof(*cl));
    if (cl == NULL) {
        fprintf(stderr, "kvdepot bench: out of memory\n");
        goto out;
    }
    /* Opened here, one after another: a daemon that is not there fails
     * the run before any thread starts, and the first open resolves the
     * connection's settings (not thread-safe, daemon_int.h). */
    for (size_t i = 0; i < o.clients; i++) {
        if (!kvd_cli_conn_open(&o.conn, &cl[i].store)) {
            goto out;
        }
        cl[i].index = (uint32_t)i;
        cl[i].shared = &sh;
    }
    if (!bench_shared_init(&sh, &o)) {
        goto out;
    }
    double elapsed = bench_run(&o, &sh, cl);
    if (elapsed <= 0) {
        goto out;
    }
    bench_summary(&o, cl, elapsed);
    uint64_t ops, bytes, errors;
    bench_totals(cl, (size_t)o.clients, &ops, &bytes, &errors);
    rc = errors == 0 && ops > 0 ? KVD_CLI_EXIT_OK : KVD_CLI_EXIT_FAILURE;
out:
    for (size_t i = 0; cl != NULL && i < o.clients; i++) {
        kvd_store_close(cl[i].store);
    }
    free(cl);
    free(sh.src);
    kvd_cli_conn_cleanup(&o.conn);
    return rc;
}
