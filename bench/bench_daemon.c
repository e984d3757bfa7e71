/*
 * kvdepotd benchmark (issue "kvdepotd"): the daemon reached through the
 * client library (store.mode=daemon, the same store.h calls an engine
 * makes) against redis-server driven through hiredis. The program starts
 * both servers itself, on this machine, in one temp directory, and
 * measures them in the same run:
 *
 *   lookup  16 client processes (as 16 engine processes on a node would
 *           be), each with its own kvd_store_t, look up the same stored
 *           512-key chain (4 KiB objects) and release the leases, again
 *           and again; peer: the same 16 processes, each with its own
 *           connection over redis's unix socket (kvdepotd is reached over
 *           one too), MGET the same 512 keys (namespace + block hash,
 *           48 bytes each; 24-byte values, the size of the location a
 *           lease carries). Keys per second.
 *   put+get one client reserves a new 2 MiB object, copies it into the
 *           shared arena, commits, then looks it up, copies it out and
 *           releases it; peer: SET then GET of a 2 MiB value, over
 *           redis's unix socket (the same transport as kvdepotd's calls)
 *           and over TCP 127.0.0.1. Bytes moved (put + get) per second.
 *           Both rows compare designs, not implementations: kvdepotd's
 *           payload crosses no socket (the client copies it into and out
 *           of the arena it maps), redis's crosses its socket twice each
 *           way (client to kernel to server). kvdepotd has no mode that
 *           sends payload over its socket to a local client (over TCP it
 *           serves only the calls that need no arena), so there is no
 *           row with that difference taken out.
 *
 * Each measurement runs PASSES times, the daemon and redis back to back in
 * every pass (the VM's speed drifts); the headline is the median of the
 * per-pass ratios. Each side of a measurement gets KVDEPOT_BENCH_SECONDS
 * (default 3) in all; put+get runs one more, uncounted, warm-up pass per
 * side first. The daemon runs with its defaults (arena prefaulted at start)
 * and a 1 GiB arena. The put+get keys are all new, so once the arena is
 * full every reserve also evicts, as in a store that serves.
 *
 * `--sweep` and `--sweep-chain` print one JSON line per point instead
 * (bench/curves.py draws them): the lookup by 1 .. 64 client processes,
 * and one client's lookups of chains of 16 .. 4096 keys.
 *
 * Environment: KVDEPOTD (the daemon; default: the one this tree built),
 * REDIS_SERVER (default: redis-server on PATH), KVDEPOT_BENCH_SECONDS.
 * Both servers listen on this host only: kvdepotd on a unix socket,
 * redis-server on 127.0.0.1 at a port the kernel picked free.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "bench/bench_proc_int.h"
#include "kvdepot/store.h"

#define CLIENTS 16
/* `--sweep`: lookups by 1 .. MAX_CLIENTS client processes. */
#define MAX_CLIENTS 64
/* Per-call times a client keeps for its percentiles (the first ones). */
#define LAT_MAX 65536
#define CHAIN_LEN 512
/* `--sweep-chain`: lookups of chains of 16 .. MAX_CHAIN keys. */
#define MAX_CHAIN 4096
#define SWEEP_CHAIN_CLIENTS 1
#define CHAIN_OBJ_BYTES 4096u
#define LOCATION_BYTES 24
#define BIG_BYTES (2u << 20)
#define REDIS_BIG_KEYS 64u
#define PASSES 3
#define START_TIMEOUT_S 20.0

/* The redis key of a block: namespace digest then block hash. */
typedef struct redis_key {
    uint8_t bytes[sizeof(kvd_namespace_t) + sizeof(kvd_block_hash_t)];
} redis_key_t;

typedef struct bench {
    char dir[64];
    char sock[128];
    char ready[128];
    char redis_sock[128];
    pid_t daemon_pid, redis_pid;
    int n_clients; /* forked lookup clients; passes use the first `active` */
    int active;
    int redis_port;
    double seconds; /* per pass and side */
    kvd_namespace_t ns;
    uint32_t stored;    /* keys of the chain stored (CHAIN_LEN or more) */
    uint32_t chain_len; /* keys a lookup names: the chain's first ones */
    kvd_block_hash_t chain[MAX_CHAIN];
    redis_key_t keys[MAX_CHAIN];
    const char *mget_argv[MAX_CHAIN + 1];
    size_t mget_len[MAX_CHAIN + 1];
    uint32_t next_big; /* put+get: the next new block */
} bench_t;

/* A lookup client: a process forked before this one uses gRPC (the C core
 * does not survive fork), driven through two pipes. */
typedef struct client {
    pid_t pid;
    int cmd_fd; /* ours to write: client_cmd_t */
    int res_fd; /* ours to read: client_res_t */
} client_t;

