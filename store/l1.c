/*
 * L1 object table (contract, states and the write-back hand-off in
 * store/l1_int.h).
 *
 * Layout: every entry, live or ghost, is a node from one pool allocated at
 * create time (capacity + ghost capacity nodes), so admission never calls
 * malloc and a node's address is stable for its whole life. Nodes are found
 * through a chained hash table whose bucket count is a power of two at
 * least the pool size (load factor <= 1, no resizing). The bucket index
 * comes from the first 8 bytes of the block hash, already uniform because
 * it is SHA-256 output, mixed with the namespace so that one prompt cached
 * for several models does not share a chain.
 *
 * Each node also sits in at most one intrusive FIFO/LRU list (S3-FIFO's
 * small, main and ghost queues, or the LRU list), linked head = newest,
 * tail = oldest. A ghost is a node in state GHOST kept in the hash table so
 * that reserve can tell "seen recently" in the same lookup that checks
 * "already present"; it owns no slot and is invisible to every other call.
 *
 * Quota accounting keeps, per tenant, the bytes that eviction could free
 * right now (ready, unleased, unpinned). Every state change goes through
 * l1_acct(), so reserve can refuse an impossible quota eviction before it
 * evicts anything.
 *
 * Tenants live in a small open-addressing map (linear probing, load <= 1/2,
 * no deletion: a tenant record outlives its objects because its quota
 * does).
 */
#include <assert.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "store/l1_int.h"

_Static_assert(sizeof(kvd_store_key_t) == 48,
               "kvd_store_key_t must be unpadded: "
               "keys are compared with memcmp");

enum { L1_FREE = 0, L1_RESERVED, L1_READY, L1_GHOST };
enum { L1_Q_NONE = 0, L1_Q_SMALL, L1_Q_MAIN, L1_Q_GHOST, L1_Q_LRU, L1_Q_N };

#define L1_TENANTS_INITIAL 16

typedef struct l1_entry l1_entry_t;
struct l1_entry {
    kvd_store_key_t key;
    l1_entry_t *chain; /* next in the hash bucket, or in the free list */
    l1_entry_t *newer; /* queue neighbour towards the head */
    l1_entry_t *older; /* queue neighbour towards the tail */
    uint64_t size_bytes;
    uint64_t checksum; /* XXH3-64 of the bytes, when has_checksum */
    uint32_t slot;
    uint32_t tenant;
    uint32_t refs; /* readers' leases; the writer's reference is implied
                      by state RESERVED */
    uint8_t state;
    uint8_t queue;
    uint8_t freq;
    bool pinned;
    bool to_main;      /* S3-FIFO: admitted from the ghost, commit into M */
    bool doomed;       /* bad bytes: never matched again, removed when free */
    bool has_checksum; /* set at commit by a writer that checked it */
    uint8_t group;     /* its tenant's eviction group at reserve */
};

/* A hash chain's head (a struct, not a bare pointer array, so that the
 * bucket array's element type says what it is). */
typedef struct l1_bucket {
    l1_entry_t *first;
} l1_bucket_t;

typedef struct l1_queue {
    l1_entry_t *head;
    l1_entry_t *tail;
    size_t count;
} l1_queue_t;

typedef struct l1_tenant {
    uint32_t id;
    bool used;
    uint8_t group; /* eviction group of the objects it reserves */
    uint64_t quota_bytes;
    uint64_t bytes;
    uint64_t objects;
    uint64_t evictable_bytes;
    uint64_t evictions;
    uint64_t quota_rejects;
} l1_tenant_t;

struct kvd_l1 {
    pthread_mutex_t lock;
    kvd_l1_policy_t policy;
    uint32_t capacity;
    uint32_t small_target;
    uint32_t ghost_capacity;
    l1_bucket_t *buckets;
    size_t bucket_mask;
    l1_entry_t *pool;
    l1_entry_t *free_list;
    l1_queue_t queues[L1_Q_N];
    l1_tenant_t *tenants;
    size_t tenant_cap; /* power of two */
    size_t tenant_count;
    kvd_l1_stats_t st; /* queue lengths are filled in by kvd_l1_stats */
};

/* ---- hash table and node pool -------------------------------------------
 */

static uint64_t l1_load64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, sizeof(v));
    return v;
}

static l1_entry_t **l1_bucket(kvd_l1_t *l1, const kvd_store_key_t *key)
{
    uint64_t h = l1_load64(key->hash.bytes) ^
                 (l1_load64(key->ns.bytes) * 0x9e3779b97f4a7c15ull);
    h ^= h >> 29;
    return &l1->buckets[h & l1->bucket_mask].first;
}

/* Any node with this key, ghost included. */
static l1_entry_t *l1_find(kvd_l1_t *l1, const kvd_store_key_t *key)
{
    for (l1_entry_t *e = *l1_bucket(l1, key); e != NULL; e = e->chain) {
        if (memcmp(&e->key, key, sizeof(*key)) == 0) {
            return e;
        }
    }
    return NULL;
}

/* A reserved or ready entry with this key; ghosts do not exist here. */
static l1_entry_t *l1_find_live(kvd_l1_t *l1, const kvd_store_key_t *key)
{
    l1_entry_t *e = l1_find(l1, key);
    return (e != NULL && e->state != L1_GHOST) ? e : NULL;
}

