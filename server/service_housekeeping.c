/*
 * The service's housekeeping thread, the store's only poller (as
 * store/engine.h requires): it applies the completions of the gets the
 * handlers submitted (a PENDING block becomes HELD or FAILED; a dead
 * record is freed with its last completion), hands the cluster's foreign
 * completions on, and every tick reclaims leases and reservations past
 * their deadline: a crashed client's leases come back after their TTL, and
 * those of a client whose hand-off session is still open are quarantined
 * (service_quarantine.c).
 * At destroy, svc_reclaim_all ends what is left and drains the gets still
 * in flight.
 */
#include <pthread.h>

#include "common/log_int.h"
#include "common/time_int.h"
#include "server/svc_int.h"

/* Applies one store get completion. `mu` held. */
void svc_complete(kvd_service_t *svc, const kvd_store_completion_t *c)
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
        svc_lease_free(l);
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
                svc_lease_unlink(svc, l);
                svc_lease_expire(svc, l);
                svc_count(&svc->leases_expired, 1);
            }
            l = next;
        }
        svc_resv_t *r = svc->resvs[b];
        while (r != NULL) {
            svc_resv_t *next = r->next;
            if (r->deadline_ns <= now) {
                KVD_LOG_DEBUG("service: reservation %llu expired",
                              (unsigned long long)r->id);
                svc_resv_unlink(svc, r);
                svc_resv_expire(svc, r);
                svc_count(&svc->resvs_expired, 1);
            }
            r = next;
        }
    }
}

void *svc_main(void *arg)
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
            svc_events_pull(svc);
            next_tick = now + (uint64_t)svc->cfg.tick_ms * 1000000u;
            /* Proof of life for the systemd watchdog (main.c): the store
             * answered its poll and the service's lock was free. */
            __atomic_store_n(&svc->heartbeat_ns, kvd_time_now_ns(),
                             __ATOMIC_RELEASE);
        }
    }
    return NULL;
}

/* Ends every lease and reservation, then drains the gets still in flight.
 * `mu` held. */
void svc_reclaim_all(kvd_service_t *svc)
{
    for (size_t b = 0; b < SVC_BUCKETS; b++) {
        while (svc->leases[b] != NULL) {
            svc_lease_t *l = svc->leases[b];
            svc_lease_unlink(svc, l);
            svc_lease_drop(svc, l);
        }
        while (svc->resvs[b] != NULL) {
            svc_resv_t *r = svc->resvs[b];
            svc_resv_abort_open(svc, r);
            svc_resv_unlink(svc, r);
            svc_resv_free(r);
        }
    }
    svc_quarantine_drop_all(svc);
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
            svc_lease_free(l);
        }
    }
}