enum { SIDE_QUIT = 0, SIDE_KVD = 1, SIDE_REDIS = 2 };

typedef struct client_cmd {
    int32_t side;
    uint32_t chain_len;     /* keys each call names */
    double start, deadline; /* CLOCK_MONOTONIC seconds */
} client_cmd_t;

typedef struct client_res {
    uint64_t keys;
    double p50_s, p99_s; /* of this client's calls in the pass */
    int32_t ok;
} client_res_t;

/* A client's call times in the current pass (its own process's). */
static double call_lat[LAT_MAX];
static size_t n_call_lat;

static void call_timed(double t0)
{
    if (n_call_lat < LAT_MAX) {
        call_lat[n_call_lat++] = now_s() - t0;
    }
}

static char headlines[6][200];
static size_t num_headlines;

static void headline(const char *metric, double value, const char *target)
{
    snprintf(headlines[num_headlines++], sizeof headlines[0],
             "BENCH daemon: %s = %.3g (%s)", metric, value, target);
}

/* ---- the two servers ---------------------------------------------------- */

/* Starts kvdepotd and waits for its ready file, whose pid= must be the
 * child's (the pid SIGTERM goes to). */
static int daemon_start(bench_t *b, const char *bin)
{
    char sock_set[160], log[96];
    snprintf(sock_set, sizeof sock_set, "server.unix_socket=%s", b->sock);
    snprintf(log, sizeof log, "%s/daemon.log", b->dir);
    char *argv[] = {(char *)bin,           "--set",        sock_set, "--set",
                    "store.arena_size=1g", "--ready-file", b->ready, NULL};
    b->daemon_pid = child_spawn(argv, log);
    if (b->daemon_pid < 0) {
        return -1;
    }
    if (daemon_wait_ready(b->daemon_pid, b->ready, START_TIMEOUT_S) != 0) {
        b->daemon_pid = -1;
        return -1;
    }
    return 0;
}

static int redis_start(bench_t *b, const char *bin)
{
    char port[16], log[96];
    b->redis_port = free_port();
    if (b->redis_port < 0) {
        fprintf(stderr, "bench_daemon: no free port: %s\n", strerror(errno));
        return -1;
    }
    snprintf(port, sizeof port, "%d", b->redis_port);
    snprintf(log, sizeof log, "%s/redis.log", b->dir);
    char *argv[] = {(char *)bin,
                    "--port",
                    port,
                    "--bind",
                    "127.0.0.1",
                    "--unixsocket",
                    b->redis_sock,
                    "--unixsocketperm",
                    "700",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    b->dir,
                    NULL};
    b->redis_pid = child_spawn(argv, log);
    return b->redis_pid < 0 ? -1 : 0;
}

/* Connects to the redis-server started above, over its unix socket or
 * TCP, waiting for it to listen. */
static redisContext *redis_connect(bench_t *b, bool unix_sock)
{
    for (double end = now_s() + START_TIMEOUT_S; now_s() < end;) {
        redisContext *rc = unix_sock ? redisConnectUnix(b->redis_sock)
                                     : redisConnect("127.0.0.1", b->redis_port);
        if (rc != NULL && rc->err == 0) {
            return rc;
        }
        redisFree(rc);
        if (!child_alive(b->redis_pid, "redis-server")) {
            b->redis_pid = -1;
            return NULL;
        }
        usleep(10000);
    }
    fprintf(stderr, "bench_daemon: redis-server not reachable on port %d\n",
            b->redis_port);
    return NULL;
}

static kvd_store_t *client_open(const bench_t *b)
{
    kvd_config_t *cfg = NULL;
    kvd_store_t *st = NULL;
    char addr[160], err[256] = "";
    snprintf(addr, sizeof addr, "unix:%s", b->sock);
    if (kvd_config_create(&cfg) != KVD_OK) {
        return NULL;
    }
    kvd_status_t s = kvd_config_set(cfg, "store.mode", "daemon");
    if (s == KVD_OK) {
        s = kvd_config_set(cfg, "store.address", addr);
    }
    if (s == KVD_OK) {
        s = kvd_store_open(cfg, &st, err, sizeof err);
    }
    kvd_config_destroy(cfg);
    if (s != KVD_OK) {
        fprintf(stderr, "bench_daemon: kvd_store_open: %s (%s)\n",
                kvd_status_str(s), err);
        return NULL;
    }
    return st;
}

/* ---- the stored chain --------------------------------------------------- */

