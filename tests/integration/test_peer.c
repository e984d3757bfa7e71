/*
 * The UCX data plane (cluster/peer_int.h) between two embedded stores of
 * this process, over loopback TCP (ctest sets UCX_NET_DEVICES=lo and
 * UCX_TLS=tcp): LOOKUP, FETCH into the local arena with checksums, OFFER,
 * a corrupt transfer, a wrong cluster token, a dead peer, deadlines. The
 * fetch tests run twice: objects whole by rendezvous, then in DATA_PART
 * messages (parts of PARTS bytes, the last one shorter), with the parts'
 * own cases: out of order, a gap, a part size below the minimum.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

/* peer_int.h, not only peer.h: the wire codec is tested here too. */
#include "cluster/peer_int.h"
#include "common/failpoint_int.h"
#include "common/time_int.h"
#include "kvdepot/store.h"
#include "tests/integration/kvd_testpeer_int.h"
#include "store/engine.h"

#define SMALL 4096u
#define BIG (2u << 20) /* rendezvous, or 103 parts */
#define PARTS 20480u

/* The part size node_start's data planes ask for (0: rendezvous). */
static uint32_t g_part_bytes;

typedef struct node {
    kvd_store_t *store;
    kvd_peer_t *peer;
    /* what on_offer saw */
    char offer_from[KVD_PEER_MAX_NODE_ID + 1];
    size_t offer_n;
    kvd_block_hash_t offer_hash;
    uint64_t offer_size;
    uint32_t offer_tenant;
} node_t;

static kvd_namespace_t g_ns = {
    {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};

static void on_offer(void *ctx, const char *node_id, const kvd_namespace_t *ns,
                     uint32_t tenant, const kvd_block_hash_t *hashes,
                     const uint64_t *sizes, size_t n)
{
    node_t *nd = ctx;
    nd->offer_tenant = tenant;
    assert_memory_equal(ns, &g_ns, sizeof *ns);
    snprintf(nd->offer_from, sizeof nd->offer_from, "%s", node_id);
    nd->offer_hash = hashes[0];
    nd->offer_size = sizes[0];
    __atomic_store_n(&nd->offer_n, n, __ATOMIC_RELEASE);
}

static void node_start(node_t *nd, const char *id, const char *token)
{
    memset(nd, 0, sizeof *nd);
    nd->store = kvd_test_peer_store("32m");
    char err[256] = "";
    kvd_peer_config_t pc = {
        .store = nd->store,
        .node_id = id,
        .token = token,
        .on_offer = on_offer,
        .offer_ctx = nd,
        .part_bytes = g_part_bytes,
    };
    kvd_status_t s = kvd_peer_start(&pc, &nd->peer, err, sizeof err);
    if (s != KVD_OK) {
        fprintf(stderr, "%s\n", err);
    }
    assert_int_equal(s, KVD_OK);
}

static void node_stop(node_t *nd)
{
    kvd_peer_stop(nd->peer);
    kvd_store_close(nd->store);
}

static kvd_block_hash_t key_hash(unsigned i)
{
    return kvd_test_peer_key(i, 0x5a);
}

static void fill(uint8_t *p, size_t n, unsigned seed)
{
    uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        p[i] = (uint8_t)x;
    }
}

/* Saves key i with `size` pattern bytes in nd's store. */
static void put(node_t *nd, unsigned i, size_t size)
{
    kvd_block_hash_t h = key_hash(i);
    kvd_store_reservation_t r;
    assert_int_equal(kvd_store_reserve(nd->store, &g_ns, &h, 1, size, 0, &r),
                     KVD_OK);
    assert_int_equal(r.status, KVD_OK);
    uint8_t *dst = kvd_store_arena_ptr(nd->store, r.arena_offset, size);
    assert_non_null(dst);
    fill(dst, size, i);
    kvd_store_key_t k = {.ns = g_ns, .hash = h};
    assert_int_equal(kvd_store_commit(nd->store, &k, 1, NULL), KVD_OK);
}

