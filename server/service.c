/*
 * The KvStore service over an embedded store (service_int.h). Requests are
 * unpacked and validated by proto/ before anything here reads them; every
 * response is built from stack or malloc'd arrays and packed (which
 * validates it again, so a bug here cannot send an invalid message).
 *
 * Ordering rules:
 *   - `mu` guards the two tables and the records in them. Store calls that
 *     may wait (reserve, which can wait for write-back) or that touch many
 *     keys before we know the outcome (lookup) run without `mu`; the record
 *     is inserted afterwards, so a concurrent call cannot see it half-made.
 *   - A record leaves its table before its store leases are given back, and
 *     a lease record with gets still in flight is freed by the housekeeping
 *     thread when the last one completes (`dead`), so a completion never
 *     finds freed memory.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "proto/kvd_proto.h"
#include "store/engine.h"
#include "server/service_int.h"

#define SVC_BUCKETS 4096u
#define SVC_POLL_BATCH 64u

const uint64_t kvd_service_latency_bounds_us[KVD_SERVICE_LATENCY_BUCKETS] = {
    25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000, 100000, UINT64_MAX};

static const struct {
    const char *path;
    const char *name;
} svc_methods[KVD_RPC_COUNT] = {
    {"/kvdepot.v1.KvStore/Lookup", "Lookup"},
    {"/kvdepot.v1.KvStore/Reserve", "Reserve"},
    {"/kvdepot.v1.KvStore/Commit", "Commit"},
    {"/kvdepot.v1.KvStore/Abort", "Abort"},
    {"/kvdepot.v1.KvStore/Release", "Release"},
    {"/kvdepot.v1.KvStore/Get", "Get"},
    {"/kvdepot.v1.KvStore/Promote", "Promote"},
    {"/kvdepot.v1.KvStore/Stats", "Stats"},
    {"/kvdepot.v1.KvStore/Admin", "Admin"},
    {"/kvdepot.v1.KvStore/Delete", "Delete"},
};

const char *kvd_rpc_method_path(kvd_rpc_method_t method)
{
    return (unsigned)method < KVD_RPC_COUNT ? svc_methods[method].path : NULL;
}

const char *kvd_rpc_method_name(kvd_rpc_method_t method)
{
    return (unsigned)method < KVD_RPC_COUNT ? svc_methods[method].name : NULL;
}

int kvd_rpc_method_find(const char *path, size_t len)
{
    if (path == NULL) {
        return -1;
    }
    for (int m = 0; m < KVD_RPC_COUNT; m++) {
        if (strlen(svc_methods[m].path) == len &&
            memcmp(svc_methods[m].path, path, len) == 0) {
            return m;
        }
    }
    return -1;
}

/* ---- records ------------------------------------------------------------ */

enum svc_block_state {
    SVC_HELD = 0,    /* `lease` is a store lease we hold */
    SVC_PENDING = 1, /* a store get is in flight for it */
    SVC_FAILED = 2,  /* the get failed; nothing held; `status` says why */
};

typedef struct svc_lease svc_lease_t;

typedef struct svc_block {
    kvd_store_lease_t lease;
    svc_lease_t *owner;
    uint8_t state;
    bool in_slab; /* part of the record's slab, not allocated alone */
    kvd_status_t status;
} svc_block_t;

struct svc_lease {
    svc_lease_t *next;
    uint64_t id;
    uint64_t deadline_ns;
    uint32_t ttl_ms;
    kvd_namespace_t ns;
    size_t n, cap;
    svc_block_t **blocks; /* stable addresses: gets point at them */
    svc_block_t *slab;    /* the blocks a Lookup leased, in one allocation */
    uint32_t pending;     /* store gets in flight */
    bool dead;            /* out of the table; free when pending is 0 */
    bool promote;         /* Promote's: give each block back when loaded */
    bool in_table;
    uint32_t tenant; /* the creator's bound tenant (0: none) */
    uint64_t bytes;  /* object bytes of its blocks (the tenant's count) */
};

enum svc_key_state { SVC_RESERVED = 0, SVC_DONE = 1 };

typedef struct svc_resv_key {
    kvd_block_hash_t hash;
    uint64_t offset;
    uint8_t state;
} svc_resv_key_t;

typedef struct svc_resv {
    struct svc_resv *next;
    uint64_t id;
    uint64_t deadline_ns;
    kvd_namespace_t ns;
    uint64_t object_bytes;
    size_t n, open; /* keys, and those still reserved */
    size_t cursor;  /* where the next commit entry is probably */
    svc_resv_key_t *keys;
    uint32_t tenant;       /* the creator's bound tenant (0: none) */
    uint32_t store_tenant; /* the store tenant its slots were taken for */
} svc_resv_t;

struct kvd_service {
    kvd_service_config_t cfg;
    char node_id[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
    kvd_store_t *store;
    uint64_t started_ns;

    pthread_mutex_t mu;
    svc_lease_t *leases[SVC_BUCKETS];
    svc_resv_t *resvs[SVC_BUCKETS];
    svc_lease_t *graveyard; /* dead records waiting for their gets */
    uint64_t next_id;       /* lease and reservation ids, never 0 */
    uint64_t n_leases, n_leased_blocks, n_resvs;
    /* Object bytes each tenant holds leased (records in the table). */
    struct svc_held {
        uint32_t tenant;
        uint64_t bytes;
    } * held;
    size_t n_held, cap_held;

    pthread_t thread;
    bool thread_started;
    bool stopping; /* atomic */
    bool draining; /* atomic: Reserve refuses while set */

    /* Counters (atomic, relaxed). */
    kvd_service_method_stats_t m[KVD_RPC_COUNT];
    uint64_t errors_by_status[KVD_SERVICE_ERROR_KINDS];
    uint64_t leases_expired, resvs_expired, checksum_errors;
    uint64_t leases_refused;
};

static void count(uint64_t *c, uint64_t v)
{
    __atomic_fetch_add(c, v, __ATOMIC_RELAXED);
}

static uint64_t svc_id_new(kvd_service_t *svc)
{
    /* `mu` held. Ids start at a random point so a restarted daemon does
     * not hand out ids a client still holds from its predecessor. */
    uint64_t id = ++svc->next_id;
    if (id == 0) {
        id = ++svc->next_id;
    }
    return id;
}

static size_t svc_bucket(uint64_t id)
{
    return (size_t)((id * 0x9E3779B97F4A7C15ull) >> 52) % SVC_BUCKETS;
}

/* The caller's tenant as its credentials say, for the handler running on
 * this thread (NULL: the request's own), and its id (0 with none);
 * kvd_service_call sets both around the handler. */
static _Thread_local const char *svc_caller_tenant;
static _Thread_local uint32_t svc_caller_id;

static uint32_t svc_tenant_id(const char *tenant)
{
    if (tenant == NULL || tenant[0] == '\0') {
        return 0;
    }
    uint32_t t = (uint32_t)kvd_xxh3_64(tenant, strlen(tenant));
    return t == 0 ? 1 : t;
}

uint32_t kvd_service_tenant_id(const char *tenant)
{
    return svc_tenant_id(tenant);
}

/* Whether this thread's caller may use a lease or reservation its creator
 * (bound to `owner`, 0: none) made: callers bound to a tenant use their
 * tenant's only (ids are sequential, so they could be guessed); an
 * unbound caller is an operator. */
static bool svc_owns(uint32_t owner)
{
    return svc_caller_tenant == NULL || owner == svc_caller_id;
}

/* A lease by id, if this thread's caller may use it. */
static svc_lease_t *lease_find(kvd_service_t *svc, uint64_t id)
{
    for (svc_lease_t *l = svc->leases[svc_bucket(id)]; l != NULL; l = l->next) {
        if (l->id == id) {
            return svc_owns(l->tenant) ? l : NULL;
        }
    }
    return NULL;
}

/* What `tenant` holds leased (`mu` held). */
static struct svc_held *held_of(kvd_service_t *svc, uint32_t tenant,
                                bool create)
{
    for (size_t i = 0; i < svc->n_held; i++) {
        if (svc->held[i].tenant == tenant) {
            return &svc->held[i];
        }
    }
    if (!create) {
        return NULL;
    }
    if (svc->n_held == svc->cap_held) {
        size_t cap = svc->cap_held ? 2 * svc->cap_held : 16;
        struct svc_held *h = realloc(svc->held, cap * sizeof *h);
        if (h == NULL) {
            return NULL; /* not counted: the cap is best effort */
        }
        svc->held = h;
        svc->cap_held = cap;
    }
    svc->held[svc->n_held] = (struct svc_held){.tenant = tenant, .bytes = 0};
    return &svc->held[svc->n_held++];
}

static void held_add(kvd_service_t *svc, uint32_t tenant, uint64_t bytes,
                     bool add)
{
    struct svc_held *h = held_of(svc, tenant, add);
    if (h != NULL) {
        h->bytes = add                ? h->bytes + bytes
                   : h->bytes > bytes ? h->bytes - bytes
                                      : 0;
    }
}

/* Bytes `tenant` may still lease under server.tenant_max_leased
 * (UINT64_MAX: no limit). `mu` held. */
static uint64_t held_room(kvd_service_t *svc, uint32_t tenant)
{
    uint64_t cap = svc->cfg.tenant_max_leased_bytes;
    if (cap == 0) {
        return UINT64_MAX;
    }
    struct svc_held *h = held_of(svc, tenant, false);
    uint64_t used = h != NULL ? h->bytes : 0;
    return used < cap ? cap - used : 0;
}

static void lease_insert(kvd_service_t *svc, svc_lease_t *l)
{
    size_t b = svc_bucket(l->id);
    l->next = svc->leases[b];
    svc->leases[b] = l;
    l->in_table = true;
    svc->n_leases++;
    svc->n_leased_blocks += l->n;
    held_add(svc, l->tenant, l->bytes, true);
}

static void lease_unlink(kvd_service_t *svc, svc_lease_t *l)
{
    svc_lease_t **pp = &svc->leases[svc_bucket(l->id)];
    while (*pp != l) {
        pp = &(*pp)->next;
    }
    *pp = l->next;
    l->next = NULL;
    l->in_table = false;
    svc->n_leases--;
    svc->n_leased_blocks -= l->n;
    held_add(svc, l->tenant, l->bytes, false);
}

static void lease_free(svc_lease_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        if (!l->blocks[i]->in_slab) {
            free(l->blocks[i]);
        }
    }
    free(l->slab);
    free(l->blocks);
    free(l);
}