static void chain_make(bench_t *b)
{
    memset(b->ns.bytes, 0x42, sizeof b->ns.bytes);
    b->mget_argv[0] = "MGET";
    b->mget_len[0] = 4;
    for (uint32_t i = 0; i < MAX_CHAIN; i++) {
        memset(b->chain[i].bytes, 0x11, sizeof b->chain[i].bytes);
        memcpy(b->chain[i].bytes, &i, sizeof i);
        memcpy(b->keys[i].bytes, b->ns.bytes, sizeof b->ns.bytes);
        memcpy(b->keys[i].bytes + sizeof b->ns.bytes, b->chain[i].bytes,
               sizeof b->chain[i].bytes);
        b->mget_argv[i + 1] = (const char *)b->keys[i].bytes;
        b->mget_len[i + 1] = sizeof b->keys[i].bytes;
    }
}

/* Saves the chain's b->stored objects of 4 KiB (byte i of object k:
 * k + i). */
static int chain_store(bench_t *b, kvd_store_t *st)
{
    static kvd_store_reservation_t r[MAX_CHAIN];
    static kvd_store_key_t k[MAX_CHAIN];
    kvd_status_t s = kvd_store_reserve(st, &b->ns, b->chain, b->stored,
                                       CHAIN_OBJ_BYTES, 0, r);
    for (uint32_t i = 0; s == KVD_OK && i < b->stored; i++) {
        uint8_t *p =
            r[i].status == KVD_OK
                ? kvd_store_arena_ptr(st, r[i].arena_offset, CHAIN_OBJ_BYTES)
                : NULL;
        if (p == NULL) {
            fprintf(stderr, "bench_daemon: chain reserve %u: %s\n", i,
                    kvd_status_str(r[i].status));
            return -1;
        }
        for (uint32_t j = 0; j < CHAIN_OBJ_BYTES; j++) {
            p[j] = (uint8_t)(i + j);
        }
        k[i].ns = b->ns;
        k[i].hash = b->chain[i];
    }
    if (s == KVD_OK) {
        s = kvd_store_commit(st, k, b->stored, NULL);
    }
    if (s != KVD_OK) {
        fprintf(stderr, "bench_daemon: storing the chain: %s\n",
                kvd_status_str(s));
        return -1;
    }
    return 0;
}

/* One lookup of the chain from a fresh client: every block leased in the
 * arena with the bytes chain_store wrote. */
static int chain_check(bench_t *b)
{
    static kvd_store_lease_t l[MAX_CHAIN];
    kvd_store_t *st = client_open(b);
    size_t m = 0;
    size_t bad = 0;
    if (st == NULL ||
        kvd_store_lookup(st, &b->ns, b->chain, b->stored, l, &m) != KVD_OK) {
        kvd_store_close(st);
        return -1;
    }
    for (size_t i = 0; i < m; i++) {
        const uint8_t *p =
            kvd_store_arena_ptr(st, l[i].arena_offset, CHAIN_OBJ_BYTES);
        bad += l[i].tier != KVD_STORE_TIER_HOST ||
               l[i].size_bytes != CHAIN_OBJ_BYTES || p == NULL ||
               p[CHAIN_OBJ_BYTES - 1] != (uint8_t)(i + CHAIN_OBJ_BYTES - 1);
    }
    kvd_status_t s = kvd_store_release(st, l, m);
    kvd_store_close(st);
    if (m != b->stored || bad != 0 || s != KVD_OK) {
        fprintf(stderr,
                "bench_daemon: chain check: %zu of %u found, %zu bad, "
                "release %s\n",
                m, b->stored, bad, kvd_status_str(s));
        return -1;
    }
    return 0;
}

/* SETs every key of the chain to a location-sized value. */
static int chain_store_redis(bench_t *b, redisContext *rc)
{
    static const char value[LOCATION_BYTES] = "tier+offset+size........";
    for (uint32_t i = 0; i < b->stored; i++) {
        redisReply *r =
            redisCommand(rc, "SET %b %b", b->keys[i].bytes,
                         sizeof b->keys[i].bytes, value, sizeof value);
        bool ok = r != NULL && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        if (!ok) {
            fprintf(stderr, "bench_daemon: redis SET failed: %s\n",
                    rc->err != 0 ? rc->errstr : "bad reply");
            return -1;
        }
    }
    return 0;
}

/* ---- lookup of 512-key chains, 16 clients ------------------------------- */

static void sleep_until(double t)
{
    for (double d = t - now_s(); d > 0; d = t - now_s()) {
        struct timespec ts = {.tv_sec = (time_t)d,
                              .tv_nsec = (long)((d - (double)(time_t)d) * 1e9)};
        (void)nanosleep(&ts, NULL);
    }
}