/* True when nd holds key i with the right bytes. */
static bool holds(node_t *nd, unsigned i, size_t size)
{
    kvd_block_hash_t h = key_hash(i);
    kvd_store_lease_t l;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(nd->store, &g_ns, &h, 1, &l, &m), KVD_OK);
    if (m == 0) {
        return false;
    }
    assert_int_equal(l.size_bytes, size);
    uint8_t *want = malloc(size);
    assert_non_null(want);
    fill(want, size, i);
    bool same = memcmp(kvd_store_arena_ptr(nd->store, l.arena_offset, size),
                       want, size) == 0;
    free(want);
    assert_int_equal(kvd_store_release(nd->store, &l, 1), KVD_OK);
    return same;
}

static kvd_peer_batch_t batch_to(node_t *to, const kvd_block_hash_t *hashes,
                                 size_t n, uint64_t *sizes,
                                 kvd_status_t *status)
{
    kvd_peer_batch_t b;
    memset(&b, 0, sizeof b);
    b.address = kvd_peer_address(to->peer, &b.address_len);
    b.hashes = hashes;
    b.n = n;
    b.sizes = sizes;
    b.status = status;
    return b;
}

static void test_lookup_and_fetch(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "node-a", NULL);
    node_start(&b, "node-b", NULL);
    put(&b, 0, SMALL);
    put(&b, 1, BIG);
    put(&b, 3, BIG);
    kvd_block_hash_t hashes[4] = {key_hash(0), key_hash(1), key_hash(2),
                                  key_hash(3)};
    uint64_t sizes[4];
    kvd_status_t st[4];
    kvd_peer_batch_t bt = batch_to(&b, hashes, 4, sizes, st);
    assert_int_equal(
        kvd_peer_lookup(a.peer, &g_ns, &bt, 1, kvd_time_deadline_ns(5000)),
        KVD_OK);
    assert_int_equal(sizes[0], SMALL);
    assert_int_equal(sizes[1], BIG);
    assert_int_equal(sizes[2], 0);
    assert_int_equal(sizes[3], BIG);

    /* Fetch the three present (key 2 is skipped by its size 0). */
    assert_int_equal(
        kvd_peer_fetch(a.peer, &g_ns, 0, &bt, 1, kvd_time_deadline_ns(5000)),
        KVD_OK);
    assert_int_equal(st[0], KVD_OK);
    assert_int_equal(st[1], KVD_OK);
    assert_int_equal(st[2], KVD_ERR_INVALID);
    assert_int_equal(st[3], KVD_OK);
    assert_true(holds(&a, 0, SMALL));
    assert_true(holds(&a, 1, BIG));
    assert_true(holds(&a, 3, BIG));
    assert_false(holds(&a, 2, SMALL));

    /* Again: already here, nothing moves. */
    assert_int_equal(
        kvd_peer_fetch(a.peer, &g_ns, 0, &bt, 1, kvd_time_deadline_ns(5000)),
        KVD_OK);
    assert_int_equal(st[1], KVD_ERR_EXISTS);

    /* A key gone from the node since its LOOKUP: NOT_FOUND, slot freed. */
    kvd_block_hash_t gone = key_hash(9);
    uint64_t gone_size = SMALL;
    kvd_status_t gone_st;
    kvd_peer_batch_t gb = batch_to(&b, &gone, 1, &gone_size, &gone_st);
    assert_int_equal(
        kvd_peer_fetch(a.peer, &g_ns, 0, &gb, 1, kvd_time_deadline_ns(5000)),
        KVD_OK);
    assert_int_equal(gone_st, KVD_ERR_NOT_FOUND);
    assert_false(holds(&a, 9, SMALL));

    kvd_peer_stats_t ps;
    kvd_peer_stats(a.peer, &ps);
    assert_int_equal(ps.objects_fetched, 3);
    assert_int_equal(ps.bytes_fetched, SMALL + 2 * BIG);
    kvd_peer_stats(b.peer, &ps);
    assert_int_equal(ps.objects_served, 3);
    node_stop(&a);
    node_stop(&b);
}

