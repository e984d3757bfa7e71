/*
 * The UCX data plane (cluster/peer_int.h) under attack, over loopback TCP
 * (ctest sets UCX_NET_DEVICES=lo and UCX_TLS=tcp). A hostile peer here is
 * a raw UCX worker of this process (or, for the connection flood, of a
 * child process) that speaks the wire format by hand: it can send any
 * header and body, hold a rendezvous open, stop reading, or answer a FETCH
 * with fewer bytes than it announced. Each test checks what the attacked
 * node promises: it keeps serving honest peers (their lookups are timed
 * beside the attack), a stalled or truncated transfer ends with an error
 * within a bounded time, and no slot, lease or byte of the arena stays
 * pinned. The figures printed ("# ...") are the ones docs/reliability.md
 * quotes.
 */
#include <dirent.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cluster/peer_int.h"
#include "common/endian_int.h"
#include "common/time_int.h"
#include "kvdepot/store.h"
#include "tests/integration/kvd_testpeer_int.h"

#define TOKEN "attack-test-token"
#define SMALL 4096u
#define BIG (2u << 20)
#define STALL_MS 500u

static kvd_namespace_t g_ns = {
    {7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7}};

typedef struct node {
    kvd_store_t *store;
    kvd_peer_t *peer;
} node_t;

/* The worker addresses FETCHes may name (kvdepotd: its view's members):
 * every node and hostile worker this program starts. */
#define TRUSTED_MAX 16
static struct {
    pthread_mutex_t mu;
    uint8_t addr[TRUSTED_MAX][KVD_PEER_MAX_ADDRESS];
    size_t len[TRUSTED_MAX];
    size_t next;
} g_trusted = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void trust(const uint8_t *addr, size_t len)
{
    pthread_mutex_lock(&g_trusted.mu);
    size_t i = g_trusted.next++ % TRUSTED_MAX;
    memcpy(g_trusted.addr[i], addr, len);
    g_trusted.len[i] = len;
    pthread_mutex_unlock(&g_trusted.mu);
}

static bool trusted_address(void *ctx, const uint8_t *addr, size_t len)
{
    (void)ctx;
    bool ok = false;
    pthread_mutex_lock(&g_trusted.mu);
    for (size_t i = 0; i < TRUSTED_MAX && !ok; i++) {
        ok = g_trusted.len[i] == len &&
             memcmp(g_trusted.addr[i], addr, len) == 0;
    }
    pthread_mutex_unlock(&g_trusted.mu);
    return ok;
}

static void node_start(node_t *nd, const char *id, uint32_t part_bytes)
{
    memset(nd, 0, sizeof *nd);
    nd->store = kvd_test_peer_store("64m");
    char err[256] = "";
    kvd_peer_config_t pc = {.store = nd->store,
                            .node_id = id,
                            .token = TOKEN,
                            .part_bytes = part_bytes,
                            .stall_ms = STALL_MS,
                            .address_ok = trusted_address};
    kvd_status_t s = kvd_peer_start(&pc, &nd->peer, err, sizeof err);
    if (s != KVD_OK) {
        fprintf(stderr, "%s\n", err);
    }
    assert_int_equal(s, KVD_OK);
    size_t len = 0;
    const uint8_t *addr = kvd_peer_address(nd->peer, &len);
    trust(addr, len);
}

static void node_stop(node_t *nd)
{
    kvd_peer_stop(nd->peer);
    kvd_store_close(nd->store);
}

static kvd_block_hash_t key_hash(unsigned i)
{
    return kvd_test_peer_key(i, 0xa5);
}

static void put(node_t *nd, unsigned i, size_t size)
{
    kvd_block_hash_t h = key_hash(i);
    kvd_store_reservation_t r;
    assert_int_equal(kvd_store_reserve(nd->store, &g_ns, &h, 1, size, 0, &r),
                     KVD_OK);
    assert_int_equal(r.status, KVD_OK);
    uint8_t *dst = kvd_store_arena_ptr(nd->store, r.arena_offset, size);
    assert_non_null(dst);
    memset(dst, (int)(i * 7 + 1), size);
    kvd_store_key_t k = {.ns = g_ns, .hash = h};
    assert_int_equal(kvd_store_commit(nd->store, &k, 1, NULL), KVD_OK);
}

static kvd_store_stats_t store_stats(node_t *nd)
{
    kvd_store_stats_t ss;
    assert_int_equal(kvd_store_stats(nd->store, &ss), KVD_OK);
    return ss;
}

static kvd_peer_stats_t peer_stats(node_t *nd)
{
    kvd_peer_stats_t ps;
    kvd_peer_stats(nd->peer, &ps);
    return ps;
}

/* Waits up to `ms` for `nd` to hold no lease and `bytes` arena bytes. */
static bool settles(node_t *nd, uint64_t bytes, unsigned ms)
{
    uint64_t until = kvd_time_deadline_ns(ms);
    for (;;) {
        kvd_store_stats_t ss = store_stats(nd);
        if (ss.leases == 0 && ss.host.bytes == bytes) {
            return true;
        }
        if (kvd_time_now_ns() >= until) {
            fprintf(stderr, "# not settled: %llu leases, %llu bytes\n",
                    (unsigned long long)ss.leases,
                    (unsigned long long)ss.host.bytes);
            return false;
        }
        usleep(2000);
    }
}