static void l1_hash_remove(kvd_l1_t *l1, l1_entry_t *e)
{
    l1_entry_t **pp = l1_bucket(l1, &e->key);
    while (*pp != e) {
        pp = &(*pp)->chain;
    }
    *pp = e->chain;
}

static l1_entry_t *l1_node_alloc(kvd_l1_t *l1, const kvd_store_key_t *key)
{
    l1_entry_t *e = l1->free_list;
    /* The pool holds capacity + ghost_capacity nodes and both populations
     * are bounded before a node is taken. */
    assert(e != NULL);
    l1->free_list = e->chain;
    memset(e, 0, sizeof(*e));
    e->key = *key;
    l1_entry_t **bucket = l1_bucket(l1, key);
    e->chain = *bucket;
    *bucket = e;
    return e;
}

static void l1_node_free(kvd_l1_t *l1, l1_entry_t *e)
{
    l1_hash_remove(l1, e);
    e->state = L1_FREE;
    e->chain = l1->free_list;
    l1->free_list = e;
}

/* ---- queues ------------------------------------------------------------- */

static void l1_queue_push_head(kvd_l1_t *l1, l1_entry_t *e, int qid)
{
    l1_queue_t *q = &l1->queues[qid];
    e->queue = (uint8_t)qid;
    e->newer = NULL;
    e->older = q->head;
    if (q->head != NULL) {
        q->head->newer = e;
    } else {
        q->tail = e;
    }
    q->head = e;
    q->count++;
}

static void l1_queue_remove(kvd_l1_t *l1, l1_entry_t *e)
{
    l1_queue_t *q = &l1->queues[e->queue];
    if (e->newer != NULL) {
        e->newer->older = e->older;
    } else {
        q->head = e->older;
    }
    if (e->older != NULL) {
        e->older->newer = e->newer;
    } else {
        q->tail = e->newer;
    }
    e->newer = NULL;
    e->older = NULL;
    e->queue = L1_Q_NONE;
    q->count--;
}

static void l1_queue_move_head(kvd_l1_t *l1, l1_entry_t *e, int qid)
{
    l1_queue_remove(l1, e);
    l1_queue_push_head(l1, e, qid);
}

/* ---- tenants ------------------------------------------------------------ */

static size_t l1_tenant_home(uint32_t id, size_t cap)
{
    uint32_t h = id * 0x9e3779b1u;
    return (size_t)(h ^ (h >> 16)) & (cap - 1);
}

static l1_tenant_t *l1_tenant_find(kvd_l1_t *l1, uint32_t id)
{
    for (size_t i = l1_tenant_home(id, l1->tenant_cap);;
         i = (i + 1) & (l1->tenant_cap - 1)) {
        l1_tenant_t *t = &l1->tenants[i];
        if (!t->used) {
            return NULL;
        }
        if (t->id == id) {
            return t;
        }
    }
}

/* Inserts a copy of `rec` (id not present) into a map with a free slot. */
static l1_tenant_t *l1_tenant_place(l1_tenant_t *map, size_t cap,
                                    const l1_tenant_t *rec)
{
    size_t i = l1_tenant_home(rec->id, cap);
    while (map[i].used) {
        i = (i + 1) & (cap - 1);
    }
    map[i] = *rec;
    return &map[i];
}

/* Finds or adds tenant `id`. The returned pointer is valid until the next
 * call that adds a tenant (growth moves the records). */
static kvd_status_t l1_tenant_get(kvd_l1_t *l1, uint32_t id,
                                  l1_tenant_t **tenant_out)
{
    l1_tenant_t *t = l1_tenant_find(l1, id);
    if (t != NULL) {
        *tenant_out = t;
        return KVD_OK;
    }
    /* Keep the load at most 1/2 so probes stay short and one slot is
     * always empty (l1_tenant_find relies on it to stop). */
    if ((l1->tenant_count + 1) * 2 > l1->tenant_cap) {
        size_t cap = l1->tenant_cap * 2;
        l1_tenant_t *map = NULL;
        if (KVD_FAILPOINT("l1.tenant_alloc") == 0) {
            map = calloc(cap, sizeof(*map));
        }
        if (map == NULL) {
            KVD_LOG_ERROR("l1: cannot grow the tenant map to %zu records for "
                          "tenant %u",
                          cap, id);
            return KVD_ERR_NOMEM;
        }
        for (size_t i = 0; i < l1->tenant_cap; i++) {
            if (l1->tenants[i].used) {
                l1_tenant_place(map, cap, &l1->tenants[i]);
            }
        }
        free(l1->tenants);
        l1->tenants = map;
        l1->tenant_cap = cap;
    }
    l1_tenant_t rec = {.id = id, .used = true};
    *tenant_out = l1_tenant_place(l1->tenants, l1->tenant_cap, &rec);
    l1->tenant_count++;
    return KVD_OK;
}

/* ---- accounting --------------------------------------------------------- */

static bool l1_evictable(const l1_entry_t *e)
{
    return e->state == L1_READY && e->refs == 0 && !e->pinned;
}

/* Call after changing anything l1_evictable() reads, with its value from
 * before the change. */
