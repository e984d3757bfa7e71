/*
 * The operator's methods: Stats (tier counters, active leases and
 * reservations; a caller bound to a tenant gets its tenant's figures
 * only), Admin (ping, flush, list and drop namespaces, drop a
 * tenant, drain, config dump) and Delete by key. A caller bound to a
 * tenant sees and drops its own tenant's objects only; drain, config_dump
 * and Delete need an operator's credentials. Listing and dropping scan the
 * store a chunk at a time and never hold `mu`.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "server/svc_int.h"

/* ---- listing and dropping namespaces ------------------------------------ */

#define SVC_SCAN_CHUNK 1024u

typedef struct svc_listing {
    kvd_pb_list_namespaces_reply_t reply;
    kvd_pb_namespace_usage_t *ns;
    kvd_pb_namespace_usage_t **nsp;
    kvd_pb_tenant_usage_t *tn;
    kvd_pb_tenant_usage_t **tnp;
    uint8_t *ns_ids;     /* 16 bytes per namespace */
    uint32_t *ns_tenant; /* the tenant of each namespace's first object */
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
    free(l->ns_tenant);
}

/* The name the settings give tenant id `id` ("" when none does). The
 * returned text is the service's (borrowed). */
static char *svc_tenant_name(kvd_service_t *svc, uint32_t id)
{
    static char none[] = "";
    for (size_t i = 0; id != 0 && i < svc->cfg.n_tenant_names; i++) {
        if (svc_tenant_id(svc->cfg.tenant_names[i]) == id) {
            /* protobuf-c's string fields are char *; never written. */
            return (char *)(uintptr_t)svc->cfg.tenant_names[i];
        }
    }
    return none;
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
    l->ns_tenant = calloc(cap, sizeof *l->ns_tenant);
    if (chunk == NULL || l->ns == NULL || l->nsp == NULL || l->tn == NULL ||
        l->tnp == NULL || l->ns_ids == NULL || l->ns_tenant == NULL) {
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
                l->ns_tenant[nn] = o->tenant;
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
    for (size_t t = 0; t < nt; t++) {
        l->tn[t].tenant_name = svc_tenant_name(svc, l->tn[t].tenant_id);
    }
    l->reply.n_namespaces = nn;
    l->reply.namespaces = l->nsp;
    l->reply.n_tenants = nt;
    l->reply.tenants = l->tnp;
    return s;
}

static int ns_usage_by_bytes(const void *a, const void *b)
{
    const kvd_service_ns_usage_t *x = a, *y = b;
    return x->bytes < y->bytes ? 1 : x->bytes > y->bytes ? -1 : 0;
}

kvd_status_t kvd_service_namespace_usage(kvd_service_t *svc,
                                         kvd_service_ns_usage_t *out,
                                         size_t max, size_t *n_out,
                                         size_t *n_all_out)
{
    svc_listing_t l;
    svc_listing_init(&l);
    kvd_status_t s = svc_list(svc, &l, NULL);
    size_t nn = l.reply.n_namespaces;
    kvd_service_ns_usage_t *all =
        s == KVD_OK ? calloc(nn > 0 ? nn : 1, sizeof *all) : NULL;
    if (s == KVD_OK && all == NULL) {
        s = KVD_ERR_NOMEM;
    }
    if (s == KVD_OK) {
        for (size_t i = 0; i < nn; i++) {
            memcpy(all[i].ns.bytes, l.ns[i].namespace_id.data,
                   KVD_NAMESPACE_BYTES);
            all[i].tenant = l.ns_tenant[i];
            all[i].tenant_name = svc_tenant_name(svc, l.ns_tenant[i]);
            all[i].host_objects = l.ns[i].host_objects;
            all[i].disk_objects = l.ns[i].disk_objects;
            all[i].bytes = l.ns[i].bytes;
        }
        qsort(all, nn, sizeof *all, ns_usage_by_bytes);
        *n_out = nn < max ? nn : max;
        memcpy(out, all, *n_out * sizeof *out);
        *n_all_out = nn;
    }
    free(all);
    svc_listing_free(&l);
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
    t->errors = s->errors;
}

/* The figures a caller bound to a tenant may see: its tenant's objects,
 * bytes, evictions (the store's per-tenant counts), lookups and open
 * records (the service's), the capacity it may fill. Daemon-wide figures
 * (other tenants' usage, errors, the write queue) stay 0. */
static kvd_status_t svc_stats_tenant(kvd_service_t *svc, kvd_store_stats_t *st,
                                     uint64_t *leases, uint64_t *resvs)
{
    kvd_status_t s = kvd_store_tenant_stats(svc->store, svc_caller_id, st);
    if (s != KVD_OK) {
        return s;
    }
    uint64_t hits[2], misses[2];
    svc_tenant_figures(svc, svc_caller_id, hits, misses, leases, resvs);
    st->host.hits = hits[0];
    st->host.misses = misses[0];
    st->disk.hits = hits[1];
    st->disk.misses = misses[1];
    return KVD_OK;
}

kvd_status_t svc_stats(kvd_service_t *svc, const uint8_t *req, size_t len,
                       uint8_t **out, size_t *out_len, char *reason,
                       size_t reason_len)
{
    kvd_pb_stats_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_stats_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    kvd_proto_stats_request_free(rq);
    kvd_store_stats_t st;
    kvd_pb_stats_response_t rsp = KVDEPOT__V1__STATS_RESPONSE__INIT;
    if (svc_caller_tenant != NULL) {
        s = svc_stats_tenant(svc, &st, &rsp.active_leases,
                             &rsp.active_reservations);
        rsp.tenant = (char *)svc_caller_tenant;
    } else {
        s = kvd_store_stats(svc->store, &st);
        pthread_mutex_lock(&svc->mu);
        rsp.active_leases = svc->n_leases;
        rsp.active_reservations = svc->n_resvs;
        pthread_mutex_unlock(&svc->mu);
    }
    if (s != KVD_OK) {
        return s;
    }
    kvd_pb_tier_stats_t tiers[2];
    kvd_pb_tier_stats_t *tp[2] = {&tiers[0], &tiers[1]};
    svc_tier_stats(&tiers[0], KVDEPOT__V1__TIER__TIER_HOST, &st.host, 0);
    svc_tier_stats(&tiers[1], KVDEPOT__V1__TIER__TIER_DISK, &st.disk,
                   st.checksum_errors);
    rsp.n_tiers = st.disk.capacity_bytes > 0 ? 2 : 1;
    rsp.tiers = tp;
    rsp.uptime_ms = (kvd_time_now_ns() - svc->started_ns) / 1000000u;
    rsp.dropped_writes = st.dropped_writes;
    rsp.writes_pending = st.writes_pending;
    rsp.admission_rejects = st.admission_rejects;
    return svc_pack(KVD_PROTO_MSG_STATS_RESPONSE, &rsp.base, out, out_len,
                    reason, reason_len);
}

/* One Admin call's answer: the response, the reply of each op (the one
 * the op fills is what the response points at) and what they own, alive
 * until the response is packed. */
typedef struct svc_admin_reply {
    kvd_pb_admin_response_t rsp;
    kvd_pb_ping_reply_t ping;
    kvd_pb_flush_reply_t flush;
    kvd_pb_drop_namespace_reply_t drop;
    kvd_pb_drain_reply_t drain;
    kvd_pb_drop_tenant_reply_t drop_tenant;
    kvd_pb_config_dump_reply_t dump;
    kvd_pb_config_entry_t *entries, **entryp;
    svc_listing_t list;
    kvd_pb_cluster_nodes_reply_t cluster;
    kvd_member_t *members;
    kvd_pb_cluster_node_t *nodes, **nodep;
    kvd_pb_pin_reply_t pin;
    svc_events_reply_t events;
} svc_admin_reply_t;

static void admin_reply_init(svc_admin_reply_t *a)
{
    *a = (svc_admin_reply_t){
        .rsp = KVDEPOT__V1__ADMIN_RESPONSE__INIT,
        .ping = KVDEPOT__V1__PING_REPLY__INIT,
        .flush = KVDEPOT__V1__FLUSH_REPLY__INIT,
        .drop = KVDEPOT__V1__DROP_NAMESPACE_REPLY__INIT,
        .drain = KVDEPOT__V1__DRAIN_REPLY__INIT,
        .drop_tenant = KVDEPOT__V1__DROP_TENANT_REPLY__INIT,
        .dump = KVDEPOT__V1__CONFIG_DUMP_REPLY__INIT,
        .cluster = KVDEPOT__V1__CLUSTER_NODES_REPLY__INIT,
        .pin = KVDEPOT__V1__PIN_REPLY__INIT,
        .events = {.reply = KVDEPOT__V1__EVENTS_REPLY__INIT},
    };
    svc_listing_init(&a->list);
}

static void admin_reply_free(svc_admin_reply_t *a)
{
    free(a->entryp);
    free(a->entries);
    free(a->members);
    free(a->nodes);
    free(a->nodep);
    svc_listing_free(&a->list);
    svc_events_reply_free(&a->events);
}

static void admin_ping(kvd_service_t *svc, svc_admin_reply_t *a)
{
    a->ping.version = (char *)kvd_version();
    a->ping.protocol_major = KVD_PROTO_MAJOR;
    a->ping.protocol_revision = KVD_PROTO_REVISION;
    a->ping.node_id = svc->node_id;
    a->rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_PING;
    a->rsp.ping = &a->ping;
}

static kvd_status_t admin_flush(kvd_service_t *svc,
                                const kvd_pb_admin_request_t *rq,
                                svc_admin_reply_t *a, char *reason,
                                size_t reason_len)
{
    kvd_store_stats_t before;
    (void)kvd_store_stats(svc->store, &before);
    uint32_t t = svc_ttl(rq->flush->timeout_ms, svc->cfg.flush_timeout_ms);
    kvd_status_t s = kvd_store_flush(svc->store, (int)t);
    if (s != KVD_OK) {
        kvd_config_err(reason, reason_len, "flush: %s", kvd_status_str(s));
        return s;
    }
    kvd_store_stats_t after;
    (void)kvd_store_stats(svc->store, &after);
    a->flush.num_objects_written =
        after.disk.objects > before.disk.objects
            ? after.disk.objects - before.disk.objects
            : 0;
    a->rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_FLUSH;
    a->rsp.flush = &a->flush;
    return KVD_OK;
}

static kvd_status_t admin_drop_namespace(kvd_service_t *svc,
                                         const kvd_pb_admin_request_t *rq,
                                         const uint32_t *only,
                                         svc_admin_reply_t *a, char *reason,
                                         size_t reason_len)
{
    kvd_namespace_t ns;
    uint64_t dropped = 0;
    kvd_status_t s =
        svc_ns(&rq->drop_namespace->namespace_id, &ns, reason, reason_len);
    if (s != KVD_OK) {
        return s;
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
        return s;
    }
    a->drop.num_objects_dropped = dropped;
    a->rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_DROP_NAMESPACE;
    a->rsp.drop_namespace = &a->drop;
    return KVD_OK;
}

static void admin_drain(kvd_service_t *svc, const kvd_pb_admin_request_t *rq,
                        svc_admin_reply_t *a)
{
    __atomic_store_n(&svc->draining, rq->drain->enable, __ATOMIC_RELEASE);
    KVD_LOG_INFO("service: %s", rq->drain->enable
                                    ? "draining: new saves are refused"
                                    : "drain off: saves taken again");
    a->drain.draining = rq->drain->enable;
    pthread_mutex_lock(&svc->mu);
    a->drain.active_leases = svc->n_leases;
    a->drain.active_reservations = svc->n_resvs;
    pthread_mutex_unlock(&svc->mu);
    a->rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_DRAIN;
    a->rsp.drain = &a->drain;
}

static kvd_status_t admin_drop_tenant(kvd_service_t *svc,
                                      const kvd_pb_admin_request_t *rq,
                                      const uint32_t *only,
                                      svc_admin_reply_t *a, char *reason,
                                      size_t reason_len)
{
    const char *name = rq->drop_tenant->tenant;
    if (only != NULL && name[0] != '\0' &&
        strcmp(name, svc_caller_tenant) != 0) {
        kvd_config_err(reason, reason_len,
                       "drop_tenant %s: the caller is bound to tenant %s", name,
                       svc_caller_tenant);
        return KVD_ERR_AUTH;
    }
    uint32_t id = only != NULL ? *only : svc_tenant_id(name);
    uint64_t dropped = 0;
    kvd_status_t s = svc_drop_objects(svc, NULL, &id, &dropped);
    if (s != KVD_OK) {
        kvd_config_err(reason, reason_len, "drop_tenant: %s",
                       kvd_status_str(s));
        return s;
    }
    a->drop_tenant.num_objects_dropped = dropped;
    a->rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_DROP_TENANT;
    a->rsp.drop_tenant = &a->drop_tenant;
    return KVD_OK;
}

static kvd_status_t admin_config_dump(kvd_service_t *svc, svc_admin_reply_t *a)
{
    size_t n = svc->cfg.n_config_entries;
    a->entries = calloc(n ? n : 1, sizeof *a->entries);
    a->entryp = calloc(n ? n : 1, sizeof *a->entryp);
    if (a->entries == NULL || a->entryp == NULL) {
        return KVD_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        const kvd_service_config_entry_t *e = &svc->cfg.config_entries[i];
        kvdepot__v1__config_entry__init(&a->entries[i]);
        a->entries[i].key = (char *)e->key;
        a->entries[i].value = (char *)e->value;
        a->entries[i].source = (char *)e->source;
        a->entryp[i] = &a->entries[i];
    }
    a->dump.n_entries = n;
    a->dump.entries = a->entryp;
    a->rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_CONFIG_DUMP;
    a->rsp.config_dump = &a->dump;
    return KVD_OK;
}

/* The cluster as this daemon sees it (membership view); a daemon alone
 * answers clustered = false. */
static kvd_status_t admin_cluster_nodes(kvd_service_t *svc,
                                        svc_admin_reply_t *a)
{
    a->rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_CLUSTER_NODES;
    a->rsp.cluster_nodes = &a->cluster;
    if (svc->cfg.members == NULL) {
        return KVD_OK;
    }
    /* Sized to the view (a member is over 1 KiB); one that grew between
     * the two calls comes back truncated. */
    size_t cap = svc->cfg.members(svc->cfg.cluster_ctx, NULL, 0, NULL);
    cap = cap == 0                            ? 1
          : cap < KVD_PROTO_MAX_CLUSTER_NODES ? cap
                                              : KVD_PROTO_MAX_CLUSTER_NODES;
    a->members = calloc(cap, sizeof *a->members);
    a->nodes = calloc(cap, sizeof *a->nodes);
    a->nodep = calloc(cap, sizeof *a->nodep);
    if (a->members == NULL || a->nodes == NULL || a->nodep == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_membership_stats_t st;
    memset(&st, 0, sizeof st);
    size_t all = svc->cfg.members(svc->cfg.cluster_ctx, a->members, cap, &st);
    size_t n = all < cap ? all : cap;
    for (size_t i = 0; i < n; i++) {
        const kvd_member_t *m = &a->members[i];
        kvdepot__v1__cluster_node__init(&a->nodes[i]);
        a->nodes[i].node_id = (char *)m->node_id;
        a->nodes[i].grpc_address = (char *)m->grpc_address;
        a->nodes[i].capacity_bytes = m->capacity_bytes;
        a->nodes[i].version = (char *)m->version;
        a->nodes[i].protocol_revision = m->protocol_revision;
        a->nodes[i].ucx = m->ucx_address_len > 0;
        a->nodep[i] = &a->nodes[i];
    }
    a->cluster.clustered = true;
    a->cluster.stale = st.stale;
    a->cluster.registered = st.registered;
    a->cluster.generation = st.generation;
    a->cluster.reconnects = st.reconnects;
    a->cluster.self_node_id = svc->node_id;
    a->cluster.n_nodes = n;
    a->cluster.nodes = a->nodep;
    a->cluster.truncated = all > n;
    return KVD_OK;
}

static kvd_status_t admin_pin(kvd_service_t *svc,
                              const kvd_pb_admin_request_t *rq,
                              svc_admin_reply_t *a, char *reason,
                              size_t reason_len)
{
    const kvd_pb_pin_t *p = rq->pin;
    kvd_store_key_t *keys = calloc(p->n_block_hashes, sizeof *keys);
    if (keys == NULL) {
        return KVD_ERR_NOMEM;
    }
    for (size_t i = 0; i < p->n_block_hashes; i++) {
        memcpy(keys[i].ns.bytes, p->namespace_id.data, KVD_NAMESPACE_BYTES);
        memcpy(keys[i].hash.bytes, p->block_hashes[i].data, KVD_SHA256_BYTES);
    }
    size_t done = 0, missing = 0;
    kvd_status_t s = kvd_store_pin(svc->store, keys, p->n_block_hashes,
                                   p->pinned, &done, &missing);
    free(keys);
    if (s != KVD_OK && s != KVD_ERR_QUOTA) {
        kvd_config_err(reason, reason_len,
                       "admin pin: %s after %zu of %zu keys", kvd_status_str(s),
                       done, p->n_block_hashes);
        return s;
    }
    a->pin.quota_reached = s == KVD_ERR_QUOTA;
    a->pin.num_done = done;
    a->pin.num_missing = missing;
    a->rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_PIN;
    a->rsp.pin = &a->pin;
    return KVD_OK;
}

static const char *admin_op_name(int op)
{
    switch (op) {
    case KVDEPOT__V1__ADMIN_REQUEST__OP_DRAIN: return "drain";
    case KVDEPOT__V1__ADMIN_REQUEST__OP_CONFIG_DUMP: return "config_dump";
    case KVDEPOT__V1__ADMIN_REQUEST__OP_CLUSTER_NODES: return "cluster_nodes";
    case KVDEPOT__V1__ADMIN_REQUEST__OP_PIN: return "pin";
    default: return "op";
    }
}

/* Runs the request's op into `a`. `only`: the caller's tenant id when it
 * is bound to one (NULL: an operator). */
static kvd_status_t admin_op(kvd_service_t *svc,
                             const kvd_pb_admin_request_t *rq,
                             const uint32_t *only, svc_admin_reply_t *a,
                             char *reason, size_t reason_len)
{
    /* A caller bound to a tenant sees and drops its tenant's objects only,
     * and the daemon-wide operations need an operator's credentials. */
    if (only != NULL &&
        (rq->op_case == KVDEPOT__V1__ADMIN_REQUEST__OP_DRAIN ||
         rq->op_case == KVDEPOT__V1__ADMIN_REQUEST__OP_CONFIG_DUMP ||
         rq->op_case == KVDEPOT__V1__ADMIN_REQUEST__OP_CLUSTER_NODES ||
         rq->op_case == KVDEPOT__V1__ADMIN_REQUEST__OP_PIN)) {
        kvd_config_err(
            reason, reason_len,
            "admin %s: the caller is bound to tenant %s; this needs an "
            "operator's credentials",
            admin_op_name(rq->op_case), svc_caller_tenant);
        return KVD_ERR_AUTH;
    }
    switch (rq->op_case) {
    case KVDEPOT__V1__ADMIN_REQUEST__OP_PING: admin_ping(svc, a); return KVD_OK;
    case KVDEPOT__V1__ADMIN_REQUEST__OP_FLUSH:
        return admin_flush(svc, rq, a, reason, reason_len);
    case KVDEPOT__V1__ADMIN_REQUEST__OP_DROP_NAMESPACE:
        return admin_drop_namespace(svc, rq, only, a, reason, reason_len);
    case KVDEPOT__V1__ADMIN_REQUEST__OP_LIST_NAMESPACES: {
        kvd_status_t s = svc_list(svc, &a->list, only);
        if (s == KVD_OK) {
            a->rsp.result_case =
                KVDEPOT__V1__ADMIN_RESPONSE__RESULT_LIST_NAMESPACES;
            a->rsp.list_namespaces = &a->list.reply;
        }
        return s;
    }
    case KVDEPOT__V1__ADMIN_REQUEST__OP_DRAIN:
        admin_drain(svc, rq, a);
        return KVD_OK;
    case KVDEPOT__V1__ADMIN_REQUEST__OP_DROP_TENANT:
        return admin_drop_tenant(svc, rq, only, a, reason, reason_len);
    case KVDEPOT__V1__ADMIN_REQUEST__OP_CONFIG_DUMP:
        return admin_config_dump(svc, a);
    case KVDEPOT__V1__ADMIN_REQUEST__OP_CLUSTER_NODES:
        return admin_cluster_nodes(svc, a);
    case KVDEPOT__V1__ADMIN_REQUEST__OP_PIN:
        return admin_pin(svc, rq, a, reason, reason_len);
    case KVDEPOT__V1__ADMIN_REQUEST__OP_EVENTS: {
        kvd_status_t s =
            svc_events(svc, rq->events, &a->events, reason, reason_len);
        if (s == KVD_OK) {
            a->rsp.result_case = KVDEPOT__V1__ADMIN_RESPONSE__RESULT_EVENTS;
            a->rsp.events = &a->events.reply;
        }
        return s;
    }
    default:
        kvd_config_err(reason, reason_len, "admin: unknown op %d",
                       (int)rq->op_case);
        return KVD_ERR_UNSUPPORTED;
    }
}

kvd_status_t svc_admin(kvd_service_t *svc, const uint8_t *req, size_t len,
                       uint8_t **out, size_t *out_len, char *reason,
                       size_t reason_len)
{
    kvd_pb_admin_request_t *rq = NULL;
    kvd_status_t s =
        kvd_proto_admin_request_unpack(req, len, &rq, reason, reason_len);
    if (s != KVD_OK) {
        return s;
    }
    svc_admin_reply_t a;
    admin_reply_init(&a);
    const uint32_t own = svc_caller_id;
    const uint32_t *only = svc_caller_tenant != NULL ? &own : NULL;
    s = admin_op(svc, rq, only, &a, reason, reason_len);
    if (s == KVD_OK) {
        s = svc_pack(KVD_PROTO_MSG_ADMIN_RESPONSE, &a.rsp.base, out, out_len,
                     reason, reason_len);
    }
    admin_reply_free(&a);
    kvd_proto_admin_request_free(rq);
    return s;
}

/* ---- Delete ------------------------------------------------------------- */

kvd_status_t svc_delete(kvd_service_t *svc, const uint8_t *req, size_t len,
                        uint8_t **out, size_t *out_len, char *reason,
                        size_t reason_len)
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
