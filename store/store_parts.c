/*
 * Objects written in parts (store.h, kvd_store_reserve_part): several
 * writers, each its own byte ranges of one slot, the object published when
 * the last part commits.
 *
 * The L1 holds the key as one ordinary reservation (invisible to lookups,
 * never evicted) from the first part's reserve; this file keeps, beside
 * it, who has joined and who has ended. Nothing frees the slot while a
 * part that joined may still write it: an abort, or the deadline
 * (store.part_timeout), only abandons the object; the slot goes back when
 * the last joined part ends. The entries live in a chained hash table
 * under parts_mu, which is taken before the store's other locks.
 */
#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "common/time_int.h"
#include "store/engine.h"
#include "store/store_int.h"

#define PARTS_BUCKETS 1024u
/* How often a call looks for objects past their deadline. */
#define PARTS_SWEEP_NS (100ull * 1000 * 1000)

typedef struct store_parts_entry {
    struct store_parts_entry *next;
    kvd_store_key_t key;
    uint64_t object_bytes, offset, deadline_ns;
    uint32_t num_parts;
    uint64_t joined, ended, committed; /* bit p: part p */
    bool abandoned;
} parts_entry_t;

static size_t parts_bucket(const kvd_store_key_t *key)
{
    return (size_t)(kvd_xxh3_64(key, sizeof *key) & (PARTS_BUCKETS - 1));
}

kvd_status_t store_parts_init(kvd_embedded_t *st)
{
    st->parts = calloc(PARTS_BUCKETS, sizeof *st->parts);
    if (st->parts == NULL) {
        return KVD_ERR_NOMEM;
    }
    pthread_mutex_init(&st->parts_mu, NULL);
    return KVD_OK;
}

/* At close: the arena goes too, so the slots need no giving back. */
void store_parts_free(kvd_embedded_t *st)
{
    if (st->parts == NULL) {
        return;
    }
    for (size_t b = 0; b < PARTS_BUCKETS; b++) {
        while (st->parts[b] != NULL) {
            parts_entry_t *e = st->parts[b];
            st->parts[b] = e->next;
            free(e);
        }
    }
    free(st->parts);
    st->parts = NULL;
    pthread_mutex_destroy(&st->parts_mu);
}

/* The entry of `key` and the link that points at it (parts_mu held). */
static parts_entry_t **parts_find(kvd_embedded_t *st,
                                  const kvd_store_key_t *key)
{
    parts_entry_t **pp = &st->parts[parts_bucket(key)];
    while (*pp != NULL && memcmp(&(*pp)->key, key, sizeof *key) != 0) {
        pp = &(*pp)->next;
    }
    return pp;
}

bool store_parts_has(kvd_embedded_t *st, const kvd_store_key_t *key)
{
    if (__atomic_load_n(&st->parts_n, __ATOMIC_ACQUIRE) == 0) {
        return false;
    }
    pthread_mutex_lock(&st->parts_mu);
    bool has = *parts_find(st, key) != NULL;
    pthread_mutex_unlock(&st->parts_mu);
    return has;
}

/* Gives a reserved key's slot back. */
static kvd_status_t parts_abort_key(kvd_embedded_t *st,
                                    const kvd_store_key_t *key)
{
    kvd_store_key_t lk = *key;
    uint32_t slot;
    kvd_status_t s = kvd_l1_abort(st->l1, &lk, &slot);
    if (s == KVD_OK) {
        (void)kvd_arena_slot_free(st->arena, slot);
        pthread_mutex_lock(&st->mu);
        pthread_cond_broadcast(&st->space_cv);
        pthread_mutex_unlock(&st->mu);
    }
    return s;
}

/* Unlinks *pp and gives its slot back (parts_mu held). */
static void parts_drop(kvd_embedded_t *st, parts_entry_t **pp)
{
    parts_entry_t *e = *pp;
    *pp = e->next;
    __atomic_sub_fetch(&st->parts_n, 1, __ATOMIC_RELEASE);
    (void)parts_abort_key(st, &e->key);
    free(e);
}

/* Abandons the objects past their deadline; drops the abandoned ones whose
 * joined parts have all ended (parts_mu held). */
static void parts_sweep(kvd_embedded_t *st)
{
    uint64_t now = kvd_time_now_ns();
    if (st->parts_n == 0 || now < st->parts_sweep_ns) {
        return;
    }
    st->parts_sweep_ns = now + PARTS_SWEEP_NS;
    for (size_t b = 0; b < PARTS_BUCKETS; b++) {
        parts_entry_t **pp = &st->parts[b];
        while (*pp != NULL) {
            parts_entry_t *e = *pp;
            if (!e->abandoned && now >= e->deadline_ns) {
                e->abandoned = true;
                KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                                    "store: an object in %u parts was "
                                    "abandoned: %d of them committed within "
                                    "store.part_timeout",
                                    e->num_parts,
                                    __builtin_popcountll(e->committed));
            }
            if (e->abandoned && e->ended == e->joined) {
                parts_drop(st, pp);
            } else {
                pp = &e->next;
            }
        }
    }
}

void store_parts_tick(kvd_embedded_t *st)
{
    if (__atomic_load_n(&st->parts_n, __ATOMIC_ACQUIRE) == 0) {
        return;
    }
    pthread_mutex_lock(&st->parts_mu);
    parts_sweep(st);
    pthread_mutex_unlock(&st->parts_mu);
}