/* `n` lookups of key `key` from `a` to `b`, each within 2 s; returns the
 * slowest in microseconds (the p99 and more of so few). */
static uint64_t honest_lookups(node_t *a, node_t *b, unsigned key, unsigned n)
{
    kvd_block_hash_t h = key_hash(key);
    uint64_t worst = 0;
    for (unsigned i = 0; i < n; i++) {
        uint64_t size = 0;
        kvd_peer_batch_t bt;
        memset(&bt, 0, sizeof bt);
        bt.address = kvd_peer_address(b->peer, &bt.address_len);
        bt.hashes = &h;
        bt.n = 1;
        bt.sizes = &size;
        uint64_t t0 = kvd_time_now_ns();
        assert_int_equal(
            kvd_peer_lookup(a->peer, &g_ns, &bt, 1, kvd_time_deadline_ns(2000)),
            KVD_OK);
        assert_int_not_equal(size, 0);
        uint64_t us = (kvd_time_now_ns() - t0) / 1000;
        worst = us > worst ? us : worst;
    }
    return worst;
}

/* Fetches key `key` of `size` bytes from `from` into `to`. */
static kvd_status_t fetch_one(node_t *to, const uint8_t *addr, size_t addr_len,
                              unsigned key, uint64_t size, unsigned ms,
                              kvd_status_t *st)
{
    kvd_block_hash_t h = key_hash(key);
    kvd_peer_batch_t bt;
    memset(&bt, 0, sizeof bt);
    bt.address = addr;
    bt.address_len = addr_len;
    bt.hashes = &h;
    bt.n = 1;
    bt.sizes = &size;
    bt.status = st;
    return kvd_peer_fetch(to->peer, &g_ns, 0, &bt, 1, kvd_time_deadline_ns(ms));
}

/* ---- the hostile peer: a raw UCX worker -----------------------------------
 */

typedef struct evil {
    ucp_context_h ctx;
    ucp_worker_h worker;
    uint8_t *addr;
    size_t addr_len;
    uint8_t auth[KVD_PEER_AUTH_BYTES];
    bool hold_rndv;  /* keep rendezvous DATA unreceived */
    void *held[256]; /* their descriptors */
    size_t n_held;
    size_t msgs, data_msgs;
    bool fetched; /* a FETCH arrived: its header and requester */
    kvd_peer_hdr_t fetch;
    uint8_t from[KVD_PEER_MAX_ADDRESS];
    size_t from_len;
} evil_t;

static ucs_status_t evil_recv(void *arg, const void *header, size_t hlen,
                              void *data, size_t len,
                              const ucp_am_recv_param_t *param)
{
    evil_t *e = arg;
    e->msgs++;
    kvd_peer_hdr_t h;
    if (kvd_peer_hdr_decode(header, hlen, len, &h) != KVD_OK) {
        return UCS_OK;
    }
    if (h.op == KVD_PEER_OP_DATA || h.op == KVD_PEER_OP_DATA_PART) {
        e->data_msgs++;
    }
    if (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) {
        if (e->hold_rndv && e->n_held < 256) {
            e->held[e->n_held++] = data;
            return UCS_INPROGRESS;
        }
        return UCS_OK;
    }
    const uint8_t *a = NULL, *ent = NULL;
    size_t alen = 0;
    if (h.op == KVD_PEER_OP_FETCH && !e->fetched &&
        kvd_peer_fetch_decode(data, len, h.count, &a, &alen, &ent) == KVD_OK) {
        e->fetch = h;
        memcpy(e->from, a, alen);
        e->from_len = alen;
        e->fetched = true;
    }
    return UCS_OK;
}

static void evil_start(evil_t *e, const char *token)
{
    memset(e, 0, sizeof *e);
    assert_int_equal(kvd_sha256(token, strlen(token), e->auth), KVD_OK);
    ucp_config_t *cfg = NULL;
    assert_int_equal(ucp_config_read(NULL, NULL, &cfg), UCS_OK);
    ucp_params_t prm;
    memset(&prm, 0, sizeof prm);
    prm.field_mask = UCP_PARAM_FIELD_FEATURES;
    prm.features = UCP_FEATURE_AM;
    assert_int_equal(ucp_init(&prm, cfg, &e->ctx), UCS_OK);
    ucp_config_release(cfg);
    ucp_worker_params_t wp;
    memset(&wp, 0, sizeof wp);
    wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wp.thread_mode = UCS_THREAD_MODE_SINGLE;
    assert_int_equal(ucp_worker_create(e->ctx, &wp, &e->worker), UCS_OK);
    ucp_worker_attr_t wa;
    memset(&wa, 0, sizeof wa);
    wa.field_mask =
        UCP_WORKER_ATTR_FIELD_ADDRESS | UCP_WORKER_ATTR_FIELD_ADDRESS_FLAGS;
    wa.address_flags = UCP_WORKER_ADDRESS_FLAG_NET_ONLY;
    assert_int_equal(ucp_worker_query(e->worker, &wa), UCS_OK);
    e->addr = malloc(wa.address_length);
    assert_non_null(e->addr);
    memcpy(e->addr, wa.address, wa.address_length);
    e->addr_len = wa.address_length;
    ucp_worker_release_address(e->worker, wa.address);
    trust(e->addr, e->addr_len);
    ucp_am_handler_param_t hp;
    memset(&hp, 0, sizeof hp);
    hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID |
                    UCP_AM_HANDLER_PARAM_FIELD_CB |
                    UCP_AM_HANDLER_PARAM_FIELD_ARG;
    hp.id = PEER_AM_ID;
    hp.cb = evil_recv;
    hp.arg = e;
    assert_int_equal(ucp_worker_set_am_recv_handler(e->worker, &hp), UCS_OK);
}

