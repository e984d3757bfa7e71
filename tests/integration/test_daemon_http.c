/*
 * kvdepotd's HTTP endpoint (/metrics, /healthz, /readyz) under attack,
 * beside an honest engine that keeps calling Lookup, Release and Stats on
 * objects it saved, whose latency is measured. The daemon runs with the
 * soft descriptor limit a systemd service gets by default (1,024), which
 * the metrics listener shares with the hand-off socket and gRPC:
 *   - 1,100 slowloris connections (a request line, then one header byte
 *     every 2 s) must leave the daemon's descriptors bounded
 *     (server.metrics_max_connections), a new engine must still hand off
 *     and call, and the endpoint must answer again once they go (before
 *     the bound, they took all 1,024 descriptors and new engines could
 *     no longer connect);
 *   - 8 scrapers reading /metrics as fast as they can: every scrape 200;
 *   - request lines and headers of 1 MiB: refused with an error status,
 *     the daemon's memory and descriptors back where they were;
 *   - 1,100 idle HTTP/2 connections on the gRPC TCP port, which gRPC does
 *     not bound: the daemon raises its soft descriptor limit to the hard
 *     one at start, so they leave new engines served.
 * Each prints its figures (docs/reliability.md, "The daemon").
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "tests/integration/kvd_testdaemonclient_int.h"

#define DAEMON_NOFILE 1024 /* systemd's default soft limit */
#define SLOW_CONNS 1100
#define MAX_CONNS 32 /* server.metrics_max_connections below */
#define SCRAPERS 8
#define SCRAPES 500
#define LAT_MAX 100000

static pid_t daemon_up(kvd_test_dir_t *d, const char *tag)
{
    kvd_test_dir_make(d, tag);
    pid_t pid =
        daemon_start(d, "server.metrics_address=127.0.0.1:0",
                     "server.metrics_max_connections=32", (const char *)NULL);
    struct rlimit rl = {.rlim_cur = DAEMON_NOFILE, .rlim_max = DAEMON_NOFILE};
    assert_int_equal(prlimit(pid, RLIMIT_NOFILE, &rl, NULL), 0);
    return pid;
}

static int metrics_port(const kvd_test_dir_t *d)
{
    char ready[300];
    snprintf(ready, sizeof ready, "%s/ready", d->path);
    int port = kvd_metric_port(ready);
    assert_true(port > 0);
    return port;
}

static int fd_count(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *dir = opendir(path);
    assert_non_null(dir);
    int n = 0;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        n += e->d_name[0] != '.';
    }
    closedir(dir);
    return n;
}

/* A TCP connection to 127.0.0.1:port whose reads give up after
 * `timeout_ms`; -1 when the connect fails. */
static int tcp_connect(int port, int timeout_ms)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(s >= 0);
    struct timeval tv = {.tv_sec = timeout_ms / 1000,
                         .tv_usec = (timeout_ms % 1000) * 1000};
    (void)setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    (void)setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        close(s);
        return -1;
    }
    return s;
}