/* Fills a new record with `m` held store leases in two allocations (a
 * Lookup's batch; later Gets add blocks one by one). */
static kvd_status_t lease_fill(svc_lease_t *l, const kvd_store_lease_t *sl,
                               size_t m)
{
    l->slab = calloc(m, sizeof *l->slab);
    l->blocks = malloc(m * sizeof *l->blocks);
    if (l->slab == NULL || l->blocks == NULL) {
        free(l->slab);
        free(l->blocks);
        l->slab = NULL;
        l->blocks = NULL;
        return KVD_ERR_NOMEM;
    }
    for (size_t i = 0; i < m; i++) {
        svc_block_t *b = &l->slab[i];
        b->lease = sl[i];
        b->owner = l;
        b->state = SVC_HELD;
        b->in_slab = true;
        l->blocks[i] = b;
        l->bytes += sl[i].size_bytes;
    }
    l->n = l->cap = m;
    return KVD_OK;
}

static svc_lease_t *lease_new(const kvd_namespace_t *ns, uint32_t ttl_ms)
{
    svc_lease_t *l = calloc(1, sizeof *l);
    if (l != NULL) {
        l->ns = *ns;
        l->ttl_ms = ttl_ms;
        l->deadline_ns = kvd_time_now_ns() + (uint64_t)ttl_ms * 1000000u;
    }
    return l;
}

/* Appends a held store lease; KVD_ERR_NOMEM leaves `l` as it was. */
static kvd_status_t lease_add(svc_lease_t *l, const kvd_store_lease_t *sl)
{
    if (l->n == l->cap) {
        size_t cap = l->cap == 0 ? 8 : l->cap * 2;
        svc_block_t **b = realloc(l->blocks, cap * sizeof *b);
        if (b == NULL) {
            return KVD_ERR_NOMEM;
        }
        l->blocks = b;
        l->cap = cap;
    }
    svc_block_t *blk = calloc(1, sizeof *blk);
    if (blk == NULL) {
        return KVD_ERR_NOMEM;
    }
    blk->lease = *sl;
    blk->owner = l;
    blk->state = SVC_HELD;
    l->blocks[l->n++] = blk;
    l->bytes += sl->size_bytes;
    return KVD_OK;
}

/* Gives back what an out-of-table record holds; frees it unless gets are
 * in flight (then the housekeeping thread frees it). `mu` held. */
static void lease_drop(kvd_service_t *svc, svc_lease_t *l)
{
    /* Back to the store in batches: one table lock per batch, not one per
     * block. */
    kvd_store_lease_t batch[64];
    size_t k = 0;
    for (size_t i = 0; i < l->n; i++) {
        svc_block_t *b = l->blocks[i];
        if (b->state == SVC_HELD) {
            batch[k++] = b->lease;
            b->state = SVC_FAILED;
            b->status = KVD_ERR_CANCELED;
        }
        if (k == sizeof batch / sizeof batch[0] || (i + 1 == l->n && k > 0)) {
            (void)kvd_store_release(svc->store, batch, k);
            k = 0;
        }
    }
    if (l->pending > 0) {
        l->dead = true;
        l->next = svc->graveyard;
        svc->graveyard = l;
        return;
    }
    lease_free(l);
}

static svc_resv_t *resv_find(kvd_service_t *svc, uint64_t id)
{
    for (svc_resv_t *r = svc->resvs[svc_bucket(id)]; r != NULL; r = r->next) {
        if (r->id == id) {
            return r;
        }
    }
    return NULL;
}

static void resv_unlink(kvd_service_t *svc, svc_resv_t *r)
{
    svc_resv_t **pp = &svc->resvs[svc_bucket(r->id)];
    while (*pp != r) {
        pp = &(*pp)->next;
    }
    *pp = r->next;
    svc->n_resvs--;
}

static void resv_free(svc_resv_t *r)
{
    if (r != NULL) {
        free(r->keys);
        free(r);
    }
}

/* Aborts every key still reserved. `mu` held. */
static void resv_abort_open(kvd_service_t *svc, svc_resv_t *r)
{
    for (size_t i = 0; i < r->n; i++) {
        if (r->keys[i].state == SVC_RESERVED) {
            kvd_store_key_t k = {.ns = r->ns, .hash = r->keys[i].hash};
            (void)kvd_store_abort(svc->store, &k, 1, NULL);
            r->keys[i].state = SVC_DONE;
        }
    }
    r->open = 0;
}

/* ---- helpers ------------------------------------------------------------ */

/* The request's hashes as one array (proto/ checked each is 32 bytes). */
static kvd_block_hash_t *svc_hashes(const ProtobufCBinaryData *src, size_t n)
{
    kvd_block_hash_t *h = malloc((n ? n : 1) * sizeof *h);
    if (h != NULL) {
        for (size_t i = 0; i < n; i++) {
            memcpy(h[i].bytes, src[i].data, sizeof h[i].bytes);
        }
    }
    return h;
}

/* The request's namespace as the store knows it. A caller bound to a
 * tenant gets its own copy of every namespace: the first 16 bytes of
 * SHA-256("kvdepot tenant namespace", tenant, namespace), so knowing
 * another tenant's namespace and hashes finds none of its objects (no
 * lookup hit, no "exists" on reserve) and never collides with them. */
static kvd_status_t svc_ns(const ProtobufCBinaryData *src, kvd_namespace_t *ns,
                           char *reason, size_t reason_len)
{
    memcpy(ns->bytes, src->data, sizeof ns->bytes);
    const char *tenant = svc_caller_tenant;
    if (tenant == NULL) {
        return KVD_OK;
    }
    static const char tag[] = "kvdepot tenant namespace";
    size_t tlen = strnlen(tenant, KVD_PROTO_MAX_ID_BYTES);
    uint8_t buf[sizeof tag + KVD_PROTO_MAX_ID_BYTES + 1 + sizeof ns->bytes];
    uint8_t digest[KVD_SHA256_BYTES];
    size_t n = 0;
    memcpy(buf, tag, sizeof tag); /* with its NUL: a separator */
    n += sizeof tag;
    memcpy(buf + n, tenant, tlen); /* names are bounded by the config */
    n += tlen;
    buf[n++] = 0;
    memcpy(buf + n, ns->bytes, sizeof ns->bytes);
    n += sizeof ns->bytes;
    kvd_status_t s = kvd_sha256(buf, n, digest);
    if (s != KVD_OK) {
        kvd_config_err(reason, reason_len, "tenant %s's namespace: %s", tenant,
                       kvd_status_str(s));
        return s;
    }
    memcpy(ns->bytes, digest, sizeof ns->bytes);
    return KVD_OK;
}

static Kvdepot__V1__Tier svc_tier(uint32_t tier)
{
    return tier == KVD_STORE_TIER_HOST ? KVDEPOT__V1__TIER__TIER_HOST
                                       : KVDEPOT__V1__TIER__TIER_DISK;
}

static kvd_status_t svc_pack(kvd_proto_msg_t type, const ProtobufCMessage *msg,
                             uint8_t **out, size_t *len, char *reason,
                             size_t reason_len)
{
    kvd_status_t s =
        kvd_proto_pack_alloc(type, msg, out, len, reason, reason_len);
    if (s == KVD_ERR_PROTO) {
        /* Our own response failed validation: a bug here, not the
         * caller's fault. */
        KVD_LOG_ERROR("service: invalid %s built: %s", kvd_proto_msg_name(type),
                      reason);
        return KVD_ERR_INTERNAL;
    }
    return s;
}

static uint32_t svc_ttl(uint32_t asked, uint32_t dflt)
{
    return asked != 0 ? asked : dflt;
}

/* Ends the leases named (unknown ids are skipped); returns how many were
 * held. */
static uint32_t svc_release_ids(kvd_service_t *svc, const uint64_t *ids,
                                size_t n)
{
    uint32_t released = 0;
    pthread_mutex_lock(&svc->mu);
    for (size_t i = 0; i < n; i++) {
        svc_lease_t *l = lease_find(svc, ids[i]);
        if (l != NULL) {
            lease_unlink(svc, l);
            lease_drop(svc, l);
            released++;
        }
    }
    pthread_mutex_unlock(&svc->mu);
    return released;
}

/* ---- Lookup ------------------------------------------------------------- */