static void evil_progress(evil_t *e, unsigned ms)
{
    uint64_t until = kvd_time_deadline_ns(ms);
    do {
        while (ucp_worker_progress(e->worker) != 0) {
        }
        usleep(100);
    } while (kvd_time_now_ns() < until);
}

static void ep_failed(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)ep;
    (void)status;
    *(bool *)arg = true;
}

static bool g_ep_failed;

static ucp_ep_h evil_ep(evil_t *e, const uint8_t *addr)
{
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof ep);
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = (const ucp_address_t *)addr;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = ep_failed;
    ep.err_handler.arg = &g_ep_failed;
    ucp_ep_h h = NULL;
    assert_int_equal(ucp_ep_create(e->worker, &ep, &h), UCS_OK);
    return h;
}

static void evil_ep_close(evil_t *e, ucp_ep_h ep)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &prm);
    if (UCS_PTR_IS_PTR(r)) {
        uint64_t until = kvd_time_deadline_ns(1000);
        while (ucp_request_check_status(r) == UCS_INPROGRESS &&
               kvd_time_now_ns() < until) {
            ucp_worker_progress(e->worker);
        }
        ucp_request_free(r);
    }
}

static void evil_stop(evil_t *e)
{
    for (size_t i = 0; i < e->n_held; i++) {
        ucp_am_data_release(e->worker, e->held[i]);
    }
    evil_progress(e, 50);
    ucp_worker_destroy(e->worker);
    ucp_cleanup(e->ctx);
    free(e->addr);
}

/* Sends one message (a header of `hlen` bytes, any) and progresses until
 * UCX is done with it (2 s at most; the request is then left behind). */
static void evil_send(evil_t *e, ucp_ep_h ep, const void *hdr, size_t hlen,
                      const void *body, size_t len, uint32_t flags)
{
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof prm);
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = flags;
    ucs_status_ptr_t r =
        ucp_am_send_nbx(ep, PEER_AM_ID, hdr, hlen, body, len, &prm);
    if (UCS_PTR_IS_PTR(r)) {
        uint64_t until = kvd_time_deadline_ns(2000);
        while (ucp_request_check_status(r) == UCS_INPROGRESS &&
               kvd_time_now_ns() < until) {
            ucp_worker_progress(e->worker);
        }
        ucp_request_free(r);
    }
}

static size_t evil_hdr(const evil_t *e, uint8_t out[KVD_PEER_HDR_MAX_BYTES],
                       uint16_t op, uint64_t req_id, uint32_t count,
                       uint64_t size, uint64_t offset)
{
    kvd_peer_hdr_t h;
    memset(&h, 0, sizeof h);
    h.op = op;
    h.req_id = req_id;
    h.count = count;
    h.size = size;
    h.offset = offset;
    h.ns = g_ns;
    memcpy(h.auth, e->auth, sizeof h.auth);
    return kvd_peer_hdr_encode(&h, out);
}

/* ---- (a) malformed messages from a peer that holds the token ------------- */

typedef struct msg {
    uint8_t hdr[KVD_PEER_HDR_MAX_BYTES + 8];
    size_t hlen;
    uint8_t body[2 + KVD_PEER_MAX_ADDRESS + 64];
    size_t blen;
} msg_t;

/* A well-formed message of `op` with this peer's token: LOOKUP and FETCH
 * of an absent key (FETCH: answered to this peer's address), replies and
 * parts for an operation that does not exist, an OFFER from "evil-1". */
static void valid_msg(const evil_t *e, uint16_t op, msg_t *m)
{
    memset(m, 0, sizeof *m);
    uint32_t count = 1;
    uint64_t size = 0;
    uint8_t *b = m->body;
    switch (op) {
    case KVD_PEER_OP_LOOKUP: memset(b, 0xee, m->blen = 32); break;
    case KVD_PEER_OP_FETCH:
        kvd_put_le16(b, (uint16_t)e->addr_len);
        memcpy(b + 2, e->addr, e->addr_len);
        memset(b + 2 + e->addr_len, 0xee, 32);
        kvd_put_le64(b + 2 + e->addr_len + 32, SMALL);
        m->blen = 2 + e->addr_len + 40;
        break;
    case KVD_PEER_OP_LOOKUP_REPLY: m->blen = 8; break;
    case KVD_PEER_OP_OFFER:
        kvd_put_le16(b, 6);
        memcpy(b + 2, "evil-1", 6);
        memset(b + 8, 0xee, 32);
        kvd_put_le64(b + 40, SMALL);
        m->blen = 48;
        break;
    default: /* DATA, DATA_PART */
        count = 0;
        size = 64;
        m->blen = 64;
        break;
    }
    m->hlen = evil_hdr(e, m->hdr, op, 0x1234, count, size, 0);
}