/* One key of reserve_part (parts_mu held). */
static kvd_status_t parts_reserve_one(kvd_embedded_t *st,
                                      const kvd_store_key_t *key,
                                      uint32_t class_id, uint64_t object_bytes,
                                      uint32_t tenant, uint32_t part,
                                      uint32_t num_parts, uint64_t *deadline_ns,
                                      kvd_store_reservation_t *out)
{
    uint64_t bit = 1ull << part;
    parts_entry_t *e = *parts_find(st, key);
    if (e != NULL) {
        if (e->abandoned || e->num_parts != num_parts ||
            e->object_bytes != object_bytes || (e->joined & bit) != 0) {
            return KVD_ERR_EXISTS;
        }
        e->joined |= bit;
        out->arena_offset = e->offset;
        out->first = false;
        return KVD_OK;
    }
    e = calloc(1, sizeof *e);
    if (e == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_status_t s = store_reserve_one(st, key, class_id, object_bytes, tenant,
                                       deadline_ns, &e->offset);
    if (s != KVD_OK) {
        free(e);
        return s;
    }
    e->key = *key;
    e->object_bytes = object_bytes;
    e->num_parts = num_parts;
    e->joined = bit;
    e->deadline_ns = kvd_time_now_ns() + st->cfg.part_timeout_ms * 1000000ull;
    parts_entry_t **head = &st->parts[parts_bucket(key)];
    e->next = *head;
    *head = e;
    __atomic_add_fetch(&st->parts_n, 1, __ATOMIC_RELEASE);
    out->arena_offset = e->offset;
    out->first = true;
    return KVD_OK;
}

kvd_status_t store_op_reserve_part(kvd_store_t *base, const kvd_namespace_t *ns,
                                   const kvd_block_hash_t *hashes,
                                   size_t num_hashes, uint64_t object_bytes,
                                   uint32_t tenant, uint32_t part,
                                   uint32_t num_parts,
                                   kvd_store_reservation_t *out)
{
    kvd_embedded_t *st = store_embedded(base);
    uint32_t class_id;
    kvd_status_t status = store_reserve_class(st, object_bytes, &class_id);
    if (status != KVD_OK) {
        return status;
    }
    uint64_t deadline_ns = 0;
    pthread_mutex_lock(&st->parts_mu);
    parts_sweep(st);
    for (size_t i = 0; i < num_hashes; i++) {
        kvd_store_key_t key = {.ns = *ns, .hash = hashes[i]};
        store_sight(st, &key);
        memset(&out[i], 0, sizeof out[i]);
        out[i].status =
            parts_reserve_one(st, &key, class_id, object_bytes, tenant, part,
                              num_parts, &deadline_ns, &out[i]);
    }
    pthread_mutex_unlock(&st->parts_mu);
    return KVD_OK;
}

/* Ends `part` of one key (parts_mu held). */
static kvd_status_t parts_end_one(kvd_embedded_t *st,
                                  const kvd_store_key_t *key, uint32_t part,
                                  bool commit, bool *published)
{
    *published = false;
    uint64_t bit = 1ull << part;
    parts_entry_t **pp = parts_find(st, key);
    parts_entry_t *e = *pp;
    if (e == NULL) {
        /* Not an object in parts: a key of the plain calls (one part). */
        if (part != 0) {
            return KVD_ERR_NOT_FOUND;
        }
        kvd_status_t s =
            commit ? store_commit_one(st, key, NULL) : parts_abort_key(st, key);
        *published = commit && s == KVD_OK;
        return s;
    }
    if ((e->joined & bit) == 0) {
        return KVD_ERR_NOT_FOUND;
    }
    if ((e->ended & bit) != 0) {
        return KVD_ERR_STATE;
    }
    e->ended |= bit;
    if (commit && !e->abandoned) {
        e->committed |= bit;
    } else {
        e->abandoned = true;
    }
    kvd_status_t s = commit && e->abandoned ? KVD_ERR_TIMEOUT : KVD_OK;
    uint64_t all = e->num_parts == 64 ? ~0ull : (1ull << e->num_parts) - 1;
    if (!e->abandoned && e->committed == all) {
        *pp = e->next;
        __atomic_sub_fetch(&st->parts_n, 1, __ATOMIC_RELEASE);
        s = store_commit_one(st, &e->key, NULL);
        *published = s == KVD_OK;
        free(e);
    } else if (e->abandoned && e->ended == e->joined) {
        parts_drop(st, pp);
    }
    return s;
}

kvd_status_t store_op_end_part(kvd_store_t *base, const kvd_store_key_t *keys,
                               size_t num, uint32_t part, bool commit,
                               kvd_status_t *statuses_out, bool *published_out)
{
    kvd_embedded_t *st = store_embedded(base);
    kvd_status_t first = KVD_OK;
    pthread_mutex_lock(&st->parts_mu);
    for (size_t i = 0; i < num; i++) {
        bool published;
        kvd_status_t s = parts_end_one(st, &keys[i], part, commit, &published);
        if (statuses_out != NULL) {
            statuses_out[i] = s;
        }
        if (published_out != NULL) {
            published_out[i] = published;
        }
        if (s != KVD_OK && first == KVD_OK) {
            first = s;
        }
    }
    parts_sweep(st);
    pthread_mutex_unlock(&st->parts_mu);
    return first;
}