static kvd_status_t svc_lookup(kvd_service_t *svc, const uint8_t *req,
                               size_t len, uint8_t **out, size_t *out_len,
                               char *reason, size_t reason_len)
{
    kvd_pb_lookup_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_lookup_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    if (rq->n_release_lease_ids > 0) {
        (void)svc_release_ids(svc, rq->release_lease_ids,
                              rq->n_release_lease_ids);
    }
    size_t n = rq->n_block_hashes, m = 0;
    kvd_namespace_t ns;
    s = svc_ns(&rq->namespace_id, &ns, reason, reason_len);
    if (s != KVD_OK) {
        kvd_proto_lookup_request_free(rq);
        return s;
    }
    kvd_block_hash_t *hashes;
    if (n == 0) { /* the packed form (proto/ checked its length) */
        n = rq->packed_hashes.len / sizeof(kvd_block_hash_t);
        hashes = malloc(n * sizeof *hashes);
        if (hashes != NULL) {
            memcpy(hashes, rq->packed_hashes.data, n * sizeof *hashes);
        }
    } else {
        hashes = svc_hashes(rq->block_hashes, n);
    }
    kvd_store_lease_t *leases = malloc(n * sizeof *leases);
    kvd_pb_block_location_t *locs = calloc(n, sizeof *locs);
    kvd_pb_block_location_t **locp = calloc(n, sizeof *locp);
    uint64_t *packed = NULL;
    svc_lease_t *rec = NULL;
    if (hashes == NULL || leases == NULL || locs == NULL || locp == NULL) {
        s = KVD_ERR_NOMEM;
        goto out;
    }
    s = kvd_store_lookup(svc->store, &ns, hashes, n, leases, &m);
    if (s == KVD_OK && m < n && rq->include_remote && svc->cfg.miss != NULL &&
        svc->cfg.miss(svc->cfg.cluster_ctx, &ns, hashes + m, n - m,
                      rq->source_node, svc_caller_id) > 0) {
        /* Other nodes had more of the chain; it is here now. */
        (void)kvd_store_release(svc->store, leases, m);
        m = 0;
        s = kvd_store_lookup(svc->store, &ns, hashes, n, leases, &m);
    }
    if (s != KVD_OK) {
        goto out;
    }
    if (m > 0 && rq->lease_ttl_ms > 0 && svc->cfg.tenant_max_leased_bytes) {
        /* The tenant's leases stay under its cap: the prefix that fits is
         * matched, the rest given back (the engine computes it). */
        pthread_mutex_lock(&svc->mu);
        uint64_t room = held_room(svc, svc_caller_id);
        pthread_mutex_unlock(&svc->mu);
        size_t k = 0;
        while (k < m && leases[k].size_bytes <= room) {
            room -= leases[k++].size_bytes;
        }
        if (k < m) {
            (void)kvd_store_release(svc->store, leases + k, m - k);
            count(&svc->leases_refused, m - k);
            m = k;
        }
    }
    kvd_pb_lookup_response_t rsp = KVDEPOT__V1__LOOKUP_RESPONSE__INIT;
    if (rq->packed_locations) {
        /* Three packed arrays instead of m sub-messages; `locs` and `locp`
         * are big enough to hold them (n >= m entries of >= 8 bytes). */
        Kvdepot__V1__Tier *tiers = (Kvdepot__V1__Tier *)(void *)locp;
        uint64_t *offsets = malloc(2 * (m ? m : 1) * sizeof *offsets);
        if (offsets == NULL) {
            s = KVD_ERR_NOMEM;
            goto out;
        }
        packed = offsets;
        for (size_t i = 0; i < m; i++) {
            tiers[i] = svc_tier(leases[i].tier);
            offsets[i] = leases[i].tier == KVD_STORE_TIER_HOST
                             ? leases[i].arena_offset
                             : 0;
            offsets[m + i] = leases[i].size_bytes;
        }
        rsp.n_tiers = rsp.n_arena_offsets = rsp.n_sizes = m;
        rsp.tiers = tiers;
        rsp.arena_offsets = offsets;
        rsp.sizes = offsets + m;
    } else {
        for (size_t i = 0; i < m; i++) {
            kvdepot__v1__block_location__init(&locs[i]);
            locs[i].tier = svc_tier(leases[i].tier);
            locs[i].size_bytes = leases[i].size_bytes;
            if (leases[i].tier == KVD_STORE_TIER_HOST) {
                locs[i].arena_offset = leases[i].arena_offset;
            }
            locp[i] = &locs[i];
        }
        rsp.n_locations = m;
        rsp.locations = locp;
    }
    if (m > 0 && rq->lease_ttl_ms > 0) {
        rec = lease_new(&ns, rq->lease_ttl_ms);
        if (rec == NULL || lease_fill(rec, leases, m) != KVD_OK) {
            s = KVD_ERR_NOMEM;
            goto out;
        }
        /* Once in the table the record belongs to it: the housekeeping
         * thread may expire and free it as soon as `mu` is released, so
         * nothing below touches `rec` again. */
        pthread_mutex_lock(&svc->mu);
        rec->id = svc_id_new(svc);
        rec->tenant = svc_caller_id;
        rsp.lease_id = rec->id;
        lease_insert(svc, rec);
        pthread_mutex_unlock(&svc->mu);
        rec = NULL;
        rsp.lease_ttl_ms = rq->lease_ttl_ms;
        m = 0; /* the record holds them now */
    }
    s = svc_pack(KVD_PROTO_MSG_LOOKUP_RESPONSE, &rsp.base, out, out_len, reason,
                 reason_len);
    if (s != KVD_OK && rsp.lease_id != 0) {
        pthread_mutex_lock(&svc->mu);
        svc_lease_t *l = lease_find(svc, rsp.lease_id);
        if (l != NULL) {
            lease_unlink(svc, l);
            lease_drop(svc, l);
        }
        pthread_mutex_unlock(&svc->mu);
    }
out:
    if (rec != NULL) {
        lease_free(rec);
    }
    if (m > 0) {
        /* Probes (ttl 0) and failures give the leases back at once. */
        (void)kvd_store_release(svc->store, leases, m);
    }
    free(packed);
    free(locp);
    free(locs);
    free(leases);
    free(hashes);
    kvd_proto_lookup_request_free(rq);
    return s;
}

/* ---- Reserve / Commit / Abort ------------------------------------------- */

static Kvdepot__V1__ReserveOutcome svc_outcome(kvd_status_t s)
{
    if (s == KVD_OK) {
        return KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED;
    }
    if (s == KVD_ERR_EXISTS) {
        return KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_EXISTS;
    }
    return KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_REJECTED;
}

static kvd_status_t svc_reserve(kvd_service_t *svc, const uint8_t *req,
                                size_t len, uint8_t **out, size_t *out_len,
                                char *reason, size_t reason_len)
{
    kvd_pb_reserve_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_reserve_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    size_t n = rq->n_block_hashes;
    kvd_namespace_t ns;
    s = svc_ns(&rq->namespace_id, &ns, reason, reason_len);
    if (s != KVD_OK) {
        kvd_proto_reserve_request_free(rq);
        return s;
    }
    kvd_block_hash_t *hashes = svc_hashes(rq->block_hashes, n);
    kvd_store_reservation_t *res = calloc(n, sizeof *res);
    kvd_pb_block_reservation_t *blocks = calloc(n, sizeof *blocks);
    kvd_pb_block_reservation_t **bp = calloc(n, sizeof *bp);
    svc_resv_t *rec = calloc(1, sizeof *rec);
    if (rec != NULL) {
        rec->keys = calloc(n, sizeof *rec->keys);
    }
    bool reserved_any = false;
    if (hashes == NULL || res == NULL || blocks == NULL || bp == NULL ||
        rec == NULL || rec->keys == NULL) {
        s = KVD_ERR_NOMEM;
        goto out;
    }
    if (__atomic_load_n(&svc->draining, __ATOMIC_ACQUIRE)) {
        /* Draining for a restart: no new saves (REJECTED = skip). */
        for (size_t i = 0; i < n; i++) {
            res[i].status = KVD_ERR_BUSY;
        }
    } else {
        const char *tenant =
            svc_caller_tenant != NULL ? svc_caller_tenant : rq->tenant;
        rec->store_tenant = svc_tenant_id(tenant);
        s = kvd_store_reserve(svc->store, &ns, hashes, n, rq->object_size_bytes,
                              rec->store_tenant, res);
    }
    if (s != KVD_OK) {
        kvd_config_err(reason, reason_len, "object_size_bytes %llu: %s",
                       (unsigned long long)rq->object_size_bytes,
                       kvd_status_str(s));
        goto out;
    }
    uint32_t ttl = svc_ttl(rq->ttl_ms, svc->cfg.reservation_ttl_ms);
    rec->ns = ns;
    rec->object_bytes = rq->object_size_bytes;
    rec->deadline_ns = kvd_time_now_ns() + (uint64_t)ttl * 1000000u;
    kvd_pb_reserve_response_t rsp = KVDEPOT__V1__RESERVE_RESPONSE__INIT;
    for (size_t i = 0; i < n; i++) {
        kvdepot__v1__block_reservation__init(&blocks[i]);
        blocks[i].block_hash = rq->block_hashes[i];
        blocks[i].outcome = svc_outcome(res[i].status);
        if (blocks[i].outcome ==
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_REJECTED) {
            blocks[i].status = (int32_t)res[i].status;
        }
        if (res[i].status == KVD_OK) {
            blocks[i].arena_offset = res[i].arena_offset;
            svc_resv_key_t *k = &rec->keys[rec->n++];
            k->hash = hashes[i];
            k->offset = res[i].arena_offset;
            k->state = SVC_RESERVED;
            reserved_any = true;
        }
        bp[i] = &blocks[i];
    }
    rec->open = rec->n;
    rsp.n_blocks = n;
    rsp.blocks = bp;
    if (reserved_any) {
        rsp.ttl_ms = ttl;
        pthread_mutex_lock(&svc->mu);
        rec->id = svc_id_new(svc);
        rec->tenant = svc_caller_id;
        size_t b = svc_bucket(rec->id);
        rec->next = svc->resvs[b];
        svc->resvs[b] = rec;
        svc->n_resvs++;
        rsp.reservation_id = rec->id;
        s = svc_pack(KVD_PROTO_MSG_RESERVE_RESPONSE, &rsp.base, out, out_len,
                     reason, reason_len);
        if (s != KVD_OK) {
            resv_unlink(svc, rec);
            resv_abort_open(svc, rec);
            resv_free(rec);
        }
        pthread_mutex_unlock(&svc->mu);
        rec = NULL;
    } else {
        s = svc_pack(KVD_PROTO_MSG_RESERVE_RESPONSE, &rsp.base, out, out_len,
                     reason, reason_len);
    }
out:
    if (rec != NULL && rec->n > 0) {
        pthread_mutex_lock(&svc->mu);
        resv_abort_open(svc, rec);
        pthread_mutex_unlock(&svc->mu);
    }
    resv_free(rec);
    free(bp);
    free(blocks);
    free(res);
    free(hashes);
    kvd_proto_reserve_request_free(rq);
    return s;
}