/* Lookup + release of the chain until `deadline`; keys found, or -1. */
static int64_t lookup_kvd_run(const bench_t *b, kvd_store_t *st,
                              kvd_store_lease_t *leases, double deadline)
{
    int64_t keys = 0;
    while (now_s() < deadline) {
        size_t m = 0;
        double t0 = now_s();
        kvd_status_t s =
            kvd_store_lookup(st, &b->ns, b->chain, b->chain_len, leases, &m);
        kvd_status_t rs =
            s == KVD_OK ? kvd_store_release(st, leases, m) : KVD_OK;
        if (s != KVD_OK || m != b->chain_len || rs != KVD_OK) {
            fprintf(stderr,
                    "bench_daemon: lookup: %s, %zu of %u found, release "
                    "%s\n",
                    kvd_status_str(s), m, b->chain_len, kvd_status_str(rs));
            return -1;
        }
        call_timed(t0);
        keys += b->chain_len;
    }
    return keys;
}

/* MGET of the chain's keys until `deadline`; keys returned, or -1. */
static int64_t lookup_redis_run(const bench_t *b, redisContext *rc,
                                double deadline)
{
    int64_t keys = 0;
    while (now_s() < deadline) {
        double t0 = now_s();
        redisReply *r =
            redisCommandArgv(rc, (int)b->chain_len + 1,
                             (const char **)b->mget_argv, b->mget_len);
        bool ok = r != NULL && r->type == REDIS_REPLY_ARRAY &&
                  r->elements == b->chain_len &&
                  r->element[b->chain_len - 1]->type == REDIS_REPLY_STRING;
        freeReplyObject(r);
        if (!ok) {
            fprintf(stderr, "bench_daemon: MGET failed: %s\n",
                    rc->err != 0 ? rc->errstr : "bad reply");
            return -1;
        }
        call_timed(t0);
        keys += b->chain_len;
    }
    return keys;
}

/* The client process: connects to both servers, says so, then runs the
 * passes it is sent until SIDE_QUIT or a closed pipe. */
static void client_main(bench_t *b, int cmd_fd, int res_fd)
{
    kvd_store_t *st = client_open(b);
    redisContext *rc = redis_connect(b, true);
    kvd_store_lease_t *leases = calloc(MAX_CHAIN, sizeof *leases);
    client_res_t res = {.ok = st != NULL && rc != NULL && leases != NULL};
    bool up = write(res_fd, &res, sizeof res) == (ssize_t)sizeof res;
    client_cmd_t cmd;
    while (up && res.ok &&
           read(cmd_fd, &cmd, sizeof cmd) == (ssize_t)sizeof cmd &&
           cmd.side != SIDE_QUIT) {
        sleep_until(cmd.start);
        n_call_lat = 0;
        b->chain_len = cmd.chain_len;
        int64_t keys = cmd.side == SIDE_KVD
                           ? lookup_kvd_run(b, st, leases, cmd.deadline)
                           : lookup_redis_run(b, rc, cmd.deadline);
        res.keys = keys > 0 ? (uint64_t)keys : 0;
        res.ok = keys >= 0;
        res.p50_s = res.p99_s = 0;
        if (n_call_lat > 0) {
            qsort(call_lat, n_call_lat, sizeof call_lat[0], cmp_double);
            res.p50_s = call_lat[n_call_lat / 2];
            res.p99_s = call_lat[(n_call_lat - 1) * 99 / 100];
        }
        up = write(res_fd, &res, sizeof res) == (ssize_t)sizeof res;
    }
    kvd_store_close(st);
    redisFree(rc);
    free(leases);
}

/* Forks the lookup clients (`c` comes with pid and fds at -1, so
 * clients_stop can follow a failure); 0 when every one is connected. */
static int clients_start(bench_t *b, client_t *c)
{
    pid_t parent = getpid();
    for (int i = 0; i < b->n_clients; i++) {
        int cmd[2], res[2];
        if (pipe2(cmd, O_CLOEXEC) != 0) {
            fprintf(stderr, "bench_daemon: pipe: %s\n", strerror(errno));
            return -1;
        }
        if (pipe2(res, O_CLOEXEC) != 0) {
            fprintf(stderr, "bench_daemon: pipe: %s\n", strerror(errno));
            close(cmd[0]);
            close(cmd[1]);
            return -1;
        }
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid == 0) {
            (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() == parent) {
                close(cmd[1]);
                close(res[0]);
                /* The other clients' pipes are the parent's to close. */
                for (int j = 0; j < i; j++) {
                    close(c[j].cmd_fd);
                    close(c[j].res_fd);
                }
                client_main(b, cmd[0], res[1]);
            }
            _exit(0);
        }
        close(cmd[0]);
        close(res[1]);
        c[i].pid = pid;
        c[i].cmd_fd = cmd[1];
        c[i].res_fd = res[0];
        if (pid < 0) {
            fprintf(stderr, "bench_daemon: fork: %s\n", strerror(errno));
            return -1;
        }
    }
    for (int i = 0; i < b->n_clients; i++) {
        client_res_t r;
        if (read(c[i].res_fd, &r, sizeof r) != (ssize_t)sizeof r || !r.ok) {
            fprintf(stderr, "bench_daemon: lookup client %d did not connect\n",
                    i);
            return -1;
        }
    }
    return 0;
}