static void test_corrupt_not_cached(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "node-a", "cluster-secret-0123456789");
    node_start(&b, "node-b", "cluster-secret-0123456789");
    put(&b, 5, BIG);
    kvd_block_hash_t h = key_hash(5);
    uint64_t size = BIG;
    kvd_status_t st;
    kvd_peer_batch_t bt = batch_to(&b, &h, 1, &size, &st);
    char err[128];
    assert_int_equal(kvd_failpoint_set("peer.corrupt=EIO", err, sizeof err),
                     KVD_OK);
    assert_int_equal(
        kvd_peer_fetch(a.peer, &g_ns, 0, &bt, 1, kvd_time_deadline_ns(5000)),
        KVD_OK);
    assert_int_equal(kvd_failpoint_set("", err, sizeof err), KVD_OK);
    assert_int_equal(st, KVD_ERR_CHECKSUM);
    assert_false(holds(&a, 5, BIG));
    kvd_peer_stats_t ps;
    kvd_peer_stats(a.peer, &ps);
    assert_int_equal(ps.checksum_errors, 1);
    /* The same fetch without the fault lands. */
    assert_int_equal(
        kvd_peer_fetch(a.peer, &g_ns, 0, &bt, 1, kvd_time_deadline_ns(5000)),
        KVD_OK);
    assert_int_equal(st, KVD_OK);
    assert_true(holds(&a, 5, BIG));
    node_stop(&a);
    node_stop(&b);
}

/* The checksum a verified commit kept travels with the object: the sender
 * does not hash it again, so bytes damaged in its arena after the commit
 * fail the receiver's check (before, the sender hashed the damaged bytes
 * and they were cached). A fetched object is committed with its checksum
 * too, and a plainly committed one has none (the sender hashes it). */
static void test_kept_checksum_travels(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "node-a", NULL);
    node_start(&b, "node-b", NULL);
    kvd_block_hash_t h[2] = {key_hash(7), key_hash(8)};
    uint8_t *bytes[2];
    for (unsigned i = 0; i < 2; i++) {
        kvd_store_reservation_t r;
        assert_int_equal(
            kvd_store_reserve(b.store, &g_ns, &h[i], 1, BIG, 0, &r), KVD_OK);
        bytes[i] = kvd_store_arena_ptr(b.store, r.arena_offset, BIG);
        assert_non_null(bytes[i]);
        fill(bytes[i], BIG, 7 + i);
        kvd_store_key_t k = {.ns = g_ns, .hash = h[i]};
        assert_int_equal(
            kvd_store_commit_checksum(b.store, &k, kvd_xxh3_64(bytes[i], BIG)),
            KVD_OK);
    }
    bytes[0][BIG / 2] ^= 0x40; /* damaged after its verified commit */

    uint64_t sizes[2] = {BIG, BIG};
    kvd_status_t st[2];
    kvd_peer_batch_t bt = batch_to(&b, h, 2, sizes, st);
    assert_int_equal(
        kvd_peer_fetch(a.peer, &g_ns, 0, &bt, 1, kvd_time_deadline_ns(5000)),
        KVD_OK);
    assert_int_equal(st[0], KVD_ERR_CHECKSUM);
    assert_int_equal(st[1], KVD_OK);
    assert_false(holds(&a, 7, BIG));
    assert_true(holds(&a, 8, BIG));

    /* a keeps the checksum of what it fetched; b has none for a plain
     * commit. */
    kvd_store_lease_t l;
    size_t m = 0;
    uint64_t x = 0;
    assert_int_equal(kvd_store_lookup(a.store, &g_ns, &h[1], 1, &l, &m),
                     KVD_OK);
    assert_int_equal(m, 1);
    assert_true(kvd_store_lease_checksum(a.store, &l, &x));
    assert_int_equal(
        x, kvd_xxh3_64(kvd_store_arena_ptr(a.store, l.arena_offset, BIG), BIG));
    assert_int_equal(kvd_store_release(a.store, &l, 1), KVD_OK);
    put(&b, 9, BIG);
    kvd_block_hash_t h9 = key_hash(9);
    assert_int_equal(kvd_store_lookup(b.store, &g_ns, &h9, 1, &l, &m), KVD_OK);
    assert_int_equal(m, 1);
    assert_false(kvd_store_lease_checksum(b.store, &l, &x));
    assert_int_equal(kvd_store_release(b.store, &l, 1), KVD_OK);
    node_stop(&a);
    node_stop(&b);
}

