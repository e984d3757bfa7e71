/*
 * kvdepotd benchmark (issue "kvdepotd"): the daemon through the client
 * library (store.mode daemon, exactly what an engine uses) against
 * redis-server driven through hiredis, both started by this program on
 * this machine, in the same run.
 *
 *   lookup  16 client threads, each with its own connection, repeat a
 *           lookup of the same stored 512-key chain (and give the leases
 *           back); redis: 16 threads each MGET the same 512 keys (16-byte
 *           values, the size of a location record). Keys per second.
 *   put+get one client saves a 2 MiB object (reserve, copy into the shared
 *           arena, commit) and loads it back (lookup, copy out, release);
 *           redis: SET then GET of a 2 MiB value over loopback. Bytes moved
 *           per second (4 MiB per round for both).
 *
 * Environment: KVDEPOTD (the daemon binary; default: the one built beside
 * this program), REDIS_SERVER (default: redis-server on PATH),
 * KVDEPOT_BENCH_SECONDS (per measurement, default 3).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "kvdepot/store.h"

#define THREADS 16
#define CHAIN 512
#define BIG (2u << 20)

static double g_seconds = 3.0;
static char g_sock[300];
static int g_redis_port;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static pid_t spawn(char *const argv[], const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        FILE *f = freopen(log, "w", stdout);
        (void)f;
        dup2(STDOUT_FILENO, STDERR_FILENO);
        execvp(argv[0], argv);
        _exit(127);
    }
    return pid;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0) {
            close(fd);
        }
        return -1;
    }
    close(fd);
    return ntohs(a.sin_port);
}

static kvd_store_t *client_open(void)
{
    kvd_config_t *cfg = NULL;
    kvd_store_t *st = NULL;
    char addr[320], err[256] = "";
    snprintf(addr, sizeof addr, "unix:%s", g_sock);
    if (kvd_config_create(&cfg) != KVD_OK) {
        return NULL;
    }
    (void)kvd_config_set(cfg, "store.mode", "daemon");
    (void)kvd_config_set(cfg, "store.address", addr);
    if (kvd_store_open(cfg, &st, err, sizeof err) != KVD_OK) {
        fprintf(stderr, "bench_daemon: open: %s\n", err);
        st = NULL;
    }
    kvd_config_destroy(cfg);
    return st;
}

static kvd_namespace_t g_ns;
static kvd_block_hash_t g_chain[CHAIN];

typedef struct worker {
    pthread_t t;
    kvd_store_t *st;
    redisContext *rc;
    double keys;
    int errors;
} worker_t;

static void *kvd_lookup_main(void *arg)
{
    worker_t *w = arg;
    kvd_store_lease_t *l = malloc(CHAIN * sizeof *l);
    double end = now_s() + g_seconds;
    while (l != NULL && now_s() < end) {
        size_t m = 0;
        if (kvd_store_lookup(w->st, &g_ns, g_chain, CHAIN, l, &m) != KVD_OK ||
            m != CHAIN) {
            w->errors++;
            continue;
        }
        (void)kvd_store_release(w->st, l, m);
        w->keys += CHAIN;
    }
    free(l);
    return NULL;
}

static const char *g_mget[CHAIN + 1];
static size_t g_mget_len[CHAIN + 1];

static void *redis_lookup_main(void *arg)
{
    worker_t *w = arg;
    double end = now_s() + g_seconds;
    while (now_s() < end) {
        redisReply *r = redisCommandArgv(w->rc, CHAIN + 1, g_mget, g_mget_len);
        if (r == NULL || r->type != REDIS_REPLY_ARRAY || r->elements != CHAIN) {
            w->errors++;
        } else {
            w->keys += CHAIN;
        }
        if (r != NULL) {
            freeReplyObject(r);
        }
    }
    return NULL;
}

static double run_threads(worker_t *w, void *(*fn)(void *))
{
    double t0 = now_s();
    for (int i = 0; i < THREADS; i++) {
        pthread_create(&w[i].t, NULL, fn, &w[i]);
    }
    double keys = 0;
    int errors = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(w[i].t, NULL);
        keys += w[i].keys;
        errors += w[i].errors;
    }
    if (errors > 0) {
        fprintf(stderr, "bench_daemon: %d failed calls\n", errors);
    }
    return keys / (now_s() - t0);
}

/* Stores the chain (4 KiB objects) once. */
static int populate(kvd_store_t *st)
{
    kvd_store_reservation_t r[CHAIN];
    kvd_store_key_t k[CHAIN];
    if (kvd_store_reserve(st, &g_ns, g_chain, CHAIN, 4096, 0, r) != KVD_OK) {
        return -1;
    }
    for (int i = 0; i < CHAIN; i++) {
        if (r[i].status == KVD_OK) {
            memset(kvd_store_arena_ptr(st, r[i].arena_offset, 4096), i, 4096);
        }
        k[i].ns = g_ns;
        k[i].hash = g_chain[i];
    }
    return kvd_store_commit(st, k, CHAIN, NULL) == KVD_OK ? 0 : -1;
}