static bool send_all(int s, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(s, p, n, MSG_NOSIGNAL);
        if (w <= 0) {
            return false;
        }
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* Sends `req` (whole) and reads the answer to EOF: its status code, 0
 * when the daemon closed without one, -1 on timeout or error. A daemon
 * that refuses a request before it has all of it may close the connection
 * while the rest is being sent (EPIPE, ECONNRESET): what it answered
 * before, if anything, is read all the same. */
static int http_ask(int port, const char *req, size_t len, int timeout_ms)
{
    int s = tcp_connect(port, timeout_ms);
    if (s < 0) {
        return -1;
    }
    int code = -1;
    if (send_all(s, req, len) || errno == EPIPE || errno == ECONNRESET) {
        char buf[4096];
        size_t got = 0;
        for (ssize_t r;
             (r = recv(s, buf + got, sizeof buf - 1 - got, 0)) > 0;) {
            got += (size_t)r;
            if (got == sizeof buf - 1) {
                got = 32; /* keep the status line, drop the body */
            }
        }
        buf[got] = '\0';
        code = 0;
        (void)sscanf(buf, "HTTP/1.%*d %d", &code);
    }
    close(s);
    return code;
}

static int http_get(int port, const char *path, int timeout_ms)
{
    char req[256];
    int n = snprintf(req, sizeof req,
                     "GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                     path);
    return http_ask(port, req, (size_t)n, timeout_ms);
}

/* The honest engine: Lookup + Release + Stats in a loop, each round's
 * time kept. */
typedef struct honest {
    kvd_store_t *st;
    kvd_namespace_t ns;
    kvd_block_hash_t h[NKEYS];
    atomic_bool stop;
    uint32_t lat_us[LAT_MAX];
    size_t n, failed;
    pthread_t t;
} honest_t;

static void *honest_run(void *arg)
{
    honest_t *c = arg;
    while (!atomic_load(&c->stop) && c->n < LAT_MAX) {
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        kvd_store_lease_t l[NKEYS];
        size_t matched = 0;
        kvd_store_stats_t s;
        bool ok = kvd_store_lookup(c->st, &c->ns, c->h, NKEYS, l, &matched) ==
                      KVD_OK &&
                  matched == NKEYS &&
                  kvd_store_release(c->st, l, matched) == KVD_OK &&
                  kvd_store_stats(c->st, &s) == KVD_OK;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        c->failed += !ok;
        c->lat_us[c->n++] = (uint32_t)((t1.tv_sec - t0.tv_sec) * 1000000 +
                                       (t1.tv_nsec - t0.tv_nsec) / 1000);
        usleep(2000);
    }
    return NULL;
}

static void honest_start(honest_t *c, const kvd_test_dir_t *d)
{
    memset(c, 0, sizeof *c);
    atomic_init(&c->stop, false);
    assert_int_equal(client_open(d, "30s", "5s", &c->st), KVD_OK);
    keys_make(&c->ns, c->h, NKEYS, 7);
    assert_int_equal(save_objects(c->st, &c->ns, c->h, NKEYS), NKEYS);
    assert_int_equal(pthread_create(&c->t, NULL, honest_run, c), 0);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* Stops the engine; its p99 round time in µs (fails on any failed call). */
static uint32_t honest_stop(honest_t *c, const char *what)
{
    atomic_store(&c->stop, true);
    assert_int_equal(pthread_join(c->t, NULL), 0);
    kvd_store_close(c->st);
    assert_true(c->n > 10);
    qsort(c->lat_us, c->n, sizeof c->lat_us[0], cmp_u32);
    uint32_t p50 = c->lat_us[c->n / 2], p99 = c->lat_us[c->n * 99 / 100];
    printf("%s: honest Lookup+Release+Stats x%zu: p50 %u us, p99 %u us, max "
           "%u us, %zu failed\n",
           what, c->n, p50, p99, c->lat_us[c->n - 1], c->failed);
    assert_int_equal(c->failed, 0);
    return p99;
}

/* A new engine can still hand off (map the arena) and call. */
static void new_engine_served(const kvd_test_dir_t *d)
{
    kvd_store_t *st = NULL;
    uint64_t t0 = now_ms();
    assert_int_equal(client_open(d, "30s", "5s", &st), KVD_OK);
    kvd_store_stats_t s;
    assert_int_equal(kvd_store_stats(st, &s), KVD_OK);
    kvd_store_close(st);
    printf("a new engine handed off and called Stats in %llu ms\n",
           (unsigned long long)(now_ms() - t0));
}

/* Waits (5 s at most) for /healthz to answer 200 again. */
static void healthz_back(int port)
{
    uint64_t t0 = now_ms();
    while (http_get(port, "/healthz", 1000) != 200) {
        assert_true(now_ms() - t0 < 5000);
        usleep(50000);
    }
    printf("/healthz 200 again %llu ms after the attack\n",
           (unsigned long long)(now_ms() - t0));
}

static void test_slowloris_bounded(void **state)
{
    (void)state;
    struct rlimit own;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &own), 0);
    if (own.rlim_max < SLOW_CONNS + 200) {
        skip();
    }
    own.rlim_cur = own.rlim_max;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &own), 0);
    kvd_test_dir_t d;
    pid_t pid = daemon_up(&d, "http_slowloris");
    int port = metrics_port(&d);
    assert_int_equal(http_get(port, "/healthz", 2000), 200);
    honest_t *c = malloc(sizeof *c);
    assert_non_null(c);
    honest_start(c, &d);
    int fds0 = fd_count(pid);
    long rss0 = kvd_test_rss_kib(pid);
    static int s[SLOW_CONNS];
    static const char head[] = "GET /metrics HTTP/1.1\r\nX";
    for (int i = 0; i < SLOW_CONNS; i++) {
        s[i] = tcp_connect(port, 1000);
        assert_true(s[i] >= 0);
        (void)send_all(s[i], head, sizeof head - 1);
    }
    int fds_max = fds0;
    for (int round = 0; round < 5; round++) { /* ~10 s, a byte every 2 s */
        usleep(2000000);
        int open_conns = 0;
        for (int i = 0; i < SLOW_CONNS; i++) {
            open_conns += send(s[i], "x", 1, MSG_NOSIGNAL) == 1;
        }
        int fds = fd_count(pid);
        fds_max = fds > fds_max ? fds : fds_max;
        printf("round %d: %d slow connections still writable, daemon fds "
               "%d\n",
               round, open_conns, fds);
    }
    /* The endpoint itself is the one thing the attack denies: every
     * connection it holds is taken, one more is closed at accept. */
    printf("daemon fds %d before, at most %d during; RSS %+ld KiB; /healthz "
           "during: %d\n",
           fds0, fds_max, kvd_test_rss_kib(pid) - rss0,
           http_get(port, "/healthz", 1000));
    assert_true(fds_max <= fds0 + MAX_CONNS + 8);
    new_engine_served(&d);
    uint32_t p99 = honest_stop(c, "1,100 slowloris connections");
    free(c);
    assert_true(p99 < 500000);
    for (int i = 0; i < SLOW_CONNS; i++) {
        close(s[i]);
    }
    healthz_back(port);
    daemon_stop(pid);
    kvd_test_dir_remove(&d);
}