static void test_wrong_token_dropped(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "node-a", "token-of-cluster-one-xx");
    node_start(&b, "node-b", "token-of-cluster-two-yy");
    put(&b, 7, SMALL);
    kvd_block_hash_t h = key_hash(7);
    uint64_t size = 0;
    kvd_peer_batch_t bt = batch_to(&b, &h, 1, &size, NULL);
    uint64_t t0 = kvd_time_now_ns();
    assert_int_equal(
        kvd_peer_lookup(a.peer, &g_ns, &bt, 1, kvd_time_deadline_ns(300)),
        KVD_ERR_TIMEOUT);
    uint64_t took_ms = (kvd_time_now_ns() - t0) / KVD_NSEC_PER_MSEC;
    assert_true(took_ms >= 290 && took_ms < 2000);
    assert_int_equal(size, 0);
    kvd_peer_stats_t ps;
    kvd_peer_stats(b.peer, &ps);
    assert_int_equal(ps.auth_rejected, 1);
    assert_int_equal(ps.requests_served, 0);
    node_stop(&a);
    node_stop(&b);
}

static void test_dead_peer_fails_within_deadline(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "node-a", NULL);
    node_start(&b, "node-b", NULL);
    put(&b, 1, SMALL);
    size_t len = 0;
    const uint8_t *addr = kvd_peer_address(b.peer, &len);
    uint8_t *copy = malloc(len);
    assert_non_null(copy);
    memcpy(copy, addr, len);
    kvd_block_hash_t h = key_hash(1);
    uint64_t size = 0;
    kvd_peer_batch_t bt = batch_to(&b, &h, 1, &size, NULL);
    bt.address = copy;
    assert_int_equal(
        kvd_peer_lookup(a.peer, &g_ns, &bt, 1, kvd_time_deadline_ns(5000)),
        KVD_OK);
    assert_int_equal(size, SMALL);
    node_stop(&b); /* its worker and listening socket are gone */
    uint64_t t0 = kvd_time_now_ns();
    kvd_status_t s =
        kvd_peer_lookup(a.peer, &g_ns, &bt, 1, kvd_time_deadline_ns(1000));
    uint64_t took_ms = (kvd_time_now_ns() - t0) / KVD_NSEC_PER_MSEC;
    assert_true(s == KVD_ERR_PEER || s == KVD_ERR_UNREACHABLE ||
                s == KVD_ERR_TIMEOUT);
    assert_true(took_ms < 1500);
    /* A fetch from the dead node gives its slot back. */
    kvd_status_t st = KVD_OK;
    size = SMALL;
    bt.status = &st;
    s = kvd_peer_fetch(a.peer, &g_ns, 0, &bt, 1, kvd_time_deadline_ns(1000));
    assert_int_not_equal(s, KVD_OK);
    assert_int_not_equal(st, KVD_OK);
    assert_false(holds(&a, 1, SMALL));
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(a.store, &ss), KVD_OK);
    assert_int_equal(ss.host.bytes, 0);
    free(copy);
    node_stop(&a);
}

typedef struct fetch_job {
    node_t *a;
    kvd_peer_batch_t *bt;
    kvd_status_t result;
} fetch_job_t;

static void *fetch_thread(void *arg)
{
    fetch_job_t *j = arg;
    j->result = kvd_peer_fetch(j->a->peer, &g_ns, 0, j->bt, 1,
                               kvd_time_deadline_ns(5000));
    return NULL;
}

/* The serving node stops (gracefully) while 32 MiB are on their way: the
 * fetch returns, every key is either committed with the right bytes or
 * absent, and no slot stays reserved. */