static void l1_acct(kvd_l1_t *l1, const l1_entry_t *e, bool was_evictable)
{
    bool now = l1_evictable(e);
    if (now == was_evictable) {
        return;
    }
    l1_tenant_t *t = l1_tenant_find(l1, e->tenant);
    assert(t != NULL);
    if (now) {
        t->evictable_bytes += e->size_bytes;
    } else {
        t->evictable_bytes -= e->size_bytes;
    }
}

/* ---- removal and the ghost ---------------------------------------------- */

static void l1_ghost_drop(kvd_l1_t *l1, l1_entry_t *g)
{
    l1_queue_remove(l1, g);
    l1_node_free(l1, g);
}

/* Turns a node just evicted from S into a ghost key (S3-FIFO's G), making
 * room by forgetting the oldest ghost. */
static void l1_ghost_add(kvd_l1_t *l1, l1_entry_t *e)
{
    l1_queue_t *g = &l1->queues[L1_Q_GHOST];
    if (g->count == l1->ghost_capacity) {
        l1_ghost_drop(l1, g->tail);
    }
    e->state = L1_GHOST;
    e->pinned = false;
    e->freq = 0;
    l1_queue_push_head(l1, e, L1_Q_GHOST);
}

/* Removes a live entry, describing it in `*out` when not NULL. An entry
 * evicted from S3-FIFO's small queue leaves its key in the ghost. */
static void l1_entry_remove(kvd_l1_t *l1, l1_entry_t *e, bool evicted,
                            kvd_l1_victim_t *out)
{
    l1_tenant_t *t = l1_tenant_find(l1, e->tenant);
    assert(t != NULL && e->refs == 0);
    if (l1_evictable(e)) {
        t->evictable_bytes -= e->size_bytes;
    }
    t->bytes -= e->size_bytes;
    t->objects--;
    if (evicted) {
        t->evictions++;
    }
    l1->st.objects--;
    l1->st.bytes -= e->size_bytes;
    if (e->state == L1_RESERVED) {
        l1->st.reserved--;
    }
    if (e->pinned) {
        l1->st.pinned_objects--;
        l1->st.pinned_bytes -= e->size_bytes;
    }
    if (out != NULL) {
        out->key = e->key;
        out->size_bytes = e->size_bytes;
        out->slot = e->slot;
        out->tenant = e->tenant;
        out->has_checksum = e->has_checksum;
        out->checksum = e->checksum;
    }
    bool to_ghost = evicted && e->queue == L1_Q_SMALL && l1->ghost_capacity > 0;
    if (e->queue != L1_Q_NONE) {
        l1_queue_remove(l1, e);
    }
    if (to_ghost) {
        l1_ghost_add(l1, e);
    } else {
        l1_node_free(l1, e);
    }
}

/* ---- victim selection --------------------------------------------------- */

/* Which entries a victim search may take: one tenant's (quota eviction),
 * one group's (a partition's), or any (NULL). */
typedef struct l1_filter {
    const uint32_t *tenant; /* NULL: any tenant */
    int group;              /* -1: any group */
} l1_filter_t;

static bool l1_matches(const l1_entry_t *e, const l1_filter_t *f)
{
    return f == NULL || ((f->tenant == NULL || e->tenant == *f->tenant) &&
                         (f->group < 0 || e->group == f->group));
}

/* S3-FIFO small queue, oldest first: an evictable entry never hit is the
 * victim; an entry hit since insertion, leased or pinned moves on to M.
 * Entries of other tenants (quota eviction) are left where they are. Each
 * entry is visited once: moved ones leave S. */
static l1_entry_t *l1_pick_small(kvd_l1_t *l1, const l1_filter_t *tenant)
{
    l1_entry_t *cur = l1->queues[L1_Q_SMALL].tail;
    while (cur != NULL) {
        l1_entry_t *next = cur->newer;
        if (l1_matches(cur, tenant)) {
            if (l1_evictable(cur) && cur->freq == 0) {
                return cur;
            }
            l1_queue_move_head(l1, cur, L1_Q_MAIN);
        }
        cur = next;
    }
    return NULL;
}

/* S3-FIFO main queue (second_chance) or the LRU list, oldest first.
 * Entries that are not candidates keep their place and are passed once. A
 * candidate with frequency > 0 loses one and goes back to the head, where
 * the walk meets it again after everything older; since frequencies only
 * fall during the walk, it ends after at most count + 3 * candidates
 * visits. */
static l1_entry_t *l1_pick_fifo(kvd_l1_t *l1, int qid,
                                const l1_filter_t *tenant, bool second_chance)
{
    l1_entry_t *cur = l1->queues[qid].tail;
    while (cur != NULL) {
        if (!l1_matches(cur, tenant) || !l1_evictable(cur)) {
            cur = cur->newer;
            continue;
        }
        if (!second_chance || cur->freq == 0) {
            return cur;
        }
        cur->freq--;
        l1_entry_t *next = cur->newer;
        if (next != NULL) {
            l1_queue_move_head(l1, cur, qid);
            cur = next;
        }
        /* Already the head: look at it again with its lower frequency. */
    }
    return NULL;
}