typedef struct scraper {
    int port, ok, bad;
    pthread_t t;
} scraper_t;

static void *scrape_run(void *arg)
{
    scraper_t *sc = arg;
    for (int i = 0; i < SCRAPES; i++) {
        if (http_get(sc->port, "/metrics", 5000) == 200) {
            sc->ok++;
        } else {
            sc->bad++;
        }
    }
    return NULL;
}

static void test_concurrent_scrapes(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    pid_t pid = daemon_up(&d, "http_scrapes");
    int port = metrics_port(&d);
    honest_t *c = malloc(sizeof *c);
    assert_non_null(c);
    honest_start(c, &d);
    long rss0 = kvd_test_rss_kib(pid);
    scraper_t sc[SCRAPERS];
    uint64_t t0 = now_ms();
    for (int i = 0; i < SCRAPERS; i++) {
        sc[i] = (scraper_t){.port = port};
        assert_int_equal(pthread_create(&sc[i].t, NULL, scrape_run, &sc[i]), 0);
    }
    int ok = 0, bad = 0;
    for (int i = 0; i < SCRAPERS; i++) {
        assert_int_equal(pthread_join(sc[i].t, NULL), 0);
        ok += sc[i].ok;
        bad += sc[i].bad;
    }
    uint64_t ms = now_ms() - t0;
    printf("%d scrapers: %d /metrics 200, %d other, in %llu ms (%.0f/s); "
           "RSS %+ld KiB\n",
           SCRAPERS, ok, bad, (unsigned long long)ms,
           ms ? ok * 1000.0 / (double)ms : 0.0, kvd_test_rss_kib(pid) - rss0);
    uint32_t p99 = honest_stop(c, "8 concurrent scrapers");
    free(c);
    assert_int_equal(bad, 0);
    assert_true(p99 < 500000);
    daemon_stop(pid);
    kvd_test_dir_remove(&d);
}

/* A request of `line` bytes of path or of one header: the status. */
static int huge_request(int port, size_t big, bool header)
{
    size_t cap = big + 256;
    char *req = malloc(cap);
    assert_non_null(req);
    int n = header ? snprintf(req, cap, "GET /metrics HTTP/1.1\r\nX-Big: ")
                   : snprintf(req, cap, "GET /");
    memset(req + n, 'a', big);
    n += (int)big;
    n += snprintf(req + n, cap - (size_t)n,
                  header ? "\r\n\r\n" : " HTTP/1.1\r\n\r\n");
    int code = http_ask(port, req, (size_t)n, 5000);
    free(req);
    return code;
}

/* The daemon's RSS once it stops moving (3 readings 100 ms apart within
 * 256 KiB, with the same descriptor count; at most 5 s), and its
 * descriptors then: a daemon still starting up (its threads, a slow
 * sanitizer build on a busy machine) would otherwise count its own
 * start-up in what a test's requests cost. */