static void test_peer_stops_mid_transfer(void **state)
{
    (void)state;
    enum { N = 32 };
    node_t a, b;
    node_start(&a, "node-a", NULL);
    node_start(&b, "node-b", NULL);
    kvd_block_hash_t h[N];
    uint64_t sizes[N];
    kvd_status_t st[N];
    for (unsigned i = 0; i < N; i++) {
        put(&b, 100 + i, BIG / 2);
        h[i] = key_hash(100 + i);
        sizes[i] = BIG / 2;
    }
    kvd_peer_batch_t bt = batch_to(&b, h, N, sizes, st);
    fetch_job_t j = {.a = &a, .bt = &bt, .result = KVD_OK};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fetch_thread, &j), 0);
    usleep(5000);
    uint64_t t0 = kvd_time_now_ns();
    kvd_peer_stop(b.peer); /* closes its endpoints: transfers fail */
    b.peer = NULL;
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true((kvd_time_now_ns() - t0) / KVD_NSEC_PER_MSEC < 5000);
    size_t ok = 0;
    for (unsigned i = 0; i < N; i++) {
        if (st[i] == KVD_OK) {
            ok++;
            assert_true(holds(&a, 100 + i, BIG / 2));
        } else {
            assert_false(holds(&a, 100 + i, BIG / 2));
        }
    }
    fprintf(stderr,
            "# %zu of %d objects landed before the peer went away "
            "(fetch: %s)\n",
            ok, N, kvd_status_str(j.result));
    /* Slots of transfers cut short are given back once UCX reports them. */
    kvd_store_stats_t ss;
    uint64_t until = kvd_time_deadline_ns(5000);
    do {
        assert_int_equal(kvd_store_stats(a.store, &ss), KVD_OK);
    } while (ss.host.bytes != ok * (BIG / 2) && kvd_time_now_ns() < until &&
             usleep(1000) == 0);
    assert_int_equal(ss.host.bytes, ok * (BIG / 2));
    kvd_store_close(b.store);
    node_stop(&a);
}

/* --serve: this binary as a serving node in its own process, so the test
 * can SIGKILL it. It saves `SERVE_N` objects of SERVE_BYTES (keys 200..),
 * prints its UCX address in hex and waits to be killed. */
#define SERVE_N 48
#define SERVE_BYTES (BIG / 2)

static int serve_main(void)
{
    node_t b;
    node_start(&b, "node-b", NULL);
    for (unsigned i = 0; i < SERVE_N; i++) {
        put(&b, 200 + i, SERVE_BYTES);
    }
    size_t len = 0;
    const uint8_t *addr = kvd_peer_address(b.peer, &len);
    for (size_t i = 0; i < len; i++) {
        printf("%02x", addr[i]);
    }
    printf("\n");
    fflush(stdout);
    while (pause() == -1) { /* until SIGKILL */
    }
    return 0;
}

/* The serving process is SIGKILLed while its objects are on their way: the
 * fetch returns within its deadline with the peer's failure, every key is
 * either committed with the right bytes or absent, no slot leaks. */
static void test_peer_killed_mid_transfer(void **state)
{
    (void)state;
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        execl("/proc/self/exe", "test_peer", "--serve", (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    assert_non_null(f);
    static char line[2 * 1024 + 8];
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    size_t len = strcspn(line, "\n") / 2;
    uint8_t *addr = malloc(len);
    assert_non_null(addr);
    for (size_t i = 0; i < len; i++) {
        unsigned v = 0;
        assert_int_equal(sscanf(line + 2 * i, "%2x", &v), 1);
        addr[i] = (uint8_t)v;
    }
    node_t a;
    node_start(&a, "node-a", NULL);
    kvd_block_hash_t h[SERVE_N];
    uint64_t sizes[SERVE_N];
    kvd_status_t st[SERVE_N];
    for (unsigned i = 0; i < SERVE_N; i++) {
        h[i] = key_hash(200 + i);
        sizes[i] = SERVE_BYTES;
    }
    kvd_peer_batch_t bt;
    memset(&bt, 0, sizeof bt);
    bt.address = addr;
    bt.address_len = len;
    bt.hashes = h;
    bt.n = SERVE_N;
    bt.sizes = sizes;
    bt.status = st;
    fetch_job_t j = {.a = &a, .bt = &bt, .result = KVD_OK};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fetch_thread, &j), 0);
    usleep(8000);
    uint64_t t0 = kvd_time_now_ns();
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_true((kvd_time_now_ns() - t0) / KVD_NSEC_PER_MSEC < 5000);
    size_t ok = 0;
    for (unsigned i = 0; i < SERVE_N; i++) {
        if (st[i] == KVD_OK) {
            ok++;
            assert_true(holds(&a, 200 + i, SERVE_BYTES));
        } else {
            assert_false(holds(&a, 200 + i, SERVE_BYTES));
        }
    }
    fprintf(stderr,
            "# SIGKILL mid-transfer: %zu of %d objects landed (fetch: %s)\n",
            ok, SERVE_N, kvd_status_str(j.result));
    kvd_store_stats_t ss;
    uint64_t until = kvd_time_deadline_ns(5000);
    do {
        assert_int_equal(kvd_store_stats(a.store, &ss), KVD_OK);
    } while (ss.host.bytes != ok * SERVE_BYTES && kvd_time_now_ns() < until &&
             usleep(1000) == 0);
    assert_int_equal(ss.host.bytes, ok * SERVE_BYTES);
    free(addr);
    node_stop(&a);
}