/* Takes `mu` and returns reservation `id`; or, when there is none, writes
 * why into `reason` and returns NULL with `mu` released. */
static svc_resv_t *resv_lock(kvd_service_t *svc, uint64_t id, char *reason,
                             size_t reason_len)
{
    pthread_mutex_lock(&svc->mu);
    svc_resv_t *r = resv_find(svc, id);
    if (r != NULL && !svc_owns(r->tenant)) {
        r = NULL;
    }
    if (r == NULL) {
        pthread_mutex_unlock(&svc->mu);
        kvd_config_err(reason, reason_len,
                       "reservation_id %llu: unknown, expired or done",
                       (unsigned long long)id);
    }
    return r;
}

/* The reservation's key for `hash`, or NULL. `mu` held. */
static svc_resv_key_t *resv_key(svc_resv_t *r, const uint8_t *hash)
{
    for (size_t k = 0; k < r->n; k++) {
        size_t i = (r->cursor + k) % r->n;
        if (memcmp(r->keys[i].hash.bytes, hash, KVD_SHA256_BYTES) == 0) {
            r->cursor = i + 1;
            return &r->keys[i];
        }
    }
    return NULL;
}

/* Removes a reservation with nothing left open. `mu` held. */
static void resv_maybe_done(kvd_service_t *svc, svc_resv_t *r)
{
    if (r->open == 0) {
        resv_unlink(svc, r);
        resv_free(r);
    }
}

static kvd_status_t svc_commit(kvd_service_t *svc, const uint8_t *req,
                               size_t len, uint8_t **out, size_t *out_len,
                               char *reason, size_t reason_len)
{
    kvd_pb_commit_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_commit_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    size_t n = rq->n_entries;
    int32_t *statuses = calloc(n, sizeof *statuses);
    if (statuses == NULL) {
        kvd_proto_commit_request_free(rq);
        return KVD_ERR_NOMEM;
    }
    uint32_t committed = 0;
    kvd_block_hash_t *saved =
        svc->cfg.saved != NULL ? malloc(n * sizeof *saved) : NULL;
    svc_resv_t *r = resv_lock(svc, rq->reservation_id, reason, reason_len);
    if (r == NULL) {
        free(saved);
        free(statuses);
        kvd_proto_commit_request_free(rq);
        return KVD_ERR_NOT_FOUND;
    }
    for (size_t i = 0; i < n; i++) {
        const kvd_pb_commit_entry_t *e = rq->entries[i];
        svc_resv_key_t *k = resv_key(r, e->block_hash.data);
        if (k == NULL || k->state != SVC_RESERVED) {
            statuses[i] = KVD_ERR_NOT_FOUND;
            continue;
        }
        kvd_store_key_t key = {.ns = r->ns, .hash = k->hash};
        kvd_status_t ks = KVD_OK;
        bool verified = false;
        if (svc->cfg.verify_commits && e->n_layer_checksums == 1) {
            const void *p =
                kvd_store_arena_ptr(svc->store, k->offset, r->object_bytes);
            if (p == NULL ||
                kvd_xxh3_64(p, r->object_bytes) != e->layer_checksums[0]) {
                ks = KVD_ERR_CHECKSUM;
                count(&svc->checksum_errors, 1);
                (void)kvd_store_abort(svc->store, &key, 1, NULL);
            } else {
                verified = true;
            }
        }
        /* A verified checksum is kept with the object (the cluster data
         * plane sends it with the bytes instead of hashing them again). */
        if (ks == KVD_OK) {
            ks = verified ? kvd_store_commit_checksum(svc->store, &key,
                                                      e->layer_checksums[0])
                          : kvd_store_commit(svc->store, &key, 1, NULL);
        }
        k->state = SVC_DONE;
        r->open--;
        statuses[i] = (int32_t)ks;
        if (ks == KVD_OK && saved != NULL) {
            saved[committed] = k->hash;
        }
        committed += ks == KVD_OK;
    }
    kvd_namespace_t ns = r->ns;
    uint64_t object_bytes = r->object_bytes;
    uint32_t store_tenant = r->store_tenant;
    resv_maybe_done(svc, r);
    pthread_mutex_unlock(&svc->mu);
    if (saved != NULL && committed > 0) {
        svc->cfg.saved(svc->cfg.cluster_ctx, &ns, saved, committed,
                       object_bytes, store_tenant);
    }
    free(saved);

    kvd_pb_commit_response_t rsp = KVDEPOT__V1__COMMIT_RESPONSE__INIT;
    rsp.num_committed = committed;
    rsp.n_statuses = n;
    rsp.statuses = statuses;
    s = svc_pack(KVD_PROTO_MSG_COMMIT_RESPONSE, &rsp.base, out, out_len, reason,
                 reason_len);
    free(statuses);
    kvd_proto_commit_request_free(rq);
    return s;
}

static kvd_status_t svc_abort(kvd_service_t *svc, const uint8_t *req,
                              size_t len, uint8_t **out, size_t *out_len,
                              char *reason, size_t reason_len)
{
    kvd_pb_abort_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_abort_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    uint32_t aborted = 0;
    svc_resv_t *r = resv_lock(svc, rq->reservation_id, reason, reason_len);
    if (r == NULL) {
        kvd_proto_abort_request_free(rq);
        return KVD_ERR_NOT_FOUND;
    }
    if (rq->n_block_hashes == 0) {
        aborted = (uint32_t)r->open;
        resv_abort_open(svc, r);
    } else {
        for (size_t i = 0; i < rq->n_block_hashes; i++) {
            svc_resv_key_t *k = resv_key(r, rq->block_hashes[i].data);
            if (k == NULL || k->state != SVC_RESERVED) {
                continue;
            }
            kvd_store_key_t key = {.ns = r->ns, .hash = k->hash};
            (void)kvd_store_abort(svc->store, &key, 1, NULL);
            k->state = SVC_DONE;
            r->open--;
            aborted++;
        }
    }
    resv_maybe_done(svc, r);
    pthread_mutex_unlock(&svc->mu);
    kvd_pb_abort_response_t rsp = KVDEPOT__V1__ABORT_RESPONSE__INIT;
    rsp.num_aborted = aborted;
    s = svc_pack(KVD_PROTO_MSG_ABORT_RESPONSE, &rsp.base, out, out_len, reason,
                 reason_len);
    kvd_proto_abort_request_free(rq);
    return s;
}

/* ---- Release ------------------------------------------------------------ */

static kvd_status_t svc_release(kvd_service_t *svc, const uint8_t *req,
                                size_t len, uint8_t **out, size_t *out_len,
                                char *reason, size_t reason_len)
{
    kvd_pb_release_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_release_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    uint32_t released = svc_release_ids(svc, rq->lease_ids, rq->n_lease_ids);
    kvd_pb_release_response_t rsp = KVDEPOT__V1__RELEASE_RESPONSE__INIT;
    rsp.num_released = released;
    s = svc_pack(KVD_PROTO_MSG_RELEASE_RESPONSE, &rsp.base, out, out_len,
                 reason, reason_len);
    kvd_proto_release_request_free(rq);
    return s;
}

/* ---- Get / Promote ------------------------------------------------------ */

/* The record's block for `hash`, or NULL. `mu` held. */
static svc_block_t *lease_block(svc_lease_t *l, const uint8_t *hash)
{
    for (size_t i = 0; i < l->n; i++) {
        if (memcmp(l->blocks[i]->lease.key.hash.bytes, hash,
                   KVD_SHA256_BYTES) == 0) {
            return l->blocks[i];
        }
    }
    return NULL;
}

/* Takes a store lease on one key into `l`; false if stored nowhere. `mu`
 * held (lookup of one key is an in-memory probe). */
static bool lease_take_one(kvd_service_t *svc, svc_lease_t *l,
                           const kvd_block_hash_t *hash, kvd_status_t *err)
{
    kvd_store_lease_t sl;
    size_t m = 0;
    if (kvd_store_lookup(svc->store, &l->ns, hash, 1, &sl, &m) != KVD_OK ||
        m == 0) {
        return false;
    }
    if (sl.size_bytes > held_room(svc, l->tenant)) {
        (void)kvd_store_release(svc->store, &sl, 1);
        count(&svc->leases_refused, 1);
        *err = KVD_ERR_QUOTA;
        return false;
    }
    *err = lease_add(l, &sl);
    if (*err != KVD_OK) {
        (void)kvd_store_release(svc->store, &sl, 1);
        return false;
    }
    if (l->in_table) {
        svc->n_leased_blocks++;
        held_add(svc, l->tenant, sl.size_bytes, true);
    }
    return true;
}