static l1_entry_t *l1_pick(kvd_l1_t *l1, const l1_filter_t *tenant)
{
    if (l1->policy == KVD_L1_LRU) {
        return l1_pick_fifo(l1, L1_Q_LRU, tenant, false);
    }
    l1_entry_t *e;
    if (l1->queues[L1_Q_SMALL].count >= l1->small_target ||
        l1->queues[L1_Q_MAIN].count == 0) {
        e = l1_pick_small(l1, tenant);
        return e != NULL ? e : l1_pick_fifo(l1, L1_Q_MAIN, tenant, true);
    }
    e = l1_pick_fifo(l1, L1_Q_MAIN, tenant, true);
    if (e != NULL) {
        return e;
    }
    /* M had nothing for us; S may, either as a victim or by promoting
     * entries into M, which the last pass then considers. */
    e = l1_pick_small(l1, tenant);
    return e != NULL ? e : l1_pick_fifo(l1, L1_Q_MAIN, tenant, true);
}

/* Evicts until both goals are met, `max` victims are taken or nothing is
 * left to evict; returns the number of victims written to `victims`. */
static size_t l1_evict_locked(kvd_l1_t *l1, const l1_filter_t *tenant,
                              size_t want_objects, uint64_t want_bytes,
                              kvd_l1_victim_t *victims, size_t max)
{
    size_t n = 0;
    uint64_t freed = 0;
    while (n < max && (n < want_objects || freed < want_bytes)) {
        l1_entry_t *v = l1_pick(l1, tenant);
        if (v == NULL) {
            break;
        }
        freed += v->size_bytes;
        l1_entry_remove(l1, v, true, &victims[n]);
        n++;
    }
    return n;
}

/* ---- create / destroy --------------------------------------------------- */

/* calloc with failpoint "l1.alloc", evaluated once per allocation so that
 * tests can fail each step of kvd_l1_create (l1.alloc=ENOMEM@N). */
static void *l1_calloc(size_t n, size_t size)
{
    if (KVD_FAILPOINT("l1.alloc") != 0) {
        return NULL;
    }
    return calloc(n, size);
}