static long settled_rss(pid_t pid, int *fds_out)
{
    long rss = kvd_test_rss_kib(pid);
    int fds = fd_count(pid), same = 0;
    for (int i = 0; i < 50 && same < 3; i++) {
        usleep(100000);
        long r = kvd_test_rss_kib(pid);
        int f = fd_count(pid);
        same = f == fds && labs(r - rss) < 256 ? same + 1 : 0;
        rss = r;
        fds = f;
    }
    *fds_out = fds;
    return rss;
}

static void test_huge_requests_refused(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    pid_t pid = daemon_up(&d, "http_huge");
    int port = metrics_port(&d);
    assert_int_equal(http_get(port, "/metrics", 2000), 200);
    /* One of each first: what the first connections cost the server once
     * (its pools, a thread) is not what 40 more must not cost. */
    (void)huge_request(port, 1u << 20, false);
    (void)huge_request(port, 1u << 20, true);
    int fds0 = 0;
    long rss0 = settled_rss(pid, &fds0);
    int codes[2] = {0, 0};
    for (int i = 0; i < 20; i++) {
        int line = huge_request(port, 1u << 20, false);
        int hdr = huge_request(port, 1u << 20, true);
        /* An error status, or the connection closed without one. */
        assert_true(line == 0 || line >= 400);
        assert_true(hdr == 0 || hdr >= 400);
        codes[0] = line;
        codes[1] = hdr;
    }
    usleep(200000);
    printf("40 requests with a 1 MiB line or header: answered %d / %d; "
           "RSS %+ld KiB, fds %d -> %d\n",
           codes[0], codes[1], kvd_test_rss_kib(pid) - rss0, fds0,
           fd_count(pid));
    assert_true(kvd_test_rss_kib(pid) - rss0 < 8192);
    assert_int_equal(http_get(port, "/healthz", 2000), 200);
    assert_true(fd_count(pid) <= fds0 + 1);
    daemon_stop(pid);
    kvd_test_dir_remove(&d);
}

/*
 * A daemon started from a shell with a soft limit of 1,024 (the hard one
 * higher) raises it, so 1,100 idle HTTP/2 connections on its TCP port
 * (preface and SETTINGS, then nothing; no token needed for that) do not
 * stop new engines. Before, its descriptors ran out and a new engine's
 * hand-off was never accepted.
 */
static void test_idle_grpc_connections(void **state)
{
    (void)state;
    struct rlimit own;
    assert_int_equal(getrlimit(RLIMIT_NOFILE, &own), 0);
    if (own.rlim_max < 2 * SLOW_CONNS + 200) {
        skip();
    }
    struct rlimit low = {.rlim_cur = DAEMON_NOFILE, .rlim_max = own.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &low), 0);
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "http_idle_h2");
    pid_t pid = daemon_start(&d, "server.tcp_address=127.0.0.1:0",
                             "server.token=0123456789abcdef0123456789abcdef",
                             (const char *)NULL);
    own.rlim_cur = own.rlim_max;
    assert_int_equal(setrlimit(RLIMIT_NOFILE, &own), 0);
    long soft = kvd_test_proc_long(pid, "limits", "Max open files");
    printf("daemon started with a soft limit of %d: now %ld\n", DAEMON_NOFILE,
           soft);
    int port = kvd_test_daemon_tcp_port(&d);
    honest_t *c = malloc(sizeof *c);
    assert_non_null(c);
    honest_start(c, &d);
    int fds0 = fd_count(pid);
    static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
                                  "\0\0\0\4\0\0\0\0\0"; /* + SETTINGS */
    static int s[SLOW_CONNS];
    for (int i = 0; i < SLOW_CONNS; i++) {
        s[i] = tcp_connect(port, 1000);
        assert_true(s[i] >= 0);
        assert_true(send_all(s[i], preface, sizeof preface - 1));
    }
    usleep(1000000);
    printf("1,100 idle HTTP/2 connections: daemon fds %d -> %d\n", fds0,
           fd_count(pid));
    new_engine_served(&d);
    uint32_t p99 = honest_stop(c, "1,100 idle HTTP/2 connections");
    free(c);
    assert_true(p99 < 500000);
    assert_true(soft > 2 * SLOW_CONNS);
    for (int i = 0; i < SLOW_CONNS; i++) {
        close(s[i]);
    }
    daemon_stop(pid);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_slowloris_bounded),
        cmocka_unit_test(test_concurrent_scrapes),
        cmocka_unit_test(test_huge_requests_refused),
        cmocka_unit_test(test_idle_grpc_connections),
    };
    return cmocka_run_group_tests(tests, skip_without_daemon, NULL);
}