typedef struct attack {
    evil_t *e;
    ucp_ep_h ep;
    node_t *a, *b;
    size_t inputs;
    uint64_t worst_us; /* honest lookups beside the attack */
} attack_t;

static void shoot(attack_t *at, const msg_t *m, uint32_t flags)
{
    evil_send(at->e, at->ep, m->hdr, m->hlen, m->body, m->blen,
              UCP_AM_SEND_FLAG_REPLY | flags);
    if (++at->inputs % 256 == 0) {
        uint64_t us = honest_lookups(at->a, at->b, 1, 4);
        at->worst_us = us > at->worst_us ? us : at->worst_us;
    }
}

/* Every length of header and body, every header byte set to 0xff, and
 * the counts, sizes, offsets and inner lengths that overflow. */
static void shoot_op(attack_t *at, uint16_t op)
{
    msg_t v, m;
    valid_msg(at->e, op, &v);
    shoot(at, &v, UCP_AM_SEND_FLAG_EAGER);
    shoot(at, &v, UCP_AM_SEND_FLAG_RNDV);
    for (size_t l = 0; l <= v.hlen + 1; l++) {
        m = v;
        m.hlen = l;
        shoot(at, &m, UCP_AM_SEND_FLAG_EAGER);
    }
    for (size_t l = 0; l <= v.blen + 1; l++) {
        m = v;
        m.blen = l;
        shoot(at, &m, UCP_AM_SEND_FLAG_EAGER);
    }
    for (size_t i = 0; i < v.hlen; i++) {
        m = v;
        m.hdr[i] = 0xff;
        shoot(at, &m, UCP_AM_SEND_FLAG_EAGER);
    }
    static const uint32_t counts[] = {
        0,           KVD_PEER_MAX_KEYS, KVD_PEER_MAX_KEYS + 1,
        0x80000000u, UINT32_MAX,        2};
    for (size_t i = 0; i < sizeof counts / sizeof *counts; i++) {
        m = v;
        kvd_put_le32(m.hdr + 20, counts[i]);
        shoot(at, &m, UCP_AM_SEND_FLAG_EAGER);
    }
    static const uint64_t big[] = {
        0, (UINT64_C(1) << 30) + 1, UINT64_MAX, UINT64_C(1) << 63, 63, 65};
    for (size_t i = 0; i < sizeof big / sizeof *big; i++) {
        m = v;
        kvd_put_le64(m.hdr + 24, big[i]); /* size */
        shoot(at, &m, UCP_AM_SEND_FLAG_EAGER);
        if (op == KVD_PEER_OP_DATA_PART) {
            m = v;
            kvd_put_le64(m.hdr + KVD_PEER_HDR_BYTES, big[i]); /* offset */
            shoot(at, &m, UCP_AM_SEND_FLAG_EAGER);
        }
    }
    static const uint16_t inner[] = {0, 1, 129, 1025, 0xffff};
    for (size_t i = 0; (op == KVD_PEER_OP_FETCH || op == KVD_PEER_OP_OFFER) &&
                       i < sizeof inner / sizeof *inner;
         i++) {
        m = v;
        kvd_put_le16(m.body, inner[i]); /* address or node id length */
        shoot(at, &m, UCP_AM_SEND_FLAG_EAGER);
    }
    if (op == KVD_PEER_OP_OFFER) {
        m = v;
        m.body[4] = '/';
        shoot(at, &m, UCP_AM_SEND_FLAG_EAGER);
    }
    /* The worker address the objects are to go to, damaged byte by byte
     * (the server creates an endpoint from it). */
    for (size_t i = 0; op == KVD_PEER_OP_FETCH && i < at->e->addr_len; i++) {
        m = v;
        m.body[2 + i] ^= 0xff;
        shoot(at, &m, UCP_AM_SEND_FLAG_EAGER);
    }
}

/* Random headers (valid ones with 1 to 4 random bytes, then pure noise). */
static void shoot_noise(attack_t *at, unsigned n)
{
    uint64_t x = 0x243f6a8885a308d3ull;
    for (unsigned k = 0; k < n; k++) {
        msg_t m;
        valid_msg(at->e, (uint16_t)(1 + k % 6), &m);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        if (k < n / 2) {
            for (unsigned j = 0; j <= (x & 3); j++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                m.hdr[(x >> 8) % m.hlen] = (uint8_t)(x >> 32);
            }
        } else {
            m.hlen = (size_t)(x % (sizeof m.hdr + 1));
            m.blen = (size_t)((x >> 16) % 256);
            for (size_t i = 0; i < sizeof m.hdr; i++) {
                m.hdr[i] = (uint8_t)(x >> (i % 56));
            }
            if (m.hlen >= 8) {
                kvd_put_le32(m.hdr, KVD_PEER_MAGIC);
                kvd_put_le16(m.hdr + 4, KVD_PEER_VERSION);
            }
        }
        shoot(at, &m, UCP_AM_SEND_FLAG_EAGER);
    }
}