static void clients_stop(client_t *c)
{
    for (int i = 0; i < MAX_CLIENTS; i++) {
        if (c[i].cmd_fd >= 0) {
            close(c[i].cmd_fd); /* a closed pipe sends the client home */
        }
        if (c[i].res_fd >= 0) {
            close(c[i].res_fd);
        }
        if (c[i].pid > 0) {
            (void)waitpid(c[i].pid, NULL, 0);
        }
    }
}

/* Every active client runs `side` for b->seconds from a common start;
 * keys per second of them all, or -1 if a call failed or a client went
 * away. lat (may be NULL): the median of the clients' p50 call times and
 * the largest of their p99s, in seconds. */
static double lookup_pass(bench_t *b, client_t *c, int side, double lat[2])
{
    double t0 = now_s() + 0.05; /* time for every client to get the word */
    client_cmd_t cmd = {.side = side,
                        .chain_len = b->chain_len,
                        .start = t0,
                        .deadline = t0 + b->seconds};
    bool failed = false;
    for (int i = 0; i < b->active && !failed; i++) {
        failed = write(c[i].cmd_fd, &cmd, sizeof cmd) != (ssize_t)sizeof cmd;
    }
    uint64_t keys = 0;
    double p50[MAX_CLIENTS], p99 = 0;
    for (int i = 0; i < b->active && !failed; i++) {
        client_res_t r;
        failed = read(c[i].res_fd, &r, sizeof r) != (ssize_t)sizeof r || !r.ok;
        keys += r.keys;
        p50[i] = r.p50_s;
        p99 = r.p99_s > p99 ? r.p99_s : p99;
    }
    double t1 = now_s();
    if (lat != NULL && !failed) {
        qsort(p50, (size_t)b->active, sizeof p50[0], cmp_double);
        lat[0] = p50[b->active / 2];
        lat[1] = p99;
    }
    return failed ? -1 : (double)keys / (t1 - t0);
}

/* ---- put+get of 2 MiB objects, one client ------------------------------- */

/* One pass of put+get through the shared arena; bytes moved per second,
 * or -1. Every round saves a new block; the last one read back must equal
 * `src`. */
static double putget_kvd_pass(bench_t *b, kvd_store_t *st, const uint8_t *src,
                              uint8_t *dst)
{
    double t0 = now_s(), end = t0 + b->seconds;
    uint64_t rounds = 0;
    while (now_s() < end) {
        kvd_block_hash_t h;
        memset(h.bytes, 0x77, sizeof h.bytes);
        memcpy(h.bytes, &b->next_big, sizeof b->next_big);
        b->next_big++;
        kvd_store_key_t k = {.ns = b->ns, .hash = h};
        kvd_store_reservation_t r;
        kvd_store_lease_t l;
        size_t m = 0;
        kvd_status_t s = kvd_store_reserve(st, &b->ns, &h, 1, BIG_BYTES, 0, &r);
        uint8_t *p = s == KVD_OK && r.status == KVD_OK
                         ? kvd_store_arena_ptr(st, r.arena_offset, BIG_BYTES)
                         : NULL;
        if (p == NULL) {
            fprintf(stderr, "bench_daemon: reserve: %s (key %s)\n",
                    kvd_status_str(s), kvd_status_str(r.status));
            return -1;
        }
        memcpy(p, src, BIG_BYTES);
        s = kvd_store_commit(st, &k, 1, NULL);
        if (s == KVD_OK) {
            s = kvd_store_lookup(st, &b->ns, &h, 1, &l, &m);
        }
        p = s == KVD_OK && m == 1
                ? kvd_store_arena_ptr(st, l.arena_offset, BIG_BYTES)
                : NULL;
        if (p == NULL) {
            fprintf(stderr, "bench_daemon: commit/lookup: %s, %zu found\n",
                    kvd_status_str(s), m);
            return -1;
        }
        memcpy(dst, p, BIG_BYTES);
        s = kvd_store_release(st, &l, 1);
        if (s != KVD_OK) {
            fprintf(stderr, "bench_daemon: release: %s\n", kvd_status_str(s));
            return -1;
        }
        rounds++;
    }
    double t1 = now_s();
    if (rounds == 0 || memcmp(src, dst, BIG_BYTES) != 0) {
        fprintf(stderr, "bench_daemon: put+get read back other bytes\n");
        return -1;
    }
    return (double)rounds * 2.0 * BIG_BYTES / (t1 - t0);
}

/* SET then GET of a 2 MiB value, over REDIS_BIG_KEYS keys (each SET
 * replaces an older value, as redis would be used). The last GET must
 * return `src`. */