/* Starts the store get of a DISK block. `mu` held. */
static void block_fetch(kvd_service_t *svc, svc_block_t *b)
{
    kvd_store_get_t g = {.lease = b->lease,
                         .user_data = (uint64_t)(uintptr_t)b};
    size_t accepted = 0;
    kvd_status_t s = kvd_store_get_submit(svc->store, &g, 1, &accepted);
    if (s == KVD_OK && accepted == 1) {
        b->state = SVC_PENDING;
        b->owner->pending++;
    } else if (s != KVD_OK && s != KVD_ERR_BUSY) {
        (void)kvd_store_release(svc->store, &b->lease, 1);
        b->state = SVC_FAILED;
        b->status = s;
    }
    /* KVD_ERR_BUSY or nothing accepted: stays HELD on disk, PENDING to the
     * caller, submitted again on its next Get. */
}

static kvd_status_t svc_get(kvd_service_t *svc, const uint8_t *req, size_t len,
                            uint8_t **out, size_t *out_len, char *reason,
                            size_t reason_len)
{
    kvd_pb_get_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_get_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    size_t n = rq->n_block_hashes;
    kvd_namespace_t ns;
    s = svc_ns(&rq->namespace_id, &ns, reason, reason_len);
    if (s != KVD_OK) {
        kvd_proto_get_request_free(rq);
        return s;
    }
    uint32_t ttl = svc_ttl(rq->lease_ttl_ms, svc->cfg.lease_ttl_ms);
    kvd_pb_get_entry_t *ents = calloc(n, sizeof *ents);
    kvd_pb_get_entry_t **ep = calloc(n, sizeof *ep);
    if (ents == NULL || ep == NULL) {
        free(ents);
        free(ep);
        kvd_proto_get_request_free(rq);
        return KVD_ERR_NOMEM;
    }
    pthread_mutex_lock(&svc->mu);
    svc_lease_t *l = NULL;
    bool fresh = false;
    if (rq->lease_id != 0) {
        l = lease_find(svc, rq->lease_id);
        if (l == NULL || memcmp(&l->ns, &ns, sizeof ns) != 0) {
            pthread_mutex_unlock(&svc->mu);
            kvd_config_err(reason, reason_len,
                           "lease_id %llu: unknown, expired, released or of "
                           "another namespace",
                           (unsigned long long)rq->lease_id);
            s = KVD_ERR_NOT_FOUND;
            goto out;
        }
        l->ttl_ms = ttl;
    } else {
        l = lease_new(&ns, ttl);
        if (l == NULL) {
            pthread_mutex_unlock(&svc->mu);
            s = KVD_ERR_NOMEM;
            goto out;
        }
        l->id = svc_id_new(svc);
        l->tenant = svc_caller_id;
        fresh = true;
    }
    l->deadline_ns = kvd_time_now_ns() + (uint64_t)ttl * 1000000u;
    bool any_held = false;
    for (size_t i = 0; i < n; i++) {
        kvd_pb_get_entry_t *e = &ents[i];
        kvdepot__v1__get_entry__init(e);
        ep[i] = e;
        e->block_hash = rq->block_hashes[i];
        svc_block_t *b = lease_block(l, rq->block_hashes[i].data);
        if (b == NULL) {
            kvd_block_hash_t h;
            memcpy(h.bytes, rq->block_hashes[i].data, sizeof h.bytes);
            kvd_status_t ts = KVD_OK;
            if (lease_take_one(svc, l, &h, &ts)) {
                b = l->blocks[l->n - 1];
            } else if (ts != KVD_OK) {
                e->state = KVDEPOT__V1__GET_STATE__GET_STATE_FAILED;
                e->status = ts;
                continue;
            }
        }
        if (b == NULL) {
            e->state = KVDEPOT__V1__GET_STATE__GET_STATE_MISSING;
            continue;
        }
        if (b->state == SVC_HELD && b->lease.tier == KVD_STORE_TIER_DISK) {
            block_fetch(svc, b);
        }
        if (b->state == SVC_HELD && b->lease.tier == KVD_STORE_TIER_HOST) {
            e->state = KVDEPOT__V1__GET_STATE__GET_STATE_READY;
            e->arena_offset = b->lease.arena_offset;
            e->size_bytes = b->lease.size_bytes;
            any_held = true;
        } else if (b->state == SVC_FAILED) {
            e->state = KVDEPOT__V1__GET_STATE__GET_STATE_FAILED;
            e->status = b->status;
        } else {
            e->state = KVDEPOT__V1__GET_STATE__GET_STATE_PENDING;
            any_held = true;
        }
    }
    kvd_pb_get_response_t rsp = KVDEPOT__V1__GET_RESPONSE__INIT;
    rsp.n_entries = n;
    rsp.entries = ep;
    if (fresh) {
        if (any_held) {
            lease_insert(svc, l);
        } else {
            lease_drop(svc, l);
            l = NULL;
        }
    }
    /* The reply names the lease only when it covers one of its entries
     * (GetResponse.lease_id): a lease whose every asked block failed is
     * still open for its other blocks, but not part of this answer. */
    if (l != NULL && any_held) {
        rsp.lease_id = l->id;
        rsp.lease_ttl_ms = ttl;
    }
    pthread_mutex_unlock(&svc->mu);
    s = svc_pack(KVD_PROTO_MSG_GET_RESPONSE, &rsp.base, out, out_len, reason,
                 reason_len);
out:
    free(ep);
    free(ents);
    kvd_proto_get_request_free(rq);
    return s;
}

static kvd_status_t svc_promote(kvd_service_t *svc, const uint8_t *req,
                                size_t len, uint8_t **out, size_t *out_len,
                                char *reason, size_t reason_len)
{
    kvd_pb_promote_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_promote_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    uint32_t accepted = 0;
    kvd_namespace_t ns;
    s = svc_ns(&rq->namespace_id, &ns, reason, reason_len);
    if (s != KVD_OK) {
        kvd_proto_promote_request_free(rq);
        return s;
    }
    /* Only promotion into the arena exists: the disk tier already keeps
     * what write-back admits, so TIER_DISK accepts nothing. */
    if (rq->target_tier == KVDEPOT__V1__TIER__TIER_HOST) {
        pthread_mutex_lock(&svc->mu);
        svc_lease_t *l = lease_new(&ns, svc->cfg.lease_ttl_ms);
        if (l == NULL) {
            pthread_mutex_unlock(&svc->mu);
            kvd_proto_promote_request_free(rq);
            return KVD_ERR_NOMEM;
        }
        l->id = svc_id_new(svc);
        l->tenant = svc_caller_id;
        l->promote = true;
        for (size_t i = 0; i < rq->n_block_hashes; i++) {
            kvd_block_hash_t h;
            memcpy(h.bytes, rq->block_hashes[i].data, sizeof h.bytes);
            kvd_status_t ts = KVD_OK;
            if (!lease_take_one(svc, l, &h, &ts)) {
                continue;
            }
            svc_block_t *b = l->blocks[l->n - 1];
            if (b->lease.tier == KVD_STORE_TIER_DISK) {
                block_fetch(svc, b);
                accepted += b->state == SVC_PENDING;
            }
        }
        /* Promote leases are never named by a client: out of the table at
         * once; the completion releases each block. */
        lease_drop(svc, l);
        pthread_mutex_unlock(&svc->mu);
    }
    kvd_pb_promote_response_t rsp = KVDEPOT__V1__PROMOTE_RESPONSE__INIT;
    rsp.num_accepted = accepted;
    s = svc_pack(KVD_PROTO_MSG_PROMOTE_RESPONSE, &rsp.base, out, out_len,
                 reason, reason_len);
    kvd_proto_promote_request_free(rq);
    return s;
}

/* ---- listing and dropping namespaces ------------------------------------ */

#define SVC_SCAN_CHUNK 1024u

typedef struct svc_listing {
    kvd_pb_list_namespaces_reply_t reply;
    kvd_pb_namespace_usage_t *ns;
    kvd_pb_namespace_usage_t **nsp;
    kvd_pb_tenant_usage_t *tn;
    kvd_pb_tenant_usage_t **tnp;
    uint8_t *ns_ids; /* 16 bytes per namespace */
} svc_listing_t;

static void svc_listing_init(svc_listing_t *l)
{
    memset(l, 0, sizeof *l);
    kvdepot__v1__list_namespaces_reply__init(&l->reply);
}

static void svc_listing_free(svc_listing_t *l)
{
    free(l->ns);
    free(l->nsp);
    free(l->tn);
    free(l->tnp);
    free(l->ns_ids);
}

/* Aggregates every stored object per namespace and per tenant. The scan
 * takes the tables' locks a chunk at a time, never `mu`. */