static void test_malformed_with_token(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "node-a", 0);
    node_start(&b, "node-b", 0);
    put(&b, 1, SMALL);
    put(&b, 2, BIG);
    uint64_t base_us = honest_lookups(&a, &b, 1, 64);
    evil_t e;
    evil_start(&e, TOKEN);
    attack_t at = {.e = &e, .a = &a, .b = &b};
    at.ep = evil_ep(&e, kvd_peer_address(b.peer, &(size_t){0}));
    uint64_t t0 = kvd_time_now_ns();
    for (uint16_t op = KVD_PEER_OP_LOOKUP; op <= KVD_PEER_OP_DATA_PART; op++) {
        shoot_op(&at, op);
    }
    static const uint16_t unknown[] = {0, 7, 8, 0x7fff, 0xffff};
    for (size_t i = 0; i < sizeof unknown / sizeof *unknown; i++) {
        msg_t m;
        valid_msg(&e, KVD_PEER_OP_LOOKUP, &m);
        kvd_put_le16(m.hdr + 6, unknown[i]);
        shoot(&at, &m, UCP_AM_SEND_FLAG_EAGER);
    }
    shoot_noise(&at, 4000);
    evil_progress(&e, 100);
    double secs = (double)(kvd_time_now_ns() - t0) / 1e9;
    /* The node still serves: lookups, and a 2 MiB fetch with its bytes. */
    uint64_t after_us = honest_lookups(&a, &b, 1, 64);
    kvd_status_t st = KVD_ERR_INTERNAL;
    size_t blen = 0;
    const uint8_t *baddr = kvd_peer_address(b.peer, &blen);
    assert_int_equal(fetch_one(&a, baddr, blen, 2, BIG, 5000, &st), KVD_OK);
    assert_int_equal(st, KVD_OK);
    kvd_peer_stats_t ps = peer_stats(&b);
    fprintf(stderr,
            "# malformed: %zu inputs in %.1f s, %llu malformed, %llu "
            "auth_rejected, %llu addresses refused, %llu served; honest "
            "lookup max %llu us before, %llu us during, %llu us after\n",
            at.inputs, secs, (unsigned long long)ps.malformed,
            (unsigned long long)ps.auth_rejected,
            (unsigned long long)ps.address_refused,
            (unsigned long long)ps.requests_served, (unsigned long long)base_us,
            (unsigned long long)at.worst_us, (unsigned long long)after_us);
    assert_true(ps.malformed > at.inputs / 2);
    /* Each FETCH naming a damaged worker address was refused (UCX would
     * have aborted on some when creating an endpoint to them). */
    assert_true(ps.address_refused >= e.addr_len);
    assert_true(settles(&b, SMALL + BIG, 2000));
    evil_ep_close(&e, at.ep);
    evil_stop(&e);
    node_stop(&a);
    node_stop(&b);
}

/* ---- (b) truncated transfers: a server announces N bytes, sends fewer ---- */

typedef struct fetch_job {
    node_t *a;
    const uint8_t *addr;
    size_t addr_len;
    unsigned ms;
    kvd_status_t result, st;
    uint64_t took_ms;
    bool done; /* atomic */
} fetch_job_t;

static void *fetch_thread(void *arg)
{
    fetch_job_t *j = arg;
    uint64_t t0 = kvd_time_now_ns();
    j->result = fetch_one(j->a, j->addr, j->addr_len, 9, BIG, j->ms, &j->st);
    j->took_ms = (kvd_time_now_ns() - t0) / KVD_NSEC_PER_MSEC;
    __atomic_store_n(&j->done, true, __ATOMIC_RELEASE);
    return NULL;
}

enum { TRUNC_SILENT, TRUNC_GONE, TRUNC_SHORT_DATA, TRUNC_RNDV_STALL };

/* `a` fetches a 2 MiB key from the hostile server, which answers the way
 * `mode` says; the fetch must end with an error by its deadline (1 s),
 * and `a` must give the slot back while the server is still silent. */