static void test_offer(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "node-a", NULL);
    node_start(&b, "node-b", NULL);
    size_t len = 0;
    const uint8_t *addr = kvd_peer_address(b.peer, &len);
    kvd_block_hash_t h = key_hash(42);
    uint64_t size = BIG;
    /* The tenant the keys were saved for travels with the offer. */
    assert_int_equal(
        kvd_peer_offer(a.peer, addr, len, &g_ns, 0xC0FFEEu, &h, &size, 1),
        KVD_OK);
    uint64_t until = kvd_time_deadline_ns(5000);
    while (__atomic_load_n(&b.offer_n, __ATOMIC_ACQUIRE) == 0 &&
           kvd_time_now_ns() < until) {
        usleep(1000);
    }
    assert_int_equal(b.offer_n, 1);
    assert_string_equal(b.offer_from, "node-a");
    assert_memory_equal(&b.offer_hash, &h, sizeof h);
    assert_int_equal(b.offer_size, BIG);
    assert_int_equal(b.offer_tenant, 0xC0FFEEu);
    assert_int_equal(kvd_peer_offer(a.peer, addr, len, &g_ns, 0, &h, &size, 0),
                     KVD_ERR_INVALID);
    node_stop(&a);
    node_stop(&b);
}

/* Parts that arrive last first land (hashed whole at the end instead of
 * as they come); a part size below the minimum is served at the minimum. */
static void test_parts_out_of_order(void **state)
{
    (void)state;
    node_t a, b;
    uint32_t saved = g_part_bytes;
    g_part_bytes = 1; /* the server sends KVD_PEER_PART_MIN */
    node_start(&a, "node-a", NULL);
    g_part_bytes = saved;
    node_start(&b, "node-b", NULL);
    put(&b, 20, BIG);
    put(&b, 21, SMALL + 1);
    kvd_block_hash_t h[2] = {key_hash(20), key_hash(21)};
    uint64_t sizes[2] = {BIG, SMALL + 1};
    kvd_status_t st[2];
    kvd_peer_batch_t bt = batch_to(&b, h, 2, sizes, st);
    char err[128];
    assert_int_equal(
        kvd_failpoint_set("peer.parts_reversed=EIO", err, sizeof err), KVD_OK);
    kvd_status_t s =
        kvd_peer_fetch(a.peer, &g_ns, 0, &bt, 1, kvd_time_deadline_ns(10000));
    assert_int_equal(kvd_failpoint_set("", err, sizeof err), KVD_OK);
    assert_int_equal(s, KVD_OK);
    assert_int_equal(st[0], KVD_OK);
    assert_int_equal(st[1], KVD_OK);
    assert_true(holds(&a, 20, BIG));
    assert_true(holds(&a, 21, SMALL + 1));
    kvd_peer_stats_t ps;
    kvd_peer_stats(a.peer, &ps);
    assert_int_equal(ps.checksum_errors, 0);
    node_stop(&a);
    node_stop(&b);
}