static kvd_status_t l1_config_check(const kvd_l1_config_t *cfg)
{
    if (cfg->capacity == 0 || cfg->capacity > KVD_L1_CAPACITY_MAX) {
        KVD_LOG_ERROR("l1: capacity %u outside 1..%u", cfg->capacity,
                      KVD_L1_CAPACITY_MAX);
        return KVD_ERR_INVALID;
    }
    if (cfg->policy != KVD_L1_S3FIFO && cfg->policy != KVD_L1_LRU) {
        KVD_LOG_ERROR("l1: unknown eviction policy %d", (int)cfg->policy);
        return KVD_ERR_INVALID;
    }
    if (cfg->small_percent > 90) {
        KVD_LOG_ERROR("l1: small_percent %u above 90", cfg->small_percent);
        return KVD_ERR_INVALID;
    }
    if (cfg->ghost_capacity > KVD_L1_CAPACITY_MAX) {
        KVD_LOG_ERROR("l1: ghost_capacity %u above %u", cfg->ghost_capacity,
                      KVD_L1_CAPACITY_MAX);
        return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

kvd_status_t kvd_l1_create(const kvd_l1_config_t *cfg, kvd_l1_t **l1_out)
{
    if (cfg == NULL || l1_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = l1_config_check(cfg);
    if (status != KVD_OK) {
        return status;
    }
    kvd_l1_t *l1 = l1_calloc(1, sizeof(*l1));
    if (l1 == NULL) {
        status = KVD_ERR_NOMEM;
        goto err;
    }
    l1->policy = cfg->policy;
    l1->capacity = cfg->capacity;
    if (cfg->policy == KVD_L1_S3FIFO) {
        uint32_t pct = cfg->small_percent != 0 ? cfg->small_percent
                                               : KVD_L1_SMALL_PERCENT_DEFAULT;
        uint64_t small = (uint64_t)cfg->capacity * pct / 100;
        l1->small_target = small > 0 ? (uint32_t)small : 1;
        l1->ghost_capacity = cfg->ghost_capacity != 0
                                 ? cfg->ghost_capacity
                                 : cfg->capacity - l1->small_target;
    }
    size_t nodes = (size_t)l1->capacity + l1->ghost_capacity;
    size_t buckets = 16;
    while (buckets < nodes) {
        buckets *= 2;
    }
    l1->pool = l1_calloc(nodes, sizeof(*l1->pool));
    if (l1->pool == NULL) {
        status = KVD_ERR_NOMEM;
        goto err_l1;
    }
    l1->buckets = l1_calloc(buckets, sizeof(*l1->buckets));
    if (l1->buckets == NULL) {
        status = KVD_ERR_NOMEM;
        goto err_pool;
    }
    l1->bucket_mask = buckets - 1;
    l1->tenant_cap = L1_TENANTS_INITIAL;
    l1->tenants = l1_calloc(l1->tenant_cap, sizeof(*l1->tenants));
    if (l1->tenants == NULL) {
        status = KVD_ERR_NOMEM;
        goto err_buckets;
    }
    for (size_t i = nodes; i-- > 0;) {
        l1->pool[i].chain = l1->free_list;
        l1->free_list = &l1->pool[i];
    }
    int rc = pthread_mutex_init(&l1->lock, NULL);
    if (rc != 0) {
        KVD_LOG_ERROR("l1: pthread_mutex_init: %s", strerror(rc));
        status = kvd_status_from_errno(rc);
        goto err_tenants;
    }
    *l1_out = l1;
    return KVD_OK;

err_tenants:
    free(l1->tenants);
err_buckets:
    free(l1->buckets);
err_pool:
    free(l1->pool);
err_l1:
    free(l1);
err:
    if (status == KVD_ERR_NOMEM) {
        KVD_LOG_ERROR("l1: out of memory creating a table of %u objects",
                      cfg->capacity);
    }
    return status;
}

void kvd_l1_destroy(kvd_l1_t *l1)
{
    if (l1 == NULL) {
        return;
    }
    pthread_mutex_destroy(&l1->lock);
    free(l1->tenants);
    free(l1->buckets);
    free(l1->pool);
    free(l1);
}

/* ---- public calls ------------------------------------------------------- */

/* Sets the quota (when `quota` is not NULL) and the eviction group (when
 * `group` is not NULL) of `tenant`, adding its record if needed. */
static kvd_status_t l1_tenant_set(kvd_l1_t *l1, uint32_t tenant,
                                  const uint64_t *quota, const uint8_t *group)
{
    if (l1 == NULL) {
        return KVD_ERR_INVALID;
    }
    pthread_mutex_lock(&l1->lock);
    l1_tenant_t *t;
    kvd_status_t status = l1_tenant_get(l1, tenant, &t);
    if (status == KVD_OK && quota != NULL) {
        t->quota_bytes = *quota;
    }
    if (status == KVD_OK && group != NULL) {
        t->group = *group;
    }
    pthread_mutex_unlock(&l1->lock);
    return status;
}

kvd_status_t kvd_l1_tenant_set_quota(kvd_l1_t *l1, uint32_t tenant,
                                     uint64_t max_bytes)
{
    return l1_tenant_set(l1, tenant, &max_bytes, NULL);
}

kvd_status_t kvd_l1_tenant_set_group(kvd_l1_t *l1, uint32_t tenant,
                                     uint8_t group)
{
    return l1_tenant_set(l1, tenant, NULL, &group);
}

/* Quota admission: evicts `t`'s own objects so that `size_bytes` more fit
 * under its quota. Refuses before evicting when they cannot. */
static kvd_status_t l1_admit_quota(kvd_l1_t *l1, l1_tenant_t *t,
                                   uint64_t size_bytes,
                                   kvd_l1_victim_t *victims, size_t max,
                                   size_t *n_out)
{
    uint64_t quota = t->quota_bytes;
    kvd_status_t status = KVD_OK;
    *n_out = 0;
    if (size_bytes > quota) {
        status = KVD_ERR_QUOTA;
        goto out;
    }
    uint64_t room = quota - size_bytes; /* bytes the tenant may keep */
    if (t->bytes <= room) {
        goto out;
    }
    uint64_t excess = t->bytes - room;
    if (t->evictable_bytes < excess) {
        status = KVD_ERR_QUOTA;
        goto out;
    }
    uint32_t id = t->id;
    l1_filter_t f = {.tenant = &id, .group = -1};
    *n_out = l1_evict_locked(l1, &f, 0, excess, victims, max);
    l1->st.quota_evictions += *n_out;
    if (t->bytes > room) {
        status = KVD_ERR_QUOTA; /* max victims reached first */
    }
out:
    if (status == KVD_ERR_QUOTA) {
        t->quota_rejects++;
        l1->st.quota_rejects++;
        KVD_LOG_DEBUG("l1: tenant %u over quota: %llu + %llu > %llu bytes",
                      t->id, (unsigned long long)t->bytes,
                      (unsigned long long)size_bytes,
                      (unsigned long long)quota);
    }
    return status;
}

kvd_status_t kvd_l1_reserve(kvd_l1_t *l1, const kvd_store_key_t *key,
                            uint32_t tenant, uint64_t size_bytes, uint32_t slot,
                            kvd_l1_victim_t *victims_out, size_t max_victims,
                            size_t *n_victims_out)
{
    if (l1 == NULL || key == NULL || n_victims_out == NULL || size_bytes == 0 ||
        (victims_out == NULL && max_victims > 0)) {
        return KVD_ERR_INVALID;
    }
    size_t n = 0;
    kvd_status_t status;
    pthread_mutex_lock(&l1->lock);
    if (l1_find_live(l1, key) != NULL) {
        status = KVD_ERR_EXISTS;
        goto out;
    }
    /* Tenant bytes never exceed the table's, so this one check keeps every
     * byte counter from wrapping. */
    if (size_bytes > UINT64_MAX - l1->st.bytes) {
        status = KVD_ERR_RANGE;
        goto out;
    }
    l1_tenant_t *t;
    status = l1_tenant_get(l1, tenant, &t);
    if (status != KVD_OK) {
        goto out;
    }
    if (t->quota_bytes != 0 && (size_bytes > t->quota_bytes ||
                                t->bytes > t->quota_bytes - size_bytes)) {
        status =
            l1_admit_quota(l1, t, size_bytes, victims_out, max_victims, &n);
        if (status != KVD_OK) {
            goto out;
        }
        /* Quota eviction removed at least one entry, so there is room. */
        assert(l1->st.objects < l1->capacity);
    } else if (l1->st.objects >= l1->capacity) {
        status = KVD_ERR_NOSPACE;
        goto out;
    }
    /* Looked up again: quota eviction may have pushed this very key's
     * ghost out of G. */
    l1_entry_t *ghost = l1_find(l1, key);
    if (ghost != NULL) {
        l1_ghost_drop(l1, ghost);
        l1->st.ghost_hits++;
    }
    l1_entry_t *e = l1_node_alloc(l1, key);
    e->state = L1_RESERVED;
    e->size_bytes = size_bytes;
    e->slot = slot;
    e->tenant = tenant;
    e->group = t->group;
    e->to_main = ghost != NULL;
    t->bytes += size_bytes;
    t->objects++;
    l1->st.objects++;
    l1->st.reserved++;
    l1->st.bytes += size_bytes;
out:
    pthread_mutex_unlock(&l1->lock);
    *n_victims_out = n;
    return status;
}

static kvd_status_t l1_commit(kvd_l1_t *l1, const kvd_store_key_t *key,
                              bool acquire, const uint64_t *checksum)
{
    if (l1 == NULL || key == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = KVD_OK;
    pthread_mutex_lock(&l1->lock);
    l1_entry_t *e = l1_find_live(l1, key);
    if (e == NULL) {
        status = KVD_ERR_NOT_FOUND;
        goto out;
    }
    if (e->state != L1_RESERVED) {
        status = KVD_ERR_STATE;
        goto out;
    }
    e->state = L1_READY;
    e->freq = 0;
    if (checksum != NULL) {
        e->checksum = *checksum;
        e->has_checksum = true;
    }
    int qid = l1->policy == KVD_L1_LRU ? L1_Q_LRU
              : e->to_main             ? L1_Q_MAIN
                                       : L1_Q_SMALL;
    l1_queue_push_head(l1, e, qid);
    /* The writer's reference becomes a lease in the same lock hold, so
     * eviction can never see the entry ready and unleased in between. */
    if (acquire) {
        e->refs = 1;
        l1->st.leased_objects++;
        l1->st.leases++;
    }
    l1_acct(l1, e, false);
    l1->st.reserved--;
    l1->st.commits++;
out:
    pthread_mutex_unlock(&l1->lock);
    return status;
}

kvd_status_t kvd_l1_commit(kvd_l1_t *l1, const kvd_store_key_t *key)
{
    return l1_commit(l1, key, false, NULL);
}

kvd_status_t kvd_l1_commit_acquire(kvd_l1_t *l1, const kvd_store_key_t *key)
{
    return l1_commit(l1, key, true, NULL);
}

kvd_status_t kvd_l1_commit_checksum(kvd_l1_t *l1, const kvd_store_key_t *key,
                                    uint64_t checksum, bool acquire)
{
    return l1_commit(l1, key, acquire, &checksum);
}

kvd_status_t kvd_l1_abort(kvd_l1_t *l1, const kvd_store_key_t *key,
                          uint32_t *slot_out)
{
    if (l1 == NULL || key == NULL || slot_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = KVD_OK;
    uint32_t slot = 0;
    pthread_mutex_lock(&l1->lock);
    l1_entry_t *e = l1_find_live(l1, key);
    if (e == NULL) {
        status = KVD_ERR_NOT_FOUND;
        goto out;
    }
    if (e->state != L1_RESERVED) {
        status = KVD_ERR_STATE;
        goto out;
    }
    slot = e->slot;
    l1_entry_remove(l1, e, false, NULL);
    l1->st.aborts++;
out:
    pthread_mutex_unlock(&l1->lock);
    if (status == KVD_OK) {
        *slot_out = slot;
    }
    return status;
}

/* One more lease on a READY entry (lock held; refs below UINT32_MAX). */
static void l1_lease_take(kvd_l1_t *l1, l1_entry_t *e)
{
    bool was = l1_evictable(e);
    if (e->refs++ == 0) {
        l1->st.leased_objects++;
    }
    l1->st.leases++;
    l1_acct(l1, e, was);
}

static void l1_hit(kvd_l1_t *l1, l1_entry_t *e)
{
    if (l1->policy == KVD_L1_LRU) {
        l1_queue_move_head(l1, e, L1_Q_LRU);
    } else if (e->freq < KVD_L1_FREQ_MAX) {
        e->freq++;
    }
}

kvd_status_t kvd_l1_lookup_prefix(kvd_l1_t *l1, const kvd_store_key_t *keys,
                                  size_t n, uint32_t *slots_out,
                                  uint64_t *sizes_out, size_t *matched_out)
{
    if (l1 == NULL || matched_out == NULL ||
        (n > 0 && (keys == NULL || slots_out == NULL))) {
        return KVD_ERR_INVALID;
    }
    size_t m = 0;
    pthread_mutex_lock(&l1->lock);
    for (; m < n; m++) {
        l1_entry_t *e = l1_find_live(l1, &keys[m]);
        if (e == NULL || e->state != L1_READY || e->refs == UINT32_MAX ||
            e->doomed) {
            break;
        }
        l1_lease_take(l1, e);
        l1_hit(l1, e);
        slots_out[m] = e->slot;
        if (sizes_out != NULL) {
            sizes_out[m] = e->size_bytes;
        }
    }
    l1->st.hits += m;
    if (m < n) {
        l1->st.misses++;
    }
    pthread_mutex_unlock(&l1->lock);
    *matched_out = m;
    return KVD_OK;
}

/* One lease back; `lock` held. */
static kvd_status_t l1_release_locked(kvd_l1_t *l1, const kvd_store_key_t *key)
{
    l1_entry_t *e = l1_find_live(l1, key);
    if (e == NULL) {
        return KVD_ERR_NOT_FOUND;
    }
    if (e->state != L1_READY || e->refs == 0) {
        return KVD_ERR_STATE;
    }
    bool was = l1_evictable(e);
    if (--e->refs == 0) {
        l1->st.leased_objects--;
    }
    l1->st.leases--;
    l1_acct(l1, e, was);
    return KVD_OK;
}

kvd_status_t kvd_l1_release(kvd_l1_t *l1, const kvd_store_key_t *key)
{
    if (l1 == NULL || key == NULL) {
        return KVD_ERR_INVALID;
    }
    pthread_mutex_lock(&l1->lock);
    kvd_status_t status = l1_release_locked(l1, key);
    pthread_mutex_unlock(&l1->lock);
    return status;
}

kvd_status_t kvd_l1_release_many(kvd_l1_t *l1, const kvd_store_key_t *keys,
                                 size_t n)
{
    if (l1 == NULL || (n > 0 && keys == NULL)) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t first = KVD_OK;
    pthread_mutex_lock(&l1->lock);
    for (size_t i = 0; i < n; i++) {
        kvd_status_t s = l1_release_locked(l1, &keys[i]);
        if (s != KVD_OK && first == KVD_OK) {
            first = s;
        }
    }
    pthread_mutex_unlock(&l1->lock);
    return first;
}

kvd_status_t kvd_l1_acquire(kvd_l1_t *l1, const kvd_store_key_t *key,
                            uint32_t *slot_out)
{
    if (l1 == NULL || key == NULL || slot_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = KVD_OK;
    pthread_mutex_lock(&l1->lock);
    l1_entry_t *e = l1_find_live(l1, key);
    if (e == NULL || e->doomed) {
        status = KVD_ERR_NOT_FOUND;
        goto out;
    }
    if (e->state != L1_READY || e->refs == UINT32_MAX) {
        status = KVD_ERR_STATE;
        goto out;
    }
    l1_lease_take(l1, e);
    *slot_out = e->slot;
out:
    pthread_mutex_unlock(&l1->lock);
    return status;
}

kvd_status_t kvd_l1_doom(kvd_l1_t *l1, const kvd_store_key_t *key)
{
    if (l1 == NULL || key == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = KVD_OK;
    pthread_mutex_lock(&l1->lock);
    l1_entry_t *e = l1_find_live(l1, key);
    if (e == NULL) {
        status = KVD_ERR_NOT_FOUND;
    } else if (e->state != L1_READY) {
        status = KVD_ERR_STATE;
    } else {
        e->doomed = true;
    }
    pthread_mutex_unlock(&l1->lock);
    return status;
}

kvd_status_t kvd_l1_peek(kvd_l1_t *l1, const kvd_store_key_t *key,
                         kvd_l1_entry_info_t *info_out)
{
    if (l1 == NULL || key == NULL || info_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = KVD_OK;
    pthread_mutex_lock(&l1->lock);
    l1_entry_t *e = l1_find_live(l1, key);
    if (e == NULL) {
        status = KVD_ERR_NOT_FOUND;
    } else {
        info_out->ready = e->state == L1_READY;
        info_out->doomed = e->doomed;
        info_out->pinned = e->pinned;
        info_out->refs = e->refs;
        info_out->slot = e->slot;
        info_out->tenant = e->tenant;
        info_out->size_bytes = e->size_bytes;
        info_out->has_checksum = e->has_checksum;
        info_out->checksum = e->checksum;
    }
    pthread_mutex_unlock(&l1->lock);
    return status;
}

kvd_status_t kvd_l1_pin(kvd_l1_t *l1, const kvd_store_key_t *key, bool pinned,
                        uint64_t max_pinned_bytes)
{
    if (l1 == NULL || key == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = KVD_OK;
    pthread_mutex_lock(&l1->lock);
    l1_entry_t *e = l1_find_live(l1, key);
    if (e == NULL) {
        status = KVD_ERR_NOT_FOUND;
        goto out;
    }
    if (e->pinned != pinned) {
        if (pinned && max_pinned_bytes != 0 &&
            l1->st.pinned_bytes + e->size_bytes > max_pinned_bytes) {
            status = KVD_ERR_QUOTA;
            goto out;
        }
        bool was = l1_evictable(e);
        e->pinned = pinned;
        if (pinned) {
            l1->st.pinned_objects++;
            l1->st.pinned_bytes += e->size_bytes;
        } else {
            l1->st.pinned_objects--;
            l1->st.pinned_bytes -= e->size_bytes;
        }
        l1_acct(l1, e, was);
    }
out:
    pthread_mutex_unlock(&l1->lock);
    return status;
}

kvd_status_t kvd_l1_evict(kvd_l1_t *l1, size_t want_objects,
                          uint64_t want_bytes, kvd_l1_victim_t *victims_out,
                          size_t max_victims, size_t *n_out)
{
    if (l1 == NULL || n_out == NULL ||
        (victims_out == NULL && max_victims > 0)) {
        return KVD_ERR_INVALID;
    }
    pthread_mutex_lock(&l1->lock);
    size_t n = l1_evict_locked(l1, NULL, want_objects, want_bytes, victims_out,
                               max_victims);
    l1->st.evictions += n;
    pthread_mutex_unlock(&l1->lock);
    *n_out = n;
    return KVD_OK;
}

kvd_status_t kvd_l1_evict_group(kvd_l1_t *l1, uint8_t group,
                                size_t want_objects, uint64_t want_bytes,
                                kvd_l1_victim_t *victims_out,
                                size_t max_victims, size_t *n_out)
{
    if (l1 == NULL || n_out == NULL ||
        (victims_out == NULL && max_victims > 0)) {
        return KVD_ERR_INVALID;
    }
    l1_filter_t f = {.tenant = NULL, .group = group};
    pthread_mutex_lock(&l1->lock);
    size_t n = l1_evict_locked(l1, &f, want_objects, want_bytes, victims_out,
                               max_victims);
    l1->st.evictions += n;
    pthread_mutex_unlock(&l1->lock);
    *n_out = n;
    return KVD_OK;
}

kvd_status_t kvd_l1_delete(kvd_l1_t *l1, const kvd_store_key_t *key,
                           kvd_l1_victim_t *removed_out)
{
    if (l1 == NULL || key == NULL || removed_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = KVD_OK;
    kvd_l1_victim_t removed;
    pthread_mutex_lock(&l1->lock);
    l1_entry_t *e = l1_find_live(l1, key);
    if (e == NULL) {
        status = KVD_ERR_NOT_FOUND;
        goto out;
    }
    if (e->state != L1_READY) {
        status = KVD_ERR_STATE;
        goto out;
    }
    if (e->refs > 0) {
        status = KVD_ERR_BUSY;
        goto out;
    }
    l1_entry_remove(l1, e, false, &removed);
    l1->st.deletes++;
out:
    pthread_mutex_unlock(&l1->lock);
    if (status == KVD_OK) {
        *removed_out = removed;
    }
    return status;
}

kvd_status_t kvd_l1_stats(kvd_l1_t *l1, kvd_l1_stats_t *stats_out)
{
    if (l1 == NULL || stats_out == NULL) {
        return KVD_ERR_INVALID;
    }
    pthread_mutex_lock(&l1->lock);
    kvd_l1_stats_t s = l1->st;
    s.small_objects = l1->queues[L1_Q_SMALL].count;
    s.main_objects = l1->queues[L1_Q_MAIN].count;
    s.ghost_keys = l1->queues[L1_Q_GHOST].count;
    s.lru_objects = l1->queues[L1_Q_LRU].count;
    pthread_mutex_unlock(&l1->lock);
    *stats_out = s;
    return KVD_OK;
}

kvd_status_t kvd_l1_tenant_stats(kvd_l1_t *l1, uint32_t tenant,
                                 kvd_l1_tenant_stats_t *stats_out)
{
    if (l1 == NULL || stats_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t status = KVD_OK;
    kvd_l1_tenant_stats_t s = {0};
    pthread_mutex_lock(&l1->lock);
    const l1_tenant_t *t = l1_tenant_find(l1, tenant);
    if (t == NULL) {
        status = KVD_ERR_NOT_FOUND;
    } else {
        s.objects = t->objects;
        s.bytes = t->bytes;
        s.evictable_bytes = t->evictable_bytes;
        s.quota_bytes = t->quota_bytes;
        s.evictions = t->evictions;
        s.quota_rejects = t->quota_rejects;
    }
    pthread_mutex_unlock(&l1->lock);
    if (status == KVD_OK) {
        *stats_out = s;
    }
    return status;
}

kvd_status_t kvd_l1_scan(kvd_l1_t *l1, uint64_t *cursor,
                         kvd_l1_scan_entry_t *out, size_t max, size_t *n_out)
{
    if (l1 == NULL || cursor == NULL || n_out == NULL ||
        (max > 0 && out == NULL)) {
        return KVD_ERR_INVALID;
    }
    size_t nodes = (size_t)l1->capacity + l1->ghost_capacity;
    size_t n = 0;
    uint64_t i = *cursor;
    pthread_mutex_lock(&l1->lock);
    /* The pool never moves, so an index is a stable cursor. */
    for (; i < nodes && n < max; i++) {
        const l1_entry_t *e = &l1->pool[i];
        if (e->state == L1_READY && !e->doomed) {
            out[n].key = e->key;
            out[n].size_bytes = e->size_bytes;
            out[n].tenant = e->tenant;
            n++;
        }
    }
    pthread_mutex_unlock(&l1->lock);
    *cursor = i;
    *n_out = n;
    return KVD_OK;
}