static void truncated(node_t *a, node_t *honest, int mode, const char *what)
{
    evil_t e;
    evil_start(&e, TOKEN);
    fetch_job_t j = {
        .a = a, .addr = e.addr, .addr_len = e.addr_len, .ms = 1000};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, fetch_thread, &j), 0);
    uint64_t until = kvd_time_deadline_ns(2000);
    while (!e.fetched && kvd_time_now_ns() < until) {
        evil_progress(&e, 1);
    }
    assert_true(e.fetched);
    ucp_ep_h ep = evil_ep(&e, e.from);
    uint8_t hdr[KVD_PEER_HDR_MAX_BYTES];
    static uint8_t body[BIG];
    uint32_t part = (uint32_t)e.fetch.size;
    ucs_status_ptr_t rndv = NULL;
    if (mode == TRUNC_SILENT || mode == TRUNC_GONE) {
        assert_int_not_equal(part, 0);
        for (uint64_t off = 0; off < BIG / 2; off += part) {
            size_t hl = evil_hdr(&e, hdr, KVD_PEER_OP_DATA_PART, e.fetch.req_id,
                                 0, BIG, off);
            evil_send(&e, ep, hdr, hl, body + off, part,
                      UCP_AM_SEND_FLAG_EAGER);
        }
    } else if (mode == TRUNC_SHORT_DATA) {
        size_t hl =
            evil_hdr(&e, hdr, KVD_PEER_OP_DATA, e.fetch.req_id, 0, BIG, 0);
        evil_send(&e, ep, hdr, hl, body, BIG / 2, UCP_AM_SEND_FLAG_EAGER);
    } else {
        /* The connection is up (a stray reply went through); then the
         * announcement (RTS) goes out and the server takes no more turns:
         * the requester's receive waits for bytes that never come. */
        size_t hl = evil_hdr(&e, hdr, KVD_PEER_OP_LOOKUP_REPLY, 1, 1, 0, 0);
        evil_send(&e, ep, hdr, hl, body, 8, UCP_AM_SEND_FLAG_EAGER);
        hl = evil_hdr(&e, hdr, KVD_PEER_OP_DATA, e.fetch.req_id, 0, BIG, 0);
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof prm);
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = UCP_AM_SEND_FLAG_RNDV;
        rndv = ucp_am_send_nbx(ep, PEER_AM_ID, hdr, hl, body, BIG, &prm);
    }
    if (mode == TRUNC_GONE) {
        evil_ep_close(&e, ep);
        evil_stop(&e);
    }
    /* The server says nothing more (and is not progressed: it stalls). */
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_not_equal(j.st, KVD_OK);
    assert_true(j.took_ms < 1500);
    uint64_t t0 = kvd_time_now_ns();
    bool freed = settles(a, 0, 3000);
    uint64_t freed_ms = (kvd_time_now_ns() - t0) / KVD_NSEC_PER_MSEC;
    uint64_t us = honest_lookups(a, honest, 1, 16);
    fprintf(stderr,
            "# truncated (%s): fetch ended in %llu ms with %s, slot back %llu "
            "ms later, honest lookup max %llu us\n",
            what, (unsigned long long)j.took_ms, kvd_status_str(j.st),
            (unsigned long long)freed_ms, (unsigned long long)us);
    assert_true(freed);
    if (UCS_PTR_IS_PTR(rndv)) {
        ucp_request_cancel(e.worker, rndv);
        ucp_request_free(rndv);
    }
    if (mode != TRUNC_GONE) {
        evil_ep_close(&e, ep);
        evil_stop(&e);
    }
}

static void test_truncated_transfers(void **state)
{
    (void)state;
    node_t parts, whole, b;
    node_start(&parts, "node-parts", 64u << 10);
    node_start(&whole, "node-whole", 0);
    node_start(&b, "node-b", 0);
    put(&b, 1, SMALL);
    truncated(&parts, &b, TRUNC_SILENT, "half the parts, then silent");
    truncated(&parts, &b, TRUNC_GONE, "half the parts, then gone");
    truncated(&whole, &b, TRUNC_SHORT_DATA, "DATA of 1 MiB announcing 2 MiB");
    truncated(&whole, &b, TRUNC_RNDV_STALL, "rendezvous announced, stalled");
    node_stop(&parts);
    node_stop(&whole);
    node_stop(&b);
}

/* ---- (c) a requester that stalls mid-transfer ---------------------------- */

/* The hostile peer FETCHes keys 100..107 (2 MiB each) from `b`, in parts
 * of `part` bytes (0: whole, by rendezvous), then key 100 in 99 more
 * FETCHes, and then never takes them:
 * with parts it stops progressing its worker; by rendezvous it keeps the
 * announcements unreceived. An honest fetch from `b` must go on, and `b`
 * must give its leases back within its stall limit. */