static double putget_redis_pass(bench_t *b, redisContext *rc,
                                const uint8_t *src)
{
    double t0 = now_s(), end = t0 + b->seconds;
    uint64_t rounds = 0;
    redisReply *last = NULL; /* the latest GET's reply */
    while (now_s() < end) {
        redis_key_t key;
        uint32_t i = (uint32_t)(rounds % REDIS_BIG_KEYS);
        memcpy(key.bytes, b->ns.bytes, sizeof b->ns.bytes);
        memset(key.bytes + sizeof b->ns.bytes, 0x77, sizeof(kvd_block_hash_t));
        memcpy(key.bytes + sizeof b->ns.bytes, &i, sizeof i);
        redisReply *r = redisCommand(rc, "SET %b %b", key.bytes,
                                     sizeof key.bytes, src, (size_t)BIG_BYTES);
        bool ok = r != NULL && r->type == REDIS_REPLY_STATUS;
        freeReplyObject(r);
        r = ok ? redisCommand(rc, "GET %b", key.bytes, sizeof key.bytes) : NULL;
        ok = r != NULL && r->type == REDIS_REPLY_STRING && r->len == BIG_BYTES;
        if (!ok) {
            freeReplyObject(r);
            fprintf(stderr, "bench_daemon: redis SET/GET failed: %s\n",
                    rc->err != 0 ? rc->errstr : "bad reply");
            return -1;
        }
        freeReplyObject(last);
        last = r;
        rounds++;
    }
    double t1 = now_s();
    /* Checked after the clock stops, as for the daemon. */
    bool same = last != NULL && memcmp(last->str, src, BIG_BYTES) == 0;
    freeReplyObject(last);
    if (!same) {
        fprintf(stderr, "bench_daemon: redis GET returned other bytes\n");
        return -1;
    }
    return (double)rounds * 2.0 * BIG_BYTES / (t1 - t0);
}

/* ---- the run ------------------------------------------------------------ */

typedef struct figure {
    double kvd[PASSES], redis[PASSES], ratio[PASSES];
} figure_t;

static void figure_row(const char *what, const figure_t *f, double unit,
                       const char *unit_name)
{
    double lo = f->ratio[0], hi = f->ratio[0];
    for (int i = 1; i < PASSES; i++) {
        lo = f->ratio[i] < lo ? f->ratio[i] : lo;
        hi = f->ratio[i] > hi ? f->ratio[i] : hi;
    }
    printf("| %s | %.3g %s | %.3g %s | %.2f (%.2f-%.2f) |\n", what,
           median(f->kvd, PASSES) / unit, unit_name,
           median(f->redis, PASSES) / unit, unit_name, median(f->ratio, PASSES),
           lo, hi);
}

static int bench_lookup(bench_t *b, client_t *c, figure_t *f)
{
    int rc = 0;
    for (int p = 0; p < PASSES && rc == 0; p++) {
        f->kvd[p] = lookup_pass(b, c, SIDE_KVD, NULL);
        f->redis[p] = lookup_pass(b, c, SIDE_REDIS, NULL);
        f->ratio[p] = f->kvd[p] / f->redis[p];
        rc = f->kvd[p] < 0 || f->redis[p] < 0 ? -1 : 0;
    }
    return rc;
}

/* put+get: kvdepotd, redis over its unix socket, redis over TCP, in
 * turn in every pass; f[0] against the unix socket, f[1] against TCP
 * (the same kvdepotd figures). */
static int bench_putget(bench_t *b, kvd_store_t *st, redisContext *rc_unix,
                        redisContext *rc_tcp, figure_t f[2])
{
    uint8_t *src = malloc(BIG_BYTES), *dst = malloc(BIG_BYTES);
    int ret = src != NULL && dst != NULL ? 0 : -1;
    for (size_t i = 0; ret == 0 && i < BIG_BYTES; i++) {
        src[i] = (uint8_t)(i * 31u + (i >> 12));
    }
    if (ret == 0) {
        memset(dst, 0, BIG_BYTES);
    }
    /* A warm-up pass per side, not counted: the client's first touch of
     * each arena page and redis growing its allocations are start-up
     * costs, not what a serving store pays per object. */
    if (ret == 0 && (putget_kvd_pass(b, st, src, dst) < 0 ||
                     putget_redis_pass(b, rc_unix, src) < 0 ||
                     putget_redis_pass(b, rc_tcp, src) < 0)) {
        ret = -1;
    }
    for (int p = 0; p < PASSES && ret == 0; p++) {
        f[0].kvd[p] = f[1].kvd[p] = putget_kvd_pass(b, st, src, dst);
        f[0].redis[p] = putget_redis_pass(b, rc_unix, src);
        f[1].redis[p] = putget_redis_pass(b, rc_tcp, src);
        for (int k = 0; k < 2; k++) {
            f[k].ratio[p] = f[k].kvd[p] / f[k].redis[p];
            ret = f[k].kvd[p] < 0 || f[k].redis[p] < 0 ? -1 : ret;
        }
    }
    free(dst);
    free(src);
    return ret;
}