static kvd_status_t svc_list(kvd_service_t *svc, svc_listing_t *l,
                             const uint32_t *only_tenant)
{
    const size_t cap = KVD_PROTO_MAX_NAMESPACES;
    kvd_store_object_t *chunk = malloc(SVC_SCAN_CHUNK * sizeof *chunk);
    l->ns = calloc(cap, sizeof *l->ns);
    l->nsp = calloc(cap, sizeof *l->nsp);
    l->tn = calloc(cap, sizeof *l->tn);
    l->tnp = calloc(cap, sizeof *l->tnp);
    l->ns_ids = calloc(cap, KVD_NAMESPACE_BYTES);
    if (chunk == NULL || l->ns == NULL || l->nsp == NULL || l->tn == NULL ||
        l->tnp == NULL || l->ns_ids == NULL) {
        free(chunk);
        return KVD_ERR_NOMEM;
    }
    size_t nn = 0, nt = 0, last_ns = 0;
    uint64_t cursor = 0;
    kvd_status_t s;
    for (;;) {
        size_t got = 0;
        s = kvd_store_scan(svc->store, &cursor, chunk, SVC_SCAN_CHUNK, &got);
        if (s != KVD_OK) {
            break;
        }
        for (size_t i = 0; i < got; i++) {
            const kvd_store_object_t *o = &chunk[i];
            if (only_tenant != NULL && o->tenant != *only_tenant) {
                continue;
            }
            /* Objects of one namespace tend to come in runs. */
            size_t k = last_ns;
            if (k >= nn || memcmp(l->ns_ids + k * KVD_NAMESPACE_BYTES,
                                  o->key.ns.bytes, KVD_NAMESPACE_BYTES) != 0) {
                for (k = 0; k < nn; k++) {
                    if (memcmp(l->ns_ids + k * KVD_NAMESPACE_BYTES,
                               o->key.ns.bytes, KVD_NAMESPACE_BYTES) == 0) {
                        break;
                    }
                }
            }
            if (k == nn && nn < cap) {
                memcpy(l->ns_ids + nn * KVD_NAMESPACE_BYTES, o->key.ns.bytes,
                       KVD_NAMESPACE_BYTES);
                kvdepot__v1__namespace_usage__init(&l->ns[nn]);
                l->ns[nn].namespace_id.data =
                    l->ns_ids + nn * KVD_NAMESPACE_BYTES;
                l->ns[nn].namespace_id.len = KVD_NAMESPACE_BYTES;
                l->nsp[nn] = &l->ns[nn];
                nn++;
            }
            if (k < nn) {
                last_ns = k;
                if (o->tier == KVD_STORE_TIER_HOST) {
                    l->ns[k].host_objects++;
                } else {
                    l->ns[k].disk_objects++;
                }
                l->ns[k].bytes += o->size_bytes;
            } else {
                l->reply.truncated = true;
            }
            size_t t = 0;
            while (t < nt && l->tn[t].tenant_id != o->tenant) {
                t++;
            }
            if (t == nt && nt < cap) {
                kvdepot__v1__tenant_usage__init(&l->tn[nt]);
                l->tn[nt].tenant_id = o->tenant;
                l->tnp[nt] = &l->tn[nt];
                nt++;
            }
            if (t < nt) {
                l->tn[t].objects++;
                l->tn[t].bytes += o->size_bytes;
            } else {
                l->reply.truncated = true;
            }
        }
        if (got < SVC_SCAN_CHUNK) {
            break;
        }
    }
    free(chunk);
    l->reply.n_namespaces = nn;
    l->reply.namespaces = l->nsp;
    l->reply.n_tenants = nt;
    l->reply.tenants = l->tnp;
    return s;
}

/* Deletes every object of `ns` (NULL: of every namespace) that
 * `only_tenant` (NULL: any) saved, in both tiers; leased or half-written
 * ones stay (they are counted out of *dropped). */
static kvd_status_t svc_drop_objects(kvd_service_t *svc,
                                     const kvd_namespace_t *ns,
                                     const uint32_t *only_tenant,
                                     uint64_t *dropped)
{
    kvd_store_object_t *chunk = malloc(SVC_SCAN_CHUNK * sizeof *chunk);
    kvd_store_key_t *keys = malloc(SVC_SCAN_CHUNK * sizeof *keys);
    if (chunk == NULL || keys == NULL) {
        free(chunk);
        free(keys);
        return KVD_ERR_NOMEM;
    }
    uint64_t cursor = 0;
    kvd_status_t s;
    *dropped = 0;
    /* Deleting while scanning is fine: the scan's cursor is a table
     * position, and a removed entry is simply not seen again. */
    for (;;) {
        size_t got = 0, k = 0;
        s = kvd_store_scan(svc->store, &cursor, chunk, SVC_SCAN_CHUNK, &got);
        if (s != KVD_OK) {
            break;
        }
        for (size_t i = 0; i < got; i++) {
            if ((ns == NULL || memcmp(chunk[i].key.ns.bytes, ns->bytes,
                                      sizeof ns->bytes) == 0) &&
                (only_tenant == NULL || chunk[i].tenant == *only_tenant)) {
                keys[k++] = chunk[i].key;
            }
        }
        size_t del = 0;
        kvd_status_t ds =
            k > 0 ? kvd_store_delete(svc->store, keys, k, &del) : KVD_OK;
        *dropped += del;
        if (ds != KVD_OK && ds != KVD_ERR_BUSY) {
            s = ds;
            break;
        }
        if (got < SVC_SCAN_CHUNK) {
            break;
        }
    }
    free(keys);
    free(chunk);
    return s;
}

bool kvd_service_draining(kvd_service_t *svc)
{
    return svc != NULL && __atomic_load_n(&svc->draining, __ATOMIC_ACQUIRE);
}

/* ---- Stats / Admin ------------------------------------------------------ */

static void svc_tier_stats(kvd_pb_tier_stats_t *t, Kvdepot__V1__Tier tier,
                           const kvd_store_tier_stats_t *s, uint64_t checksum)
{
    kvdepot__v1__tier_stats__init(t);
    t->tier = tier;
    t->capacity_bytes = s->capacity_bytes;
    t->used_bytes = s->bytes < s->capacity_bytes ? s->bytes : s->capacity_bytes;
    t->num_objects = s->objects;
    t->hits = s->hits;
    t->misses = s->misses;
    t->evictions = s->evictions;
    t->bytes_read = s->bytes_read;
    t->bytes_written = s->bytes_written;
    t->checksum_errors = checksum;
}

static kvd_status_t svc_stats(kvd_service_t *svc, const uint8_t *req,
                              size_t len, uint8_t **out, size_t *out_len,
                              char *reason, size_t reason_len)
{
    kvd_pb_stats_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_stats_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    kvd_proto_stats_request_free(rq);
    kvd_store_stats_t st;
    s = kvd_store_stats(svc->store, &st);
    if (s != KVD_OK) {
        return s;
    }
    kvd_pb_tier_stats_t tiers[2];
    kvd_pb_tier_stats_t *tp[2] = {&tiers[0], &tiers[1]};
    svc_tier_stats(&tiers[0], KVDEPOT__V1__TIER__TIER_HOST, &st.host, 0);
    svc_tier_stats(&tiers[1], KVDEPOT__V1__TIER__TIER_DISK, &st.disk,
                   st.checksum_errors);
    kvd_pb_stats_response_t rsp = KVDEPOT__V1__STATS_RESPONSE__INIT;
    rsp.n_tiers = st.disk.capacity_bytes > 0 ? 2 : 1;
    rsp.tiers = tp;
    rsp.uptime_ms = (kvd_time_now_ns() - svc->started_ns) / 1000000u;
    pthread_mutex_lock(&svc->mu);
    rsp.active_leases = svc->n_leases;
    rsp.active_reservations = svc->n_resvs;
    pthread_mutex_unlock(&svc->mu);
    return svc_pack(KVD_PROTO_MSG_STATS_RESPONSE, &rsp.base, out, out_len,
                    reason, reason_len);
}

