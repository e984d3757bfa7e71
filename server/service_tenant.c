/*
 * Tenants in the service: the caller's tenant (what its credentials say,
 * set by kvd_service_call for the handler on this thread), the tenant's
 * own copy of every namespace, who may use a lease or reservation, and the
 * object bytes each tenant holds leased, which server.tenant_max_leased
 * caps (the cap is checked by Lookup and Get against svc_held_room), and
 * the bytes each caller holds reserved, which server.max_reserved_bytes
 * caps (checked by Reserve against svc_reserved_room: counted by walking
 * the reservation table, which Reserve alone pays for). Stats for a bound
 * caller (and /metrics, per configured tenant) takes its tenant's lookup
 * hits and misses from here too: the store counts them for everyone, the
 * service knows who asked.
 */
#include <stdlib.h>
#include <string.h>

#include "common/config_int.h"
#include "server/svc_int.h"

/* Set by kvd_service_call around each handler (svc_int.h). */
_Thread_local const char *svc_caller_tenant;
_Thread_local uint32_t svc_caller_id;
_Thread_local uint64_t svc_caller_session;

uint32_t svc_tenant_id(const char *tenant)
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
bool svc_owns(uint32_t owner)
{
    return svc_caller_tenant == NULL || owner == svc_caller_id;
}

/* What `tenant` holds leased (`mu` held). */
static svc_held_t *held_of(kvd_service_t *svc, uint32_t tenant, bool create)
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
        svc_held_t *h = realloc(svc->held, cap * sizeof *h);
        if (h == NULL) {
            return NULL; /* not counted: the cap is best effort */
        }
        svc->held = h;
        svc->cap_held = cap;
    }
    svc->held[svc->n_held] = (svc_held_t){.tenant = tenant, .bytes = 0};
    return &svc->held[svc->n_held++];
}

void svc_held_add(kvd_service_t *svc, uint32_t tenant, uint64_t bytes, bool add)
{
    svc_held_t *h = held_of(svc, tenant, add);
    if (h != NULL) {
        h->bytes = add                ? h->bytes + bytes
                   : h->bytes > bytes ? h->bytes - bytes
                                      : 0;
    }
}

/* Bytes `tenant` may still lease under server.tenant_max_leased
 * (UINT64_MAX: no limit). `mu` held. */
uint64_t svc_held_room(kvd_service_t *svc, uint32_t tenant)
{
    uint64_t cap = svc->cfg.tenant_max_leased_bytes;
    if (cap == 0) {
        return UINT64_MAX;
    }
    svc_held_t *h = held_of(svc, tenant, false);
    uint64_t used = h != NULL ? h->bytes : 0;
    return used < cap ? cap - used : 0;
}

/* Whether reservation `r` was made by this thread's caller, as
 * server.max_reserved_bytes counts callers: its tenant when bound, else
 * its hand-off session (0: every unbound caller without one). */
static bool resv_is_callers(const svc_resv_t *r)
{
    if (svc_caller_tenant != NULL) {
        return r->tenant == svc_caller_id;
    }
    return r->tenant == 0 && r->session == svc_caller_session;
}

uint64_t svc_reserved_room(kvd_service_t *svc)
{
    uint64_t cap = svc->cfg.max_reserved_bytes;
    if (cap == 0) {
        return UINT64_MAX;
    }
    uint64_t used = 0;
    for (size_t b = 0; b < SVC_BUCKETS; b++) {
        for (const svc_resv_t *r = svc->resvs[b]; r != NULL; r = r->next) {
            used += resv_is_callers(r) ? r->open * r->object_bytes : 0;
        }
    }
    for (const svc_resv_t *r = svc->q_resvs; r != NULL; r = r->next) {
        used += resv_is_callers(r) ? r->open * r->object_bytes : 0;
    }
    return used < cap ? cap - used : 0;
}

/* The request's namespace as the store knows it. A caller bound to a
 * tenant gets its own copy of every namespace: the first 16 bytes of
 * SHA-256("kvdepot tenant namespace", tenant, namespace), so knowing
 * another tenant's namespace and hashes finds none of its objects (no
 * lookup hit, no "exists" on reserve) and never collides with them. */
kvd_status_t svc_ns(const ProtobufCBinaryData *src, kvd_namespace_t *ns,
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

void svc_tenant_count_lookup(kvd_service_t *svc,
                             const kvd_store_lease_t *leases, size_t m,
                             size_t n)
{
    if (svc_caller_tenant == NULL || n == 0) {
        return;
    }
    /* The store's walk (store_load.c): a run of host hits, then a host
     * miss and a run of disk hits, until the chain ends or a disk run
     * finds nothing (a disk miss). */
    uint64_t hits[2] = {0, 0}, misses[2] = {0, 0};
    size_t i = 0;
    while (i < n) {
        while (i < m && leases[i].tier == KVD_STORE_TIER_HOST) {
            hits[0]++;
            i++;
        }
        if (i == n) {
            break;
        }
        misses[0]++;
        size_t b = 0;
        while (i < m && leases[i].tier == KVD_STORE_TIER_DISK) {
            b++;
            i++;
        }
        hits[1] += b;
        if (b == 0) {
            misses[1]++;
            break;
        }
    }
    pthread_mutex_lock(&svc->mu);
    svc_held_t *h = held_of(svc, svc_caller_id, true);
    if (h != NULL) {
        for (int t = 0; t < 2; t++) {
            h->hits[t] += hits[t];
            h->misses[t] += misses[t];
        }
    }
    pthread_mutex_unlock(&svc->mu);
}

void svc_tenant_figures(kvd_service_t *svc, uint32_t tenant,
                        uint64_t hits_out[2], uint64_t misses_out[2],
                        uint64_t *leases_out, uint64_t *resvs_out)
{
    uint64_t nl = 0, nr = 0;
    pthread_mutex_lock(&svc->mu);
    const svc_held_t *h = held_of(svc, tenant, false);
    for (int t = 0; t < 2; t++) {
        hits_out[t] = h != NULL ? h->hits[t] : 0;
        misses_out[t] = h != NULL ? h->misses[t] : 0;
    }
    /* Stats is rare: walking the tables beats a count per record. */
    for (size_t b = 0; b < SVC_BUCKETS; b++) {
        for (const svc_lease_t *l = svc->leases[b]; l != NULL; l = l->next) {
            nl += l->tenant == tenant;
        }
        for (const svc_resv_t *r = svc->resvs[b]; r != NULL; r = r->next) {
            nr += r->tenant == tenant;
        }
    }
    pthread_mutex_unlock(&svc->mu);
    *leases_out = nl;
    *resvs_out = nr;
}

void kvd_service_tenant_lookups(kvd_service_t *svc, const char *tenant,
                                uint64_t hits_out[2], uint64_t misses_out[2])
{
    uint32_t id = svc_tenant_id(tenant);
    pthread_mutex_lock(&svc->mu);
    const svc_held_t *h = id != 0 ? held_of(svc, id, false) : NULL;
    for (int t = 0; t < 2; t++) {
        hits_out[t] = h != NULL ? h->hits[t] : 0;
        misses_out[t] = h != NULL ? h->misses[t] : 0;
    }
    pthread_mutex_unlock(&svc->mu);
}