static int bench_run(bench_t *b, client_t *clients, kvd_store_t *st,
                     redisContext *rc_unix, redisContext *rc_tcp)
{
    figure_t lookup, putget[2];
    if (chain_store(b, st) != 0 || chain_check(b) != 0 ||
        chain_store_redis(b, rc_unix) != 0 ||
        bench_lookup(b, clients, &lookup) != 0 ||
        bench_putget(b, st, rc_unix, rc_tcp, putget) != 0) {
        return -1;
    }
    printf("kvdepotd (store.mode=daemon, unix socket + shared arena) vs "
           "redis-server (hiredis; unix socket, and TCP 127.0.0.1 where "
           "said), %d passes of %.1f s per side; median of the passes, "
           "ratio: median (min-max) of per-pass ratios\n\n",
           PASSES, b->seconds);
    printf("| workload | kvdepotd | redis | ratio |\n|---|---:|---:|---:|\n");
    figure_row("lookup + release, 512-key chain, 16 clients (redis: MGET, "
               "unix socket)",
               &lookup, 1e6, "M keys/s");
    figure_row("put+get 2 MiB, 1 client (redis: SET + GET, unix socket)",
               &putget[0], 1e9, "GB/s");
    figure_row("put+get 2 MiB, 1 client (redis: SET + GET, TCP)", &putget[1],
               1e9, "GB/s");
    printf("\nput+get compares designs: kvdepotd's payload crosses no socket "
           "(shared arena), redis's crosses its socket both ways.\n\n");
    headline("lookup_512_chain_keys_per_s_vs_redis_mget_unix",
             median(lookup.ratio, PASSES), "target >= 1.0");
    headline("put_get_2mib_bytes_per_s_vs_redis_set_get_unix",
             median(putget[0].ratio, PASSES), "target >= 5.0");
    headline("put_get_2mib_bytes_per_s_vs_redis_set_get_tcp",
             median(putget[1].ratio, PASSES), "target >= 5.0");
    return 0;
}

/* One point of a sweep: PASSES interleaved passes of the active clients'
 * lookups (b->chain_len keys a call) against MGET of the same keys over
 * redis's unix socket; one JSON line (keys per second, medians with the
 * range of the per-pass ratios; per-call p50: median over the clients,
 * p99: the largest client p99, medians over the passes). */
static int sweep_point(bench_t *b, client_t *clients)
{
    figure_t f;
    double kl[PASSES][2], rl[PASSES][2], v[4][PASSES];
    for (int p = 0; p < PASSES; p++) {
        f.kvd[p] = lookup_pass(b, clients, SIDE_KVD, kl[p]);
        f.redis[p] = lookup_pass(b, clients, SIDE_REDIS, rl[p]);
        if (f.kvd[p] < 0 || f.redis[p] < 0) {
            return -1;
        }
        f.ratio[p] = f.kvd[p] / f.redis[p];
        v[0][p] = kl[p][0];
        v[1][p] = kl[p][1];
        v[2][p] = rl[p][0];
        v[3][p] = rl[p][1];
    }
    double lo = f.ratio[0], hi = f.ratio[0];
    for (int p = 1; p < PASSES; p++) {
        lo = f.ratio[p] < lo ? f.ratio[p] : lo;
        hi = f.ratio[p] > hi ? f.ratio[p] : hi;
    }
    printf("SWEEP {\"clients\": %d, \"chain\": %u, \"passes\": %d, "
           "\"seconds\": %.2f, "
           "\"kvd_keys_per_s\": %.0f, \"redis_keys_per_s\": %.0f, "
           "\"ratio\": %.4f, \"ratio_min\": %.4f, \"ratio_max\": %.4f, "
           "\"kvd_p50_us\": %.1f, \"kvd_p99_us\": %.1f, "
           "\"redis_p50_us\": %.1f, \"redis_p99_us\": %.1f}\n",
           b->active, b->chain_len, PASSES, b->seconds, median(f.kvd, PASSES),
           median(f.redis, PASSES), median(f.ratio, PASSES), lo, hi,
           median(v[0], PASSES) * 1e6, median(v[1], PASSES) * 1e6,
           median(v[2], PASSES) * 1e6, median(v[3], PASSES) * 1e6);
    fflush(stdout);
    return 0;
}

/* `--sweep`: the lookup of the 512-key chain by 1, 2, 4 .. MAX_CLIENTS
 * client processes; `--sweep-chain`: one client's lookups of the first
 * 16, 64 .. MAX_CHAIN keys of a stored chain. Both against redis MGET of
 * the same keys; bench/curves.py draws them. */
