/*
 * The store client's life (client/client.h; its inside is client_int.h):
 * kvd_client_open checks the address, maps the daemon's arena, checks the
 * daemon answers over gRPC and starts the get thread; kvd_client_close
 * stops the thread, gives back what the caller still holds and frees. The
 * calls themselves live in the other files of client/ (client_int.h lists
 * them).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/un.h>

#include "client/client_int.h"
#include "common/log_int.h"
#include "store/ops.h"

kvd_status_t kvd_client_open(const kvd_client_config_t *cfg,
                             kvd_client_t **client_out, char *err,
                             size_t err_len)
{
    if (cfg == NULL || cfg->address == NULL || client_out == NULL ||
        cfg->timeout_ms == 0 || cfg->get_queue == 0) {
        return KVD_ERR_INVALID;
    }
    size_t path_max =
        sizeof(((struct sockaddr_un *)0)->sun_path) - sizeof KVD_HANDOFF_SUFFIX;
    if (strncmp(cfg->address, "unix:", 5) != 0 || cfg->address[5] == '\0' ||
        strlen(cfg->address + 5) >= path_max) {
        kvd_config_err(err, err_len,
                       "store.address \"%s\": want unix:PATH (the daemon's "
                       "socket on this node: the arena is shared through it)",
                       cfg->address);
        return KVD_ERR_INVALID;
    }
    kvd_client_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        return KVD_ERR_NOMEM;
    }
    c->base.ops = &kvd_client_store_ops;
    c->cfg = *cfg;
    snprintf(c->address, sizeof c->address, "%s", cfg->address);
    c->cfg.address = c->address;
    size_t plen = strlen(cfg->address + 5); /* < path_max, checked above */
    memcpy(c->shm_path, cfg->address + 5, plen);
    memcpy(c->shm_path + plen, KVD_HANDOFF_SUFFIX, sizeof KVD_HANDOFF_SUFFIX);
    c->arena_fd = -1;
    c->handoff_fd = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->get_cv, NULL);
    size_t cap = 2;
    while (cap < cfg->get_queue) {
        cap <<= 1;
    }
    kvd_status_t s =
        kvd_ring_create(cap, sizeof(kvd_store_completion_t), &c->cq);
    if (s != KVD_OK) {
        goto err;
    }
    kvd_cl_channel_open(c);
    pthread_mutex_lock(&c->mu);
    s = kvd_cl_arena_map(c, err, err_len);
    pthread_mutex_unlock(&c->mu);
    if (s != KVD_OK) {
        goto err;
    }
    /* The gRPC side answers too (same daemon, same instance). */
    char version[64], node[KVD_PROTO_MAX_NODE_ID_BYTES + 1];
    s = kvd_client_ping(c, version, sizeof version, node, sizeof node);
    if (s != KVD_OK) {
        kvd_config_err(err, err_len, "store.address %s: ping: %s", c->address,
                       kvd_status_str(s));
        goto err;
    }
    int rc = pthread_create(&c->get_thread, NULL, kvd_cl_get_main, c);
    if (rc != 0) {
        s = kvd_status_from_errno(rc);
        goto err;
    }
    c->get_thread_started = true;
    KVD_LOG_INFO("store client: kvdepotd %s (node %s) at %s, arena %llu MiB",
                 version, node, c->address,
                 (unsigned long long)(c->size_bytes >> 20));
    *client_out = c;
    return KVD_OK;
err:
    kvd_client_close(c);
    return s;
}

void kvd_client_close(kvd_client_t *c)
{
    if (c == NULL) {
        return;
    }
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_cond_broadcast(&c->get_cv);
    pthread_mutex_unlock(&c->mu);
    if (c->get_thread_started) {
        pthread_join(c->get_thread, NULL);
    }
    if (c->ch != NULL) {
        kvd_cl_flush_releases(c);
    }
    /* Leases and reservations still held are the daemon's to reclaim at
     * their TTL; give the leases back now to spare it the wait. */
    uint64_t *ids = c->n_groups ? calloc(c->n_groups, sizeof *ids) : NULL;
    size_t k = 0;
    for (uint32_t i = 0; ids != NULL && i < c->n_groups; i++) {
        if (c->groups[i].refs > 0 && c->groups[i].instance == c->instance) {
            ids[k++] = c->groups[i].lease_id;
        }
    }
    for (size_t off = 0; c->ch != NULL && off < k; off += 4096) {
        kvd_cl_release_ids(c, ids + off, k - off < 4096 ? k - off : 4096);
    }
    free(ids);
    for (size_t b = 0; b < CL_BUCKETS; b++) {
        while (c->resv[b] != NULL) {
            cl_resv_t *r = c->resv[b];
            c->resv[b] = r->next;
            free(r);
        }
    }
    kvd_cl_channel_close(c);
    kvd_cl_arena_unmap_all(c);
    kvd_ring_destroy(c->cq);
    free(c->rel);
    free(c->groups);
    free(c->lblocks);
    pthread_cond_destroy(&c->get_cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

kvd_store_t *kvd_client_store(kvd_client_t *c)
{
    return c == NULL ? NULL : &c->base;
}

kvd_client_t *kvd_client_of(kvd_store_t *store)
{
    return store != NULL && store->ops == &kvd_client_store_ops
               ? (kvd_client_t *)store
               : NULL;
}