static kvd_status_t svc_admin(kvd_service_t *svc, const uint8_t *req,
                              size_t len, uint8_t **out, size_t *out_len,
                              char *reason, size_t reason_len)
{
    kvd_pb_admin_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_admin_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    kvd_pb_admin_response_t rsp = KVDEPOT__V1__ADMIN_RESPONSE__INIT;
    kvd_pb_ping_reply_t ping = KVDEPOT__V1__PING_REPLY__INIT;
    kvd_pb_flush_reply_t flush = KVDEPOT__V1__FLUSH_REPLY__INIT;
    kvd_pb_drop_namespace_reply_t drop =
        KVDEPOT__V1__DROP_NAMESPACE_REPLY__INIT;
    kvd_pb_drain_reply_t drain = KVDEPOT__V1__DRAIN_REPLY__INIT;
    kvd_pb_drop_tenant_reply_t drop_tenant =
        KVDEPOT__V1__DROP_TENANT_REPLY__INIT;
    kvd_pb_config_dump_reply_t dump = KVDEPOT__V1__CONFIG_DUMP_REPLY__INIT;
    kvd_pb_config_entry_t *entries = NULL, **entryp = NULL;
    svc_listing_t list;
    svc_listing_init(&list);
    /* A caller bound to a tenant sees and drops its tenant's objects only,
     * and the daemon-wide operations need an operator's credentials. */
    const uint32_t own = svc_caller_id;
    const uint32_t *only = svc_caller_tenant != NULL ? &own : NULL;
    if (only != NULL &&
        (rq->op_case == KVDEPOT__V1__ADMIN_REQUEST__OP_DRAIN ||
         rq->op_case == KVDEPOT__V1__ADMIN_REQUEST__OP_CONFIG_DUMP)) {
        kvd_config_err(reason, reason_len,
                       "admin %s: the caller is bound to tenant %s; this "
                       "needs an operator's credentials",
                       rq->op_case == KVDEPOT__V1__ADMIN_REQUEST__OP_DRAIN
                           ? "drain"
                           : "config_dump",
                       svc_caller_tenant);
        s = KVD_ERR_AUTH;
        goto out;
    }
    switch (rq->op_case) {
    case KVDEPOT__V1__ADMIN_REQUEST__OP_PING:
        ping.version = (char *)kvd_version();
        ping.protocol_major = KVD_PROTO_MAJOR;
        ping.protocol_revision = KVD_PROTO_REVISION;
        ping.node_id = svc->node_id;
        rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_PING;
        rsp.ping = &ping;
        break;
    case KVDEPOT__V1__ADMIN_REQUEST__OP_FLUSH: {
        kvd_store_stats_t before;
        (void)kvd_store_stats(svc->store, &before);
        uint32_t t = svc_ttl(rq->flush->timeout_ms, svc->cfg.flush_timeout_ms);
        s = kvd_store_flush(svc->store, (int)t);
        if (s != KVD_OK) {
            kvd_config_err(reason, reason_len, "flush: %s", kvd_status_str(s));
            goto out;
        }
        kvd_store_stats_t after;
        (void)kvd_store_stats(svc->store, &after);
        flush.num_objects_written =
            after.disk.objects > before.disk.objects
                ? after.disk.objects - before.disk.objects
                : 0;
        rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_FLUSH;
        rsp.flush = &flush;
        break;
    }
    case KVDEPOT__V1__ADMIN_REQUEST__OP_DROP_NAMESPACE: {
        kvd_namespace_t ns;
        uint64_t dropped = 0;
        s = svc_ns(&rq->drop_namespace->namespace_id, &ns, reason, reason_len);
        if (s != KVD_OK) {
            goto out;
        }
        s = svc_drop_objects(svc, &ns, only, &dropped);
        if (s == KVD_OK && only != NULL && dropped == 0) {
            /* A tenant's listing shows the daemon-side ids (svc_ns): take
             * one of those too; the tenant filter still applies. */
            memcpy(ns.bytes, rq->drop_namespace->namespace_id.data,
                   sizeof ns.bytes);
            s = svc_drop_objects(svc, &ns, only, &dropped);
        }
        if (s != KVD_OK) {
            kvd_config_err(reason, reason_len, "drop_namespace: %s",
                           kvd_status_str(s));
            goto out;
        }
        drop.num_objects_dropped = dropped;
        rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_DROP_NAMESPACE;
        rsp.drop_namespace = &drop;
        break;
    }
    case KVDEPOT__V1__ADMIN_REQUEST__OP_LIST_NAMESPACES:
        s = svc_list(svc, &list, only);
        if (s != KVD_OK) {
            goto out;
        }
        rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_LIST_NAMESPACES;
        rsp.list_namespaces = &list.reply;
        break;
    case KVDEPOT__V1__ADMIN_REQUEST__OP_DRAIN:
        __atomic_store_n(&svc->draining, rq->drain->enable, __ATOMIC_RELEASE);
        KVD_LOG_INFO("service: %s", rq->drain->enable
                                        ? "draining: new saves are refused"
                                        : "drain off: saves taken again");
        drain.draining = rq->drain->enable;
        pthread_mutex_lock(&svc->mu);
        drain.active_leases = svc->n_leases;
        drain.active_reservations = svc->n_resvs;
        pthread_mutex_unlock(&svc->mu);
        rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_DRAIN;
        rsp.drain = &drain;
        break;
    case KVDEPOT__V1__ADMIN_REQUEST__OP_DROP_TENANT: {
        const char *name = rq->drop_tenant->tenant;
        if (only != NULL && name[0] != '\0' &&
            strcmp(name, svc_caller_tenant) != 0) {
            kvd_config_err(reason, reason_len,
                           "drop_tenant %s: the caller is bound to tenant %s",
                           name, svc_caller_tenant);
            s = KVD_ERR_AUTH;
            goto out;
        }
        uint32_t id = only != NULL ? own : svc_tenant_id(name);
        uint64_t dropped = 0;
        s = svc_drop_objects(svc, NULL, &id, &dropped);
        if (s != KVD_OK) {
            kvd_config_err(reason, reason_len, "drop_tenant: %s",
                           kvd_status_str(s));
            goto out;
        }
        drop_tenant.num_objects_dropped = dropped;
        rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_DROP_TENANT;
        rsp.drop_tenant = &drop_tenant;
        break;
    }
    case KVDEPOT__V1__ADMIN_REQUEST__OP_CONFIG_DUMP: {
        size_t n = svc->cfg.n_config_entries;
        entries = calloc(n ? n : 1, sizeof *entries);
        entryp = calloc(n ? n : 1, sizeof *entryp);
        if (entries == NULL || entryp == NULL) {
            s = KVD_ERR_NOMEM;
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            const kvd_service_config_entry_t *e = &svc->cfg.config_entries[i];
            kvdepot__v1__config_entry__init(&entries[i]);
            entries[i].key = (char *)e->key;
            entries[i].value = (char *)e->value;
            entries[i].source = (char *)e->source;
            entryp[i] = &entries[i];
        }
        dump.n_entries = n;
        dump.entries = entryp;
        rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_CONFIG_DUMP;
        rsp.config_dump = &dump;
        break;
    }
    default:
        kvd_config_err(reason, reason_len, "admin: unknown op %d",
                       (int)rq->op_case);
        s = KVD_ERR_UNSUPPORTED;
        goto out;
    }
    s = svc_pack(KVD_PROTO_MSG_ADMIN_RESPONSE, &rsp.base, out, out_len, reason,
                 reason_len);
out:
    free(entryp);
    free(entries);
    svc_listing_free(&list);
    kvd_proto_admin_request_free(rq);
    return s;
}

/* ---- Delete ------------------------------------------------------------- */

static kvd_status_t svc_delete(kvd_service_t *svc, const uint8_t *req,
                               size_t len, uint8_t **out, size_t *out_len,
                               char *reason, size_t reason_len)
{
    kvd_pb_delete_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_delete_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    if (svc_caller_tenant != NULL) {
        /* Keys are not secrets: a tenant could name another's blocks. */
        kvd_config_err(reason, reason_len,
                       "delete: the caller is bound to tenant %s; deleting "
                       "by key needs an operator's credentials (a tenant "
                       "drops its own namespaces with admin drop_namespace)",
                       svc_caller_tenant);
        kvd_proto_delete_request_free(rq);
        return KVD_ERR_AUTH;
    }
    size_t n = rq->n_block_hashes, deleted = 0;
    kvd_store_key_t *keys = malloc(n * sizeof *keys);
    if (keys == NULL) {
        kvd_proto_delete_request_free(rq);
        return KVD_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        /* Operators only (above): the request's own namespace. */
        memcpy(keys[i].ns.bytes, rq->namespace_id.data,
               sizeof keys[i].ns.bytes);
        memcpy(keys[i].hash.bytes, rq->block_hashes[i].data,
               sizeof keys[i].hash.bytes);
    }
    s = kvd_store_delete(svc->store, keys, n, &deleted);
    free(keys);
    kvd_proto_delete_request_free(rq);
    if (s != KVD_OK && s != KVD_ERR_BUSY) {
        if (s == KVD_ERR_IO) {
            kvd_config_err(reason, reason_len,
                           "delete: the NVMe index could not drop some "
                           "records; those objects return after a restart");
        }
        return s;
    }
    kvd_pb_delete_response_t rsp = KVDEPOT__V1__DELETE_RESPONSE__INIT;
    rsp.num_deleted = (uint32_t)deleted;
    rsp.busy = s == KVD_ERR_BUSY;
    return svc_pack(KVD_PROTO_MSG_DELETE_RESPONSE, &rsp.base, out, out_len,
                    reason, reason_len);
}

/* ---- dispatch ----------------------------------------------------------- */

typedef kvd_status_t (*svc_handler_fn)(kvd_service_t *, const uint8_t *, size_t,
                                       uint8_t **, size_t *, char *, size_t);

static const svc_handler_fn svc_handlers[KVD_RPC_COUNT] = {
    svc_lookup, svc_reserve, svc_commit, svc_abort, svc_release,
    svc_get,    svc_promote, svc_stats,  svc_admin, svc_delete,
};

static void svc_count_error(kvd_service_t *svc, kvd_status_t s)
{
    int k = -(int)s;
    if (k > 0 && k < KVD_SERVICE_ERROR_KINDS) {
        count(&svc->errors_by_status[k], 1);
    }
}

void kvd_service_count_refused(kvd_service_t *svc, kvd_status_t status)
{
    if (svc != NULL) {
        svc_count_error(svc, status);
    }
}

kvd_status_t kvd_service_call(kvd_service_t *svc, kvd_rpc_method_t method,
                              const uint8_t *req, size_t len,
                              const char *tenant, uint8_t **resp_out,
                              size_t *resp_len_out, char *reason,
                              size_t reason_len)
{
    if (reason_len > 0) {
        reason[0] = '\0';
    }
    if (svc == NULL || (unsigned)method >= KVD_RPC_COUNT || resp_out == NULL ||
        resp_len_out == NULL || (req == NULL && len > 0)) {
        return KVD_ERR_INVALID;
    }
    uint64_t t0 = kvd_time_now_ns();
    uint8_t *out = NULL;
    size_t out_len = 0;
    svc_caller_tenant = tenant;
    svc_caller_id = svc_tenant_id(tenant);
    kvd_status_t s =
        svc_handlers[method](svc, req, len, &out, &out_len, reason, reason_len);
    svc_caller_tenant = NULL;
    svc_caller_id = 0;
    uint64_t us = (kvd_time_now_ns() - t0) / 1000u;
    kvd_service_method_stats_t *m = &svc->m[method];
    count(&m->calls, 1);
    count(&m->latency_sum_us, us);
    for (int b = 0; b < KVD_SERVICE_LATENCY_BUCKETS; b++) {
        if (us <= kvd_service_latency_bounds_us[b]) {
            count(&m->latency_buckets[b], 1);
        }
    }
    if (s != KVD_OK) {
        count(&m->errors, 1);
        svc_count_error(svc, s);
        free(out);
        if (reason_len > 0 && reason[0] == '\0') {
            kvd_config_err(reason, reason_len, "%s", kvd_status_str(s));
        }
        return s;
    }
    *resp_out = out;
    *resp_len_out = out_len;
    return KVD_OK;
}

