/*
 * Quarantine of expired leases and reservations. A client that mapped the
 * arena (a hand-off session) reads leased objects and writes reserved slots
 * in place, with no call to the daemon while it copies. When such a lease
 * or reservation reaches its deadline the client may still be in the
 * middle of a copy (a stalled worker), so giving the slot back at once
 * would let the next save store another key there: a slow reader would
 * take that key's bytes for its own, a slow writer would overwrite a
 * committed object. So the record is not given back but moved here, out of
 * its table (no call can use or extend it any more), until
 *   - the session acknowledges it: Release of the lease id (or a Lookup's
 *     release list), Abort or Commit of the reservation id (the client's
 *     own deadline tells it the copy cannot be trusted, and it sends those
 *     calls anyway), or
 *   - the session closes (its hand-off connection ends when the client
 *     process closes the store or dies): nothing can touch the slots any
 *     more.
 * A record of a caller with no open session (TCP, a client of a daemon
 * that did not keep its hand-off connection) is given back at its
 * deadline, as before. Quarantined leases keep counting against their
 * tenant's server.tenant_max_leased and quarantined reservations keep their
 * store reservation (the tenant's quota), so what one caller can pin is
 * bounded by its limits.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "server/svc_int.h"

/* Whether `session` is open. `mu` held. */
static bool session_open(const kvd_service_t *svc, uint64_t session)
{
    for (size_t i = 0; session != 0 && i < svc->n_sessions; i++) {
        if (svc->sessions[i] == session) {
            return true;
        }
    }
    return false;
}

void svc_lease_expire(kvd_service_t *svc, svc_lease_t *l)
{
    if (!session_open(svc, l->session)) {
        svc_lease_drop(svc, l);
        return;
    }
    /* Out of the table, still holding its store leases and still counted
     * against its tenant. */
    svc_held_add(svc, l->tenant, l->bytes, true);
    l->next = svc->q_leases;
    svc->q_leases = l;
    svc->n_q_leases++;
    svc->q_bytes += l->bytes;
    KVD_LOG_DEBUG("service: lease %llu of session %llu quarantined",
                  (unsigned long long)l->id, (unsigned long long)l->session);
}

void svc_resv_expire(kvd_service_t *svc, svc_resv_t *r)
{
    if (!session_open(svc, r->session)) {
        svc_resv_abort_open(svc, r);
        svc_resv_free(r);
        return;
    }
    r->next = svc->q_resvs;
    svc->q_resvs = r;
    svc->n_q_resvs++;
    svc->q_bytes += r->open * r->object_bytes;
    KVD_LOG_DEBUG("service: reservation %llu of session %llu quarantined",
                  (unsigned long long)r->id, (unsigned long long)r->session);
}

/* Takes quarantined lease `l` (at *pp) out and gives it back. */
static void q_lease_drop(kvd_service_t *svc, svc_lease_t **pp)
{
    svc_lease_t *l = *pp;
    *pp = l->next;
    l->next = NULL;
    svc->n_q_leases--;
    svc->q_bytes -= l->bytes;
    svc_held_add(svc, l->tenant, l->bytes, false);
    svc_lease_drop(svc, l);
}

/* Takes quarantined reservation `r` (at *pp) out, aborts and frees it;
 * returns how many slots it gave back. */
static uint32_t q_resv_drop(kvd_service_t *svc, svc_resv_t **pp)
{
    svc_resv_t *r = *pp;
    *pp = r->next;
    svc->n_q_resvs--;
    svc->q_bytes -= r->open * r->object_bytes;
    uint32_t n = (uint32_t)r->open;
    svc_resv_abort_open(svc, r);
    svc_resv_free(r);
    return n;
}

/* Whether this thread's caller may acknowledge a record of `session`,
 * created by a caller bound to `tenant`. */
static bool q_acks(uint64_t session, uint32_t tenant)
{
    return session == svc_caller_session && svc_owns(tenant);
}

bool svc_quarantine_release_lease(kvd_service_t *svc, uint64_t id)
{
    for (svc_lease_t **pp = &svc->q_leases; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->id == id && q_acks((*pp)->session, (*pp)->tenant)) {
            q_lease_drop(svc, pp);
            return true;
        }
    }
    return false;
}

bool svc_quarantine_release_resv(kvd_service_t *svc, uint64_t id,
                                 uint32_t *aborted_out)
{
    for (svc_resv_t **pp = &svc->q_resvs; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->id == id && q_acks((*pp)->session, (*pp)->tenant)) {
            *aborted_out = q_resv_drop(svc, pp);
            return true;
        }
    }
    return false;
}

/* Gives back what session `session` (or every session, with 0) has in
 * quarantine. `mu` held. */
static void q_drop_session(kvd_service_t *svc, uint64_t session)
{
    svc_lease_t **lp = &svc->q_leases;
    while (*lp != NULL) {
        if (session == 0 || (*lp)->session == session) {
            q_lease_drop(svc, lp);
        } else {
            lp = &(*lp)->next;
        }
    }
    svc_resv_t **rp = &svc->q_resvs;
    while (*rp != NULL) {
        if (session == 0 || (*rp)->session == session) {
            (void)q_resv_drop(svc, rp);
        } else {
            rp = &(*rp)->next;
        }
    }
}

void svc_quarantine_drop_all(kvd_service_t *svc)
{
    q_drop_session(svc, 0);
}

kvd_status_t kvd_service_session_open(kvd_service_t *svc, uint64_t session)
{
    if (svc == NULL || session == 0) {
        return KVD_ERR_INVALID;
    }
    kvd_status_t s = KVD_OK;
    pthread_mutex_lock(&svc->mu);
    if (svc->n_sessions == svc->cap_sessions) {
        size_t cap = svc->cap_sessions ? svc->cap_sessions * 2 : 64;
        uint64_t *p = realloc(svc->sessions, cap * sizeof *p);
        if (p == NULL) {
            s = KVD_ERR_NOMEM;
        } else {
            svc->sessions = p;
            svc->cap_sessions = cap;
        }
    }
    if (s == KVD_OK) {
        svc->sessions[svc->n_sessions++] = session;
    }
    pthread_mutex_unlock(&svc->mu);
    return s;
}

void kvd_service_session_close(kvd_service_t *svc, uint64_t session)
{
    if (svc == NULL || session == 0) {
        return;
    }
    pthread_mutex_lock(&svc->mu);
    for (size_t i = 0; i < svc->n_sessions; i++) {
        if (svc->sessions[i] == session) {
            svc->sessions[i] = svc->sessions[--svc->n_sessions];
            break;
        }
    }
    q_drop_session(svc, session);
    pthread_mutex_unlock(&svc->mu);
}