static void stalled_requester(node_t *a, node_t *b, uint64_t b_bytes,
                              uint32_t part, unsigned honest_key,
                              const char *what)
{
    uint64_t stalled0 = peer_stats(b).stalled;
    evil_t e;
    evil_start(&e, TOKEN);
    e.hold_rndv = part == 0;
    size_t blen = 0;
    const uint8_t *baddr = kvd_peer_address(b->peer, &blen);
    ucp_ep_h ep = evil_ep(&e, baddr);
    enum { N = 8 };
    static uint8_t body[2 + KVD_PEER_MAX_ADDRESS + N * 40];
    kvd_put_le16(body, (uint16_t)e.addr_len);
    memcpy(body + 2, e.addr, e.addr_len);
    for (unsigned i = 0; i < N; i++) {
        kvd_block_hash_t h = key_hash(100 + i);
        memcpy(body + 2 + e.addr_len + i * 40, h.bytes, 32);
        kvd_put_le64(body + 2 + e.addr_len + i * 40 + 32, BIG);
    }
    uint8_t hdr[KVD_PEER_HDR_MAX_BYTES];
    size_t hl = evil_hdr(&e, hdr, KVD_PEER_OP_FETCH, 77, N, part, 0);
    evil_send(&e, ep, hdr, hl, body, 2 + e.addr_len + N * 40,
              UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER);
    /* And 99 more FETCHes (one key each) queued in front of the honest
     * one: the server must look past them. */
    for (unsigned k = 0; k < 99; k++) {
        hl = evil_hdr(&e, hdr, KVD_PEER_OP_FETCH, 78 + k, 1, part, 0);
        evil_send(&e, ep, hdr, hl, body, 2 + e.addr_len + 40,
                  UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER);
    }
    /* Connected, and the first bytes taken (rendezvous: announced and
     * held); then it stalls. */
    uint64_t up = kvd_time_deadline_ns(2000);
    while (e.data_msgs == 0 && kvd_time_now_ns() < up) {
        (void)ucp_worker_progress(e.worker);
    }
    assert_int_not_equal(e.data_msgs, 0);
    uint64_t t0 = kvd_time_now_ns();
    kvd_status_t st = KVD_ERR_INTERNAL;
    kvd_status_t r = fetch_one(a, baddr, blen, honest_key, BIG, 3000, &st);
    uint64_t fetch_ms = (kvd_time_now_ns() - t0) / KVD_NSEC_PER_MSEC;
    /* Still stalled (rendezvous: still holding the announcements): `b`
     * finds the stall within its limit. Rendezvous: the endpoint is
     * closed and every lease comes back. Parts: the bytes stuck on the
     * way stay until the staller reads or goes, at most its window. */
    uint64_t until = kvd_time_deadline_ns(3000);
    bool found = false;
    size_t pinned = 0;
    while (!found && kvd_time_now_ns() < until) {
        if (e.hold_rndv) {
            evil_progress(&e, 5);
        } else {
            usleep(5000);
        }
        pinned = store_stats(b).leases;
        found = peer_stats(b).stalled > stalled0 && (part != 0 || pinned == 0);
    }
    uint64_t found_ms = (kvd_time_now_ns() - t0) / KVD_NSEC_PER_MSEC;
    if (part != 0) {
        /* Found, with parts stuck: the staller asks again (without
         * reading) and gets nothing more pinned for it. */
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof prm);
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
        hl = evil_hdr(&e, hdr, KVD_PEER_OP_FETCH, 300, N, part, 0);
        ucs_status_ptr_t again = ucp_am_send_nbx(ep, PEER_AM_ID, hdr, hl, body,
                                                 2 + e.addr_len + N * 40, &prm);
        usleep(300 * 1000);
        size_t now_pinned = store_stats(b).leases;
        pinned = now_pinned > pinned ? now_pinned : pinned;
        if (UCS_PTR_IS_PTR(again)) {
            ucp_request_free(again);
        }
    }
    uint64_t us = honest_lookups(a, b, 1, 16);
    evil_ep_close(&e, ep);
    evil_stop(&e);
    uint64_t t1 = kvd_time_now_ns();
    bool freed = settles(b, b_bytes, 3000);
    uint64_t gone_ms = (kvd_time_now_ns() - t1) / KVD_NSEC_PER_MSEC;
    fprintf(stderr,
            "# stalled requester (%s): honest 2 MiB fetch %s in %llu ms; "
            "stall found after %llu ms with %zu leases still held; honest "
            "lookup max %llu us; all leases back %llu ms after the staller "
            "went; %zu objects taken or held by the staller\n",
            what, kvd_status_str(r), (unsigned long long)fetch_ms,
            (unsigned long long)found_ms, pinned, (unsigned long long)us,
            (unsigned long long)gone_ms, e.data_msgs);
    assert_int_equal(r, KVD_OK);
    assert_int_equal(st, KVD_OK);
    assert_true(fetch_ms < STALL_MS); /* not held up until the stall ends */
    assert_true(found);
    assert_true(pinned <= 2); /* the window of objects in parts */
    assert_true(freed);
}

static void test_stalled_requester(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "node-a", 0);
    node_start(&b, "node-b", 0);
    put(&b, 1, SMALL);
    for (unsigned i = 0; i < 8; i++) {
        put(&b, 100 + i, BIG);
    }
    put(&b, 30, BIG);
    put(&b, 31, BIG);
    uint64_t bytes = SMALL + 10 * (uint64_t)BIG;
    stalled_requester(&a, &b, bytes, 64u << 10, 30, "parts, stops reading");
    stalled_requester(&a, &b, bytes, 0, 31, "rendezvous held open");
    node_stop(&a);
    node_stop(&b);
}

/* ---- (d) peers without the cluster token -------------------------------- */

static size_t open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    size_t n = 0;
    while (readdir(d) != NULL) {
        n++;
    }
    closedir(d);
    return n - 3; /* ., .., the directory's own */
}

static uint64_t rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    assert_non_null(f);
    unsigned long size = 0, res = 0;
    assert_int_equal(fscanf(f, "%lu %lu", &size, &res), 2);
    fclose(f);
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE) / 1024;
}

/* A wrong token reads nothing and writes nothing: a LOOKUP and a FETCH of
 * keys `b` holds get no answer, and parts aimed at a FETCH in flight are
 * dropped. */