static double kvd_put_get(kvd_store_t *st, uint8_t *src, uint8_t *dst)
{
    double t0 = now_s(), end = t0 + g_seconds;
    double bytes = 0;
    for (uint32_t i = 0; now_s() < end; i++) {
        kvd_block_hash_t h;
        memset(h.bytes, 0x77, sizeof h.bytes);
        memcpy(h.bytes, &i, sizeof i);
        kvd_store_reservation_t r;
        if (kvd_store_reserve(st, &g_ns, &h, 1, BIG, 0, &r) != KVD_OK ||
            r.status != KVD_OK) {
            fprintf(stderr, "bench_daemon: reserve failed\n");
            break;
        }
        memcpy(kvd_store_arena_ptr(st, r.arena_offset, BIG), src, BIG);
        kvd_store_key_t k = {.ns = g_ns, .hash = h};
        kvd_store_lease_t l;
        size_t m = 0;
        if (kvd_store_commit(st, &k, 1, NULL) != KVD_OK ||
            kvd_store_lookup(st, &g_ns, &h, 1, &l, &m) != KVD_OK || m != 1) {
            fprintf(stderr, "bench_daemon: commit/lookup failed\n");
            break;
        }
        memcpy(dst, kvd_store_arena_ptr(st, l.arena_offset, BIG), BIG);
        (void)kvd_store_release(st, &l, 1);
        bytes += 2.0 * BIG;
    }
    return bytes / (now_s() - t0);
}

static double redis_put_get(redisContext *rc, const uint8_t *src)
{
    double t0 = now_s(), end = t0 + g_seconds;
    double bytes = 0;
    for (uint32_t i = 0; now_s() < end; i++) {
        char key[32];
        snprintf(key, sizeof key, "big:%u", i % 64);
        redisReply *r = redisCommand(rc, "SET %s %b", key, src, (size_t)BIG);
        if (r == NULL) {
            break;
        }
        freeReplyObject(r);
        r = redisCommand(rc, "GET %s", key);
        if (r == NULL || r->type != REDIS_REPLY_STRING || r->len != BIG) {
            if (r != NULL) {
                freeReplyObject(r);
            }
            break;
        }
        freeReplyObject(r);
        bytes += 2.0 * BIG;
    }
    return bytes / (now_s() - t0);
}

static redisContext *redis_connect(void)
{
    for (int tries = 0; tries < 200; tries++) {
        redisContext *rc = redisConnect("127.0.0.1", g_redis_port);
        if (rc != NULL && rc->err == 0) {
            return rc;
        }
        if (rc != NULL) {
            redisFree(rc);
        }
        usleep(20000);
    }
    return NULL;
}