/* The first part sent again instead of the last: as many bytes arrive as
 * the object has, but not all of it; the check finds the hole, the object
 * is not cached and its slot goes back. */
static void test_parts_gap_detected(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "node-a", NULL);
    node_start(&b, "node-b", NULL);
    put(&b, 22, BIG);
    kvd_block_hash_t h = key_hash(22);
    uint64_t size = BIG;
    kvd_status_t st;
    kvd_peer_batch_t bt = batch_to(&b, &h, 1, &size, &st);
    char err[128];
    assert_int_equal(kvd_failpoint_set("peer.parts_gap=EIO", err, sizeof err),
                     KVD_OK);
    assert_int_equal(
        kvd_peer_fetch(a.peer, &g_ns, 0, &bt, 1, kvd_time_deadline_ns(5000)),
        KVD_OK);
    assert_int_equal(kvd_failpoint_set("", err, sizeof err), KVD_OK);
    assert_int_equal(st, KVD_ERR_CHECKSUM);
    assert_false(holds(&a, 22, BIG));
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(a.store, &ss), KVD_OK);
    assert_int_equal(ss.host.bytes, 0);
    /* Without the fault it lands. */
    assert_int_equal(
        kvd_peer_fetch(a.peer, &g_ns, 0, &bt, 1, kvd_time_deadline_ns(5000)),
        KVD_OK);
    assert_int_equal(st, KVD_OK);
    assert_true(holds(&a, 22, BIG));
    node_stop(&a);
    node_stop(&b);
}

static int parts_on(void **state)
{
    (void)state;
    g_part_bytes = PARTS;
    return 0;
}

static int parts_off(void **state)
{
    (void)state;
    g_part_bytes = 0;
    return 0;
}