static void test_wrong_token_refused(void **state)
{
    (void)state;
    node_t b;
    node_start(&b, "node-b", 0);
    put(&b, 1, SMALL);
    put(&b, 2, BIG);
    evil_t e;
    evil_start(&e, "not-the-token");
    ucp_ep_h ep = evil_ep(&e, kvd_peer_address(b.peer, &(size_t){0}));
    msg_t m;
    valid_msg(&e, KVD_PEER_OP_LOOKUP, &m);
    kvd_block_hash_t h = key_hash(1);
    memcpy(m.body, h.bytes, 32);
    evil_send(&e, ep, m.hdr, m.hlen, m.body, m.blen,
              UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER);
    valid_msg(&e, KVD_PEER_OP_FETCH, &m);
    h = key_hash(2);
    memcpy(m.body + 2 + e.addr_len, h.bytes, 32);
    kvd_put_le64(m.body + 2 + e.addr_len + 32, BIG);
    evil_send(&e, ep, m.hdr, m.hlen, m.body, m.blen,
              UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER);
    for (uint16_t op = KVD_PEER_OP_LOOKUP; op <= KVD_PEER_OP_DATA_PART; op++) {
        valid_msg(&e, op, &m);
        evil_send(&e, ep, m.hdr, m.hlen, m.body, m.blen,
                  UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER);
    }
    evil_progress(&e, 300);
    kvd_peer_stats_t ps = peer_stats(&b);
    fprintf(stderr, "# wrong token: %llu messages refused, %zu answered\n",
            (unsigned long long)ps.auth_rejected, e.msgs);
    assert_int_equal(e.msgs, 0);
    assert_int_equal(ps.auth_rejected, 8);
    assert_int_equal(ps.requests_served, 0);
    assert_int_equal(ps.objects_served, 0);
    assert_int_equal(ps.offers_received, 0);
    assert_true(settles(&b, SMALL + BIG, 1000));
    evil_ep_close(&e, ep);
    evil_stop(&e);
    node_stop(&b);
}

/* --flood HEX N: this binary as N connections without the token to the
 * worker address HEX (each sends a LOOKUP); prints "ready" and keeps the
 * connections up until killed. */
static int flood_main(const char *hex, unsigned n)
{
    size_t len = strlen(hex) / 2;
    uint8_t *addr = malloc(len);
    for (size_t i = 0; i < len; i++) {
        unsigned v = 0;
        if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
            return 2;
        }
        addr[i] = (uint8_t)v;
    }
    evil_t e;
    evil_start(&e, "not-the-token");
    for (unsigned i = 0; i < n; i++) {
        ucp_ep_h ep = evil_ep(&e, addr);
        msg_t m;
        valid_msg(&e, KVD_PEER_OP_LOOKUP, &m);
        evil_send(&e, ep, m.hdr, m.hlen, m.body, m.blen,
                  UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER);
    }
    evil_progress(&e, 200);
    printf("ready\n");
    fflush(stdout);
    for (;;) {
        evil_progress(&e, 1000);
    }
}

#define FLOOD_N 500u

static void test_wrong_token_flood(void **state)
{
    (void)state;
    node_t a, b;
    node_start(&a, "node-a", 0);
    node_start(&b, "node-b", 0);
    put(&b, 1, SMALL);
    put(&b, 2, BIG);
    uint64_t base_us = honest_lookups(&a, &b, 1, 64);
    size_t fds0 = open_fds();
    uint64_t rss0 = rss_kib();
    size_t blen = 0;
    const uint8_t *baddr = kvd_peer_address(b.peer, &blen);
    char hex[2 * KVD_PEER_MAX_ADDRESS + 1], count[16];
    for (size_t i = 0; i < blen; i++) {
        snprintf(hex + 2 * i, 3, "%02x", baddr[i]);
    }
    snprintf(count, sizeof count, "%u", FLOOD_N);
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    uint64_t t0 = kvd_time_now_ns();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        execl("/proc/self/exe", "test_peer_attack", "--flood", hex, count,
              (char *)NULL);
        _exit(127);
    }
    close(fds[1]);
    FILE *f = fdopen(fds[0], "r");
    char line[16] = "";
    /* While the connections come in, the honest peer keeps asking. */
    uint64_t during_us = honest_lookups(&a, &b, 1, 32);
    assert_non_null(fgets(line, sizeof line, f));
    fclose(f);
    double flood_s = (double)(kvd_time_now_ns() - t0) / 1e9;
    uint64_t held_us = honest_lookups(&a, &b, 1, 64);
    kvd_status_t st = KVD_ERR_INTERNAL;
    assert_int_equal(fetch_one(&a, baddr, blen, 2, BIG, 3000, &st), KVD_OK);
    size_t fds1 = open_fds();
    uint64_t rss1 = rss_kib();
    kvd_peer_stats_t ps = peer_stats(&b);
    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    uint64_t until = kvd_time_deadline_ns(5000);
    while (open_fds() > fds0 + 16 && kvd_time_now_ns() < until) {
        usleep(10000);
    }
    size_t fds2 = open_fds();
    fprintf(stderr,
            "# flood: %u connections without the token in %.1f s, %llu "
            "messages refused; honest lookup max %llu us before, %llu us "
            "while connecting, %llu us while held; fds %zu -> %zu (%zu "
            "after the flood went), RSS +%llu KiB\n",
            FLOOD_N, flood_s, (unsigned long long)ps.auth_rejected,
            (unsigned long long)base_us, (unsigned long long)during_us,
            (unsigned long long)held_us, fds0, fds1, fds2,
            (unsigned long long)(rss1 > rss0 ? rss1 - rss0 : 0));
    assert_int_equal(ps.auth_rejected, FLOOD_N);
    assert_int_equal(ps.objects_served, 1);
    assert_true(fds2 <= fds0 + 16);
    node_stop(&a);
    node_stop(&b);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--flood") == 0) {
        return flood_main(argv[2], (unsigned)atoi(argv[3]));
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_malformed_with_token),
        cmocka_unit_test(test_truncated_transfers),
        cmocka_unit_test(test_stalled_requester),
        cmocka_unit_test(test_wrong_token_refused),
        cmocka_unit_test(test_wrong_token_flood),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