int main(void)
{
    const char *sec = getenv("KVDEPOT_BENCH_SECONDS");
    if (sec != NULL && atof(sec) > 0) {
        g_seconds = atof(sec);
    }
    const char *daemon = getenv("KVDEPOTD");
    if (daemon == NULL || daemon[0] == '\0') {
        daemon = KVD_BENCH_KVDEPOTD;
    }
    const char *redis = getenv("REDIS_SERVER");
    if (redis == NULL || redis[0] == '\0') {
        redis = "redis-server";
    }
    char dir[] = "/tmp/kvd_bench_daemon_XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("bench_daemon: mkdtemp");
        return 1;
    }
    snprintf(g_sock, sizeof g_sock, "%s/d.sock", dir);
    char sock_set[340], ready[320], dlog[320], rlog[320], port[16];
    snprintf(sock_set, sizeof sock_set, "server.unix_socket=%s", g_sock);
    snprintf(ready, sizeof ready, "%s/ready", dir);
    snprintf(dlog, sizeof dlog, "%s/daemon.log", dir);
    snprintf(rlog, sizeof rlog, "%s/redis.log", dir);
    g_redis_port = free_port();
    snprintf(port, sizeof port, "%d", g_redis_port);
    char *dargv[] = {(char *)daemon,
                     "--set",
                     sock_set,
                     "--set",
                     "store.arena_size=512m",
                     "--set",
                     "server.threads=2",
                     "--set",
                     "log.level=warn",
                     "--ready-file",
                     ready,
                     NULL};
    char *rargv[] = {(char *)redis, "--port", port, "--bind",
                     "127.0.0.1",   "--save", "",   "--appendonly",
                     "no",          NULL};
    pid_t dpid = spawn(dargv, dlog);
    pid_t rpid = spawn(rargv, rlog);
    for (int i = 0; i < 3000 && access(ready, F_OK) != 0; i++) {
        usleep(10000);
    }
    redisContext *rc = redis_connect();
    int rcode = 1;
    kvd_store_t *st = access(ready, F_OK) == 0 ? client_open() : NULL;
    if (st == NULL || rc == NULL) {
        fprintf(stderr, "bench_daemon: %s did not start (logs in %s)\n",
                st == NULL ? "kvdepotd" : "redis-server", dir);
        goto out;
    }
    memset(g_ns.bytes, 0x42, sizeof g_ns.bytes);
    static char keyname[CHAIN][24];
    g_mget[0] = "MGET";
    g_mget_len[0] = 4;
    for (int i = 0; i < CHAIN; i++) {
        memset(g_chain[i].bytes, 0, sizeof g_chain[i].bytes);
        memcpy(g_chain[i].bytes, &i, sizeof i);
        g_chain[i].bytes[31] = 1;
        snprintf(keyname[i], sizeof keyname[i], "chain:%d", i);
        g_mget[i + 1] = keyname[i];
        g_mget_len[i + 1] = strlen(keyname[i]);
        redisReply *r = redisCommand(rc, "SET %s %b", keyname[i],
                                     "0123456789abcdef", (size_t)16);
        if (r != NULL) {
            freeReplyObject(r);
        }
    }
    if (populate(st) != 0) {
        fprintf(stderr, "bench_daemon: could not store the chain\n");
        goto out;
    }

    worker_t w[THREADS];
    memset(w, 0, sizeof w);
    for (int i = 0; i < THREADS; i++) {
        w[i].st = client_open();
        if (w[i].st == NULL) {
            goto out;
        }
    }
    double kvd_keys = run_threads(w, kvd_lookup_main);
    for (int i = 0; i < THREADS; i++) {
        kvd_store_close(w[i].st);
    }
    memset(w, 0, sizeof w);
    for (int i = 0; i < THREADS; i++) {
        w[i].rc = redis_connect();
        if (w[i].rc == NULL) {
            goto out;
        }
    }
    double redis_keys = run_threads(w, redis_lookup_main);
    for (int i = 0; i < THREADS; i++) {
        redisFree(w[i].rc);
    }

    uint8_t *src = malloc(BIG), *dst = malloc(BIG);
    if (src == NULL || dst == NULL) {
        goto out;
    }
    for (size_t i = 0; i < BIG; i++) {
        src[i] = (uint8_t)(i * 31u);
    }
    double kvd_bw = kvd_put_get(st, src, dst);
    double redis_bw = redis_put_get(rc, src);
    free(src);
    free(dst);

    printf("kvdepotd vs redis-server, %d client threads for lookups, %.0f s "
           "per measurement\n\n",
           THREADS, g_seconds);
    printf("| workload | kvdepotd | redis | ratio |\n|---|---:|---:|---:|\n");
    printf("| lookup of a 512-key chain (keys/s, %d clients) | %.3g | %.3g | "
           "%.2f |\n",
           THREADS, kvd_keys, redis_keys, kvd_keys / redis_keys);
    printf("| put+get 2 MiB (MB/s moved, 1 client) | %.0f | %.0f | %.2f |\n\n",
           kvd_bw / 1e6, redis_bw / 1e6, kvd_bw / redis_bw);
    printf("BENCH daemon: lookup keys/s vs redis MGET = %.2f (target >= 1)\n",
           kvd_keys / redis_keys);
    printf("BENCH daemon: put+get 2 MiB vs redis SET/GET = %.2f (target >= "
           "5)\n",
           kvd_bw / redis_bw);
    rcode = 0;
out:
    kvd_store_close(st);
    if (rc != NULL) {
        redisFree(rc);
    }
    kill(dpid, SIGTERM);
    kill(rpid, SIGTERM);
    waitpid(dpid, NULL, 0);
    waitpid(rpid, NULL, 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (rcode == 0 && system(cmd) != 0) {
        fprintf(stderr, "bench_daemon: could not remove %s\n", dir);
    }
    return rcode;
}