static int bench_sweep(bench_t *b, client_t *clients, kvd_store_t *st,
                       redisContext *rc, bool by_chain)
{
    if (chain_store(b, st) != 0 || chain_check(b) != 0 ||
        chain_store_redis(b, rc) != 0) {
        return -1;
    }
    if (by_chain) {
        b->active = SWEEP_CHAIN_CLIENTS;
        for (b->chain_len = 16; b->chain_len <= MAX_CHAIN; b->chain_len *= 4) {
            if (sweep_point(b, clients) != 0) {
                return -1;
            }
        }
        return 0;
    }
    for (b->active = 1; b->active <= MAX_CLIENTS; b->active *= 2) {
        if (sweep_point(b, clients) != 0) {
            return -1;
        }
    }
    return 0;
}

static int rm_entry(const char *path, const struct stat *sb, int flag,
                    struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static const char *env_or(const char *name, const char *def)
{
    const char *v = getenv(name);
    return v != NULL && v[0] != '\0' ? v : def;
}

int main(int argc, char **argv)
{
    bench_prog = "bench_daemon";
    static bench_t b = {.daemon_pid = -1, .redis_pid = -1};
    static client_t clients[MAX_CLIENTS];
    bool by_chain = argc == 2 && strcmp(argv[1], "--sweep-chain") == 0;
    bool sweep = by_chain || (argc == 2 && strcmp(argv[1], "--sweep") == 0);
    if (argc > 1 && !sweep) {
        fprintf(stderr, "usage: bench_daemon [--sweep | --sweep-chain]\n");
        return 2;
    }
    b.n_clients = by_chain ? SWEEP_CHAIN_CLIENTS
                  : sweep  ? MAX_CLIENTS
                           : CLIENTS;
    b.active = b.n_clients;
    b.stored = by_chain ? MAX_CHAIN : CHAIN_LEN;
    b.chain_len = CHAIN_LEN;
    double total = atof(env_or("KVDEPOT_BENCH_SECONDS", "3"));
    b.seconds = (total > 0 ? total : 3.0) / PASSES;
    /* A server that dies mid-call must fail the call, not kill us. */
    signal(SIGPIPE, SIG_IGN);
    snprintf(b.dir, sizeof b.dir, "/tmp/kvd_bench_daemon_XXXXXX");
    if (mkdtemp(b.dir) == NULL) {
        fprintf(stderr, "bench_daemon: mkdtemp: %s\n", strerror(errno));
        return 1;
    }
    snprintf(b.sock, sizeof b.sock, "%s/d.sock", b.dir);
    snprintf(b.ready, sizeof b.ready, "%s/ready", b.dir);
    snprintf(b.redis_sock, sizeof b.redis_sock, "%s/redis.sock", b.dir);

    int rc = 1;
    kvd_store_t *st = NULL;
    redisContext *redis = NULL, *redis_tcp = NULL;
    chain_make(&b);
    for (int i = 0; i < MAX_CLIENTS; i++) {
        clients[i].pid = -1;
        clients[i].cmd_fd = clients[i].res_fd = -1;
    }
    if (daemon_start(&b, env_or("KVDEPOTD", KVD_BENCH_KVDEPOTD)) != 0) {
        goto err_stop;
    }
    /* The clients fork before this process opens its own store client. */
    if (redis_start(&b, env_or("REDIS_SERVER", "redis-server")) != 0 ||
        (redis = redis_connect(&b, true)) == NULL ||
        (redis_tcp = redis_connect(&b, false)) == NULL ||
        clients_start(&b, clients) != 0 || (st = client_open(&b)) == NULL) {
        goto err_stop;
    }
    if ((sweep ? bench_sweep(&b, clients, st, redis, by_chain)
               : bench_run(&b, clients, st, redis, redis_tcp)) == 0) {
        rc = 0;
    }
err_stop:
    clients_stop(clients);
    kvd_store_close(st);
    redisFree(redis);
    redisFree(redis_tcp);
    int dstat = child_stop(b.daemon_pid);
    (void)child_stop(b.redis_pid);
    if (b.daemon_pid > 0 && dstat != 0) {
        fprintf(stderr,
                "bench_daemon: kvdepotd did not exit 0 on SIGTERM "
                "(status %d)\n",
                dstat);
        rc = 1;
    }
    if (rc != 0) {
        fprintf(stderr, "bench_daemon: logs kept in %s\n", b.dir);
        return rc;
    }
    if (nftw(b.dir, rm_entry, 8, FTW_DEPTH | FTW_PHYS) != 0) {
        fprintf(stderr, "bench_daemon: could not remove %s\n", b.dir);
    }
    for (size_t i = 0; i < num_headlines; i++) {
        printf("%s\n", headlines[i]);
    }
    return 0;
}