static void test_wire_rejects_bad_headers(void **state)
{
    (void)state;
    kvd_peer_hdr_t h, out;
    memset(&h, 0, sizeof h);
    h.op = KVD_PEER_OP_LOOKUP;
    h.count = 2;
    uint8_t buf[KVD_PEER_HDR_MAX_BYTES];
    kvd_peer_hdr_encode(&h, buf);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES, 64, &out),
                     KVD_OK);
    assert_int_equal(out.count, 2);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES, 63, &out),
                     KVD_ERR_PROTO);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES - 1, 64, &out),
                     KVD_ERR_PROTO);
    h.count = KVD_PEER_MAX_KEYS + 1;
    kvd_peer_hdr_encode(&h, buf);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES,
                                         (size_t)h.count * 32, &out),
                     KVD_ERR_PROTO);
    h.op = 99;
    h.count = 1;
    kvd_peer_hdr_encode(&h, buf);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES, 32, &out),
                     KVD_ERR_PROTO);
    h.op = KVD_PEER_OP_DATA;
    h.count = 0;
    h.size = 100;
    kvd_peer_hdr_encode(&h, buf);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES, 100, &out),
                     KVD_OK);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES, 99, &out),
                     KVD_ERR_PROTO);
    buf[0] ^= 1; /* magic */
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES, 100, &out),
                     KVD_ERR_PROTO);
    /* OFFER: size carries the tenant, a 32-bit id. */
    h.op = KVD_PEER_OP_OFFER;
    h.count = 1;
    h.size = UINT32_MAX;
    kvd_peer_hdr_encode(&h, buf);
    assert_int_equal(
        kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES, 2 + 6 + 40, &out), KVD_OK);
    assert_int_equal(out.size, UINT32_MAX);
    h.size = (uint64_t)UINT32_MAX + 1;
    kvd_peer_hdr_encode(&h, buf);
    assert_int_equal(
        kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES, 2 + 6 + 40, &out),
        KVD_ERR_PROTO);

    /* DATA_PART: a 96-byte header (the offset last), 1+ bytes inside the
     * object, never a status; the other ops keep 88 bytes. */
    h.op = KVD_PEER_OP_DATA_PART;
    h.count = 3;
    h.size = 100;
    h.offset = 60;
    assert_int_equal(kvd_peer_hdr_encode(&h, buf), KVD_PEER_PART_HDR_BYTES);
    assert_int_equal(
        kvd_peer_hdr_decode(buf, KVD_PEER_PART_HDR_BYTES, 40, &out), KVD_OK);
    assert_int_equal(out.offset, 60);
    assert_int_equal(out.count, 3);
    assert_int_equal(
        kvd_peer_hdr_decode(buf, KVD_PEER_PART_HDR_BYTES, 41, &out),
        KVD_ERR_PROTO); /* past the end */
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_PART_HDR_BYTES, 0, &out),
                     KVD_ERR_PROTO);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_HDR_BYTES, 40, &out),
                     KVD_ERR_PROTO); /* no offset */
    h.offset = 100;
    kvd_peer_hdr_encode(&h, buf);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_PART_HDR_BYTES, 1, &out),
                     KVD_ERR_PROTO);
    h.offset = UINT64_MAX;
    kvd_peer_hdr_encode(&h, buf);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_PART_HDR_BYTES, 1, &out),
                     KVD_ERR_PROTO);
    h.offset = 0;
    h.status = KVD_ERR_NOT_FOUND;
    kvd_peer_hdr_encode(&h, buf);
    assert_int_equal(kvd_peer_hdr_decode(buf, KVD_PEER_PART_HDR_BYTES, 1, &out),
                     KVD_ERR_PROTO);
    h.status = KVD_OK;
    h.op = KVD_PEER_OP_DATA;
    assert_int_equal(kvd_peer_hdr_encode(&h, buf), KVD_PEER_HDR_BYTES);
    assert_int_equal(
        kvd_peer_hdr_decode(buf, KVD_PEER_PART_HDR_BYTES, 100, &out),
        KVD_ERR_PROTO); /* only DATA_PART has the longer header */

    uint8_t body[2 + 6 + 40];
    body[0] = 6;
    body[1] = 0;
    memcpy(body + 2, "node-1", 6);
    char id[KVD_PEER_MAX_NODE_ID + 1];
    const uint8_t *entries = NULL;
    assert_int_equal(kvd_peer_offer_decode(body, sizeof body, 1, id, &entries),
                     KVD_OK);
    assert_string_equal(id, "node-1");
    assert_ptr_equal(entries, body + 8);
    body[4] = '/';
    assert_int_equal(kvd_peer_offer_decode(body, sizeof body, 1, id, &entries),
                     KVD_ERR_PROTO);
    assert_int_equal(
        kvd_peer_offer_decode(body, sizeof body - 1, 1, id, &entries),
        KVD_ERR_PROTO);
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--serve") == 0) {
        return serve_main();
    }
    if (getenv("UCX_NET_DEVICES") == NULL) {
        /* Loopback only (tests/README.md), also when run by hand. */
        setenv("UCX_NET_DEVICES", "lo", 1);
        setenv("UCX_TLS", "tcp", 1);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_rejects_bad_headers),
        cmocka_unit_test(test_lookup_and_fetch),
        cmocka_unit_test(test_corrupt_not_cached),
        cmocka_unit_test(test_kept_checksum_travels),
        cmocka_unit_test(test_wrong_token_dropped),
        cmocka_unit_test(test_dead_peer_fails_within_deadline),
        cmocka_unit_test(test_offer),
        cmocka_unit_test(test_peer_stops_mid_transfer),
        cmocka_unit_test(test_peer_killed_mid_transfer),
    };
    const struct CMUnitTest parts[] = {
        cmocka_unit_test(test_lookup_and_fetch),
        cmocka_unit_test(test_corrupt_not_cached),
        cmocka_unit_test(test_kept_checksum_travels),
        cmocka_unit_test(test_dead_peer_fails_within_deadline),
        cmocka_unit_test(test_peer_stops_mid_transfer),
        cmocka_unit_test(test_peer_killed_mid_transfer),
        cmocka_unit_test(test_parts_out_of_order),
        cmocka_unit_test(test_parts_gap_detected),
    };
    int failed = cmocka_run_group_tests_name("rendezvous", tests, NULL, NULL);
    failed += cmocka_run_group_tests_name("parts", parts, parts_on, parts_off);
    return failed;
}