/* ---- housekeeping ------------------------------------------------------- */

/* Applies one store get completion. `mu` held. */
static void svc_complete(kvd_service_t *svc, const kvd_store_completion_t *c)
{
    svc_block_t *b = (svc_block_t *)(uintptr_t)c->user_data;
    svc_lease_t *l = b->owner;
    l->pending--;
    if (c->status == KVD_OK) {
        if (l->dead || l->promote) {
            (void)kvd_store_release(svc->store, &c->lease, 1);
            b->state = SVC_FAILED;
            b->status = KVD_ERR_CANCELED;
        } else {
            b->lease = c->lease;
            b->state = SVC_HELD;
        }
    } else {
        b->state = SVC_FAILED;
        b->status = c->status;
    }
    if (l->dead && l->pending == 0) {
        svc_lease_t **pp = &svc->graveyard;
        while (*pp != l) {
            pp = &(*pp)->next;
        }
        *pp = l->next;
        lease_free(l);
    }
}

/* Reclaims leases and reservations past their deadline. `mu` held. */
static void svc_expire(kvd_service_t *svc, uint64_t now)
{
    for (size_t b = 0; b < SVC_BUCKETS; b++) {
        svc_lease_t *l = svc->leases[b];
        while (l != NULL) {
            svc_lease_t *next = l->next;
            if (l->deadline_ns <= now) {
                KVD_LOG_DEBUG("service: lease %llu expired (%zu blocks)",
                              (unsigned long long)l->id, l->n);
                lease_unlink(svc, l);
                lease_drop(svc, l);
                count(&svc->leases_expired, 1);
            }
            l = next;
        }
        svc_resv_t *r = svc->resvs[b];
        while (r != NULL) {
            svc_resv_t *next = r->next;
            if (r->deadline_ns <= now) {
                KVD_LOG_DEBUG("service: reservation %llu expired",
                              (unsigned long long)r->id);
                resv_abort_open(svc, r);
                resv_unlink(svc, r);
                resv_free(r);
                count(&svc->resvs_expired, 1);
            }
            r = next;
        }
    }
}

static void *svc_main(void *arg)
{
    kvd_service_t *svc = arg;
    kvd_store_completion_t c[SVC_POLL_BATCH];
    uint64_t next_tick = 0;
    while (!__atomic_load_n(&svc->stopping, __ATOMIC_ACQUIRE)) {
        (void)kvd_store_wait(svc->store, (int)svc->cfg.tick_ms);
        size_t n;
        while ((n = kvd_store_poll(svc->store, c, SVC_POLL_BATCH)) > 0) {
            pthread_mutex_lock(&svc->mu);
            for (size_t i = 0; i < n; i++) {
                if (!(c[i].user_data & KVD_SERVICE_FOREIGN)) {
                    svc_complete(svc, &c[i]);
                }
            }
            pthread_mutex_unlock(&svc->mu);
            for (size_t i = 0; i < n; i++) {
                if (!(c[i].user_data & KVD_SERVICE_FOREIGN)) {
                    continue;
                }
                if (svc->cfg.foreign_completion != NULL) {
                    svc->cfg.foreign_completion(svc->cfg.cluster_ctx, &c[i]);
                } else if (c[i].status == KVD_OK) {
                    (void)kvd_store_release(svc->store, &c[i].lease, 1);
                }
            }
        }
        uint64_t now = kvd_time_now_ns();
        if (now >= next_tick) {
            pthread_mutex_lock(&svc->mu);
            svc_expire(svc, now);
            pthread_mutex_unlock(&svc->mu);
            next_tick = now + (uint64_t)svc->cfg.tick_ms * 1000000u;
        }
    }
    return NULL;
}

kvd_status_t kvd_service_create(const kvd_service_config_t *cfg,
                                kvd_service_t **svc_out)
{
    if (cfg == NULL || svc_out == NULL || cfg->store == NULL ||
        cfg->lease_ttl_ms == 0 || cfg->reservation_ttl_ms == 0 ||
        cfg->tick_ms == 0) {
        return KVD_ERR_INVALID;
    }
    kvd_service_t *svc = calloc(1, sizeof *svc);
    if (svc == NULL) {
        return KVD_ERR_NOMEM;
    }
    svc->cfg = *cfg;
    svc->store = cfg->store;
    if (cfg->node_id != NULL) {
        snprintf(svc->node_id, sizeof svc->node_id, "%s", cfg->node_id);
    }
    svc->cfg.node_id = svc->node_id;
    svc->started_ns = kvd_time_now_ns();
    if (getrandom(&svc->next_id, sizeof svc->next_id, 0) !=
        (ssize_t)sizeof svc->next_id) {
        svc->next_id = svc->started_ns;
    }
    svc->next_id >>= 1; /* room before wrapping */
    pthread_mutex_init(&svc->mu, NULL);
    int rc = pthread_create(&svc->thread, NULL, svc_main, svc);
    if (rc != 0) {
        pthread_mutex_destroy(&svc->mu);
        free(svc);
        return kvd_status_from_errno(rc);
    }
    svc->thread_started = true;
    *svc_out = svc;
    return KVD_OK;
}

void kvd_service_destroy(kvd_service_t *svc)
{
    if (svc == NULL) {
        return;
    }
    __atomic_store_n(&svc->stopping, true, __ATOMIC_RELEASE);
    if (svc->thread_started) {
        pthread_join(svc->thread, NULL);
    }
    pthread_mutex_lock(&svc->mu);
    for (size_t b = 0; b < SVC_BUCKETS; b++) {
        while (svc->leases[b] != NULL) {
            svc_lease_t *l = svc->leases[b];
            lease_unlink(svc, l);
            lease_drop(svc, l);
        }
        while (svc->resvs[b] != NULL) {
            svc_resv_t *r = svc->resvs[b];
            resv_abort_open(svc, r);
            resv_unlink(svc, r);
            resv_free(r);
        }
    }
    /* Gets still in flight: drain them so their slots go back and the
     * records can be freed (the store completes every accepted get). */
    uint64_t deadline = kvd_time_deadline_ns(5000);
    kvd_store_completion_t c[SVC_POLL_BATCH];
    while (svc->graveyard != NULL && kvd_time_now_ns() < deadline) {
        pthread_mutex_unlock(&svc->mu);
        (void)kvd_store_wait(svc->store, 10);
        size_t n = kvd_store_poll(svc->store, c, SVC_POLL_BATCH);
        pthread_mutex_lock(&svc->mu);
        for (size_t i = 0; i < n; i++) {
            svc_complete(svc, &c[i]);
        }
    }
    if (svc->graveyard != NULL) {
        KVD_LOG_WARN("service: store gets still in flight at shutdown; the "
                     "store's close cancels them");
        while (svc->graveyard != NULL) {
            svc_lease_t *l = svc->graveyard;
            svc->graveyard = l->next;
            lease_free(l);
        }
    }
    pthread_mutex_unlock(&svc->mu);
    pthread_mutex_destroy(&svc->mu);
    free(svc->held);
    free(svc);
}

void kvd_service_stats(kvd_service_t *svc, kvd_service_stats_t *out)
{
    memset(out, 0, sizeof *out);
    for (int m = 0; m < KVD_RPC_COUNT; m++) {
        kvd_service_method_stats_t *src = &svc->m[m], *dst = &out->methods[m];
        dst->calls = __atomic_load_n(&src->calls, __ATOMIC_RELAXED);
        dst->errors = __atomic_load_n(&src->errors, __ATOMIC_RELAXED);
        dst->latency_sum_us =
            __atomic_load_n(&src->latency_sum_us, __ATOMIC_RELAXED);
        for (int b = 0; b < KVD_SERVICE_LATENCY_BUCKETS; b++) {
            dst->latency_buckets[b] =
                __atomic_load_n(&src->latency_buckets[b], __ATOMIC_RELAXED);
        }
    }
    for (int k = 0; k < KVD_SERVICE_ERROR_KINDS; k++) {
        out->errors_by_status[k] =
            __atomic_load_n(&svc->errors_by_status[k], __ATOMIC_RELAXED);
    }
    out->leases_expired =
        __atomic_load_n(&svc->leases_expired, __ATOMIC_RELAXED);
    out->leases_refused =
        __atomic_load_n(&svc->leases_refused, __ATOMIC_RELAXED);
    out->reservations_expired =
        __atomic_load_n(&svc->resvs_expired, __ATOMIC_RELAXED);
    out->commit_checksum_errors =
        __atomic_load_n(&svc->checksum_errors, __ATOMIC_RELAXED);
    out->uptime_ms = (kvd_time_now_ns() - svc->started_ns) / 1000000u;
    pthread_mutex_lock(&svc->mu);
    out->leases = svc->n_leases;
    out->leased_blocks = svc->n_leased_blocks;
    out->reservations = svc->n_resvs;
    pthread_mutex_unlock(&svc->mu);
}
