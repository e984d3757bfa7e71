/*
 * Stats and the Admin calls (the operator calls of client/client.h, for
 * the kvdepot CLI). Each sends the deferred releases first, so that the
 * daemon's answer counts them, and an Admin reply must answer the op that
 * was asked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client/client_int.h"

_Static_assert(sizeof(((kvd_client_tenant_usage_t *)0)->name) ==
                   KVD_PROTO_MAX_ID_BYTES + 1,
               "a tenant name as the schema bounds it, and its NUL");

kvd_status_t kvd_client_stats(kvd_client_t *c, kvd_store_stats_t *out)
{
    kvd_cl_flush_releases(c);
    kvd_pb_stats_request_t rq = KVDEPOT__V1__STATS_REQUEST__INIT;
    kvd_pb_stats_response_t *rsp = NULL;
    uint64_t used;
    kvd_status_t s = kvd_cl_call(c, CL_STATS, KVD_PROTO_MSG_STATS_REQUEST,
                                 &rq.base, KVD_PROTO_MSG_STATS_RESPONSE,
                                 (ProtobufCMessage **)&rsp, &used, true);
    if (s != KVD_OK) {
        return s;
    }
    memset(out, 0, sizeof *out);
    for (size_t i = 0; i < rsp->n_tiers; i++) {
        const kvd_pb_tier_stats_t *t = rsp->tiers[i];
        kvd_store_tier_stats_t *d =
            t->tier == KVDEPOT__V1__TIER__TIER_HOST ? &out->host : &out->disk;
        d->capacity_bytes = t->capacity_bytes;
        d->bytes = t->used_bytes;
        d->objects = t->num_objects;
        d->hits = t->hits;
        d->misses = t->misses;
        d->evictions = t->evictions;
        d->bytes_read = t->bytes_read;
        d->bytes_written = t->bytes_written;
        /* A daemon before revision 5 sends no `errors`: its checksum
         * errors are the ones it knows of. */
        d->errors =
            t->errors > t->checksum_errors ? t->errors : t->checksum_errors;
        out->checksum_errors += t->checksum_errors;
    }
    out->leases = rsp->active_leases;
    out->dropped_writes = rsp->dropped_writes;
    out->writes_pending = rsp->writes_pending;
    out->admission_rejects = rsp->admission_rejects;
    kvd_proto_stats_response_free(rsp);
    return KVD_OK;
}

static kvd_status_t cl_admin(kvd_client_t *c, kvd_pb_admin_request_t *rq,
                             kvd_pb_admin_response_t **rsp)
{
    kvd_cl_flush_releases(c);
    uint64_t used;
    kvd_status_t s = kvd_cl_call(c, CL_ADMIN, KVD_PROTO_MSG_ADMIN_REQUEST,
                                 &rq->base, KVD_PROTO_MSG_ADMIN_RESPONSE,
                                 (ProtobufCMessage **)rsp, &used, true);
    if (s == KVD_OK && (int)(*rsp)->result_case != (int)rq->op_case) {
        kvd_proto_admin_response_free(*rsp);
        *rsp = NULL;
        return KVD_ERR_PROTO;
    }
    return s;
}

kvd_status_t kvd_client_flush(kvd_client_t *c, int timeout_ms)
{
    kvd_pb_flush_t f = KVDEPOT__V1__FLUSH__INIT;
    f.timeout_ms = timeout_ms < 0 ? KVD_PROTO_MAX_TTL_MS : (uint32_t)timeout_ms;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_FLUSH;
    rq.flush = &f;
    kvd_pb_admin_response_t *rsp = NULL;
    kvd_status_t s = cl_admin(c, &rq, &rsp);
    kvd_proto_admin_response_free(rsp);
    return s;
}

kvd_status_t kvd_client_list(kvd_client_t *c, kvd_client_ns_usage_t **ns_out,
                             size_t *num_ns_out,
                             kvd_client_tenant_usage_t **tenants_out,
                             size_t *num_tenants_out, bool *truncated_out)
{
    kvd_pb_list_namespaces_t op = KVDEPOT__V1__LIST_NAMESPACES__INIT;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_LIST_NAMESPACES;
    rq.list_namespaces = &op;
    kvd_pb_admin_response_t *rsp = NULL;
    kvd_status_t s = cl_admin(c, &rq, &rsp);
    if (s != KVD_OK) {
        return s;
    }
    const kvd_pb_list_namespaces_reply_t *r = rsp->list_namespaces;
    kvd_client_ns_usage_t *ns = calloc(r->n_namespaces + 1, sizeof *ns);
    kvd_client_tenant_usage_t *tn = calloc(r->n_tenants + 1, sizeof *tn);
    if (ns == NULL || tn == NULL) {
        free(ns);
        free(tn);
        kvd_proto_admin_response_free(rsp);
        return KVD_ERR_NOMEM;
    }
    for (size_t i = 0; i < r->n_namespaces; i++) {
        memcpy(ns[i].ns.bytes, r->namespaces[i]->namespace_id.data,
               sizeof ns[i].ns.bytes);
        ns[i].host_objects = r->namespaces[i]->host_objects;
        ns[i].disk_objects = r->namespaces[i]->disk_objects;
        ns[i].bytes = r->namespaces[i]->bytes;
    }
    for (size_t i = 0; i < r->n_tenants; i++) {
        tn[i].tenant = r->tenants[i]->tenant_id;
        tn[i].objects = r->tenants[i]->objects;
        tn[i].bytes = r->tenants[i]->bytes;
        /* Validated: at most KVD_PROTO_MAX_ID_BYTES. */
        snprintf(tn[i].name, sizeof tn[i].name, "%s",
                 r->tenants[i]->tenant_name);
    }
    *ns_out = ns;
    *num_ns_out = r->n_namespaces;
    *tenants_out = tn;
    *num_tenants_out = r->n_tenants;
    *truncated_out = r->truncated;
    kvd_proto_admin_response_free(rsp);
    return KVD_OK;
}

kvd_status_t kvd_client_drop_namespace(kvd_client_t *c,
                                       const kvd_namespace_t *ns,
                                       uint64_t *dropped_out)
{
    kvd_pb_drop_namespace_t op = KVDEPOT__V1__DROP_NAMESPACE__INIT;
    op.namespace_id.data = (uint8_t *)ns->bytes;
    op.namespace_id.len = sizeof ns->bytes;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_DROP_NAMESPACE;
    rq.drop_namespace = &op;
    kvd_pb_admin_response_t *rsp = NULL;
    kvd_status_t s = cl_admin(c, &rq, &rsp);
    if (s == KVD_OK) {
        *dropped_out = rsp->drop_namespace->num_objects_dropped;
    }
    kvd_proto_admin_response_free(rsp);
    return s;
}

kvd_status_t kvd_client_drain(kvd_client_t *c, bool enable,
                              uint64_t *leases_out, uint64_t *reservations_out)
{
    kvd_pb_drain_t op = KVDEPOT__V1__DRAIN__INIT;
    op.enable = enable;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_DRAIN;
    rq.drain = &op;
    kvd_pb_admin_response_t *rsp = NULL;
    kvd_status_t s = cl_admin(c, &rq, &rsp);
    if (s == KVD_OK) {
        *leases_out = rsp->drain->active_leases;
        *reservations_out = rsp->drain->active_reservations;
    }
    kvd_proto_admin_response_free(rsp);
    return s;
}

kvd_status_t kvd_client_drop_tenant(kvd_client_t *c, const char *tenant,
                                    uint64_t *dropped_out)
{
    if (tenant == NULL || dropped_out == NULL ||
        strlen(tenant) > KVD_PROTO_MAX_ID_BYTES) {
        return KVD_ERR_INVALID;
    }
    kvd_pb_drop_tenant_t op = KVDEPOT__V1__DROP_TENANT__INIT;
    op.tenant = (char *)tenant;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_DROP_TENANT;
    rq.drop_tenant = &op;
    kvd_pb_admin_response_t *rsp = NULL;
    kvd_status_t s = cl_admin(c, &rq, &rsp);
    if (s == KVD_OK) {
        *dropped_out = rsp->drop_tenant->num_objects_dropped;
    }
    kvd_proto_admin_response_free(rsp);
    return s;
}

kvd_status_t kvd_client_config_dump(kvd_client_t *c, char **text_out)
{
    if (text_out == NULL) {
        return KVD_ERR_INVALID;
    }
    *text_out = NULL;
    kvd_pb_config_dump_t d = KVDEPOT__V1__CONFIG_DUMP__INIT;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_CONFIG_DUMP;
    rq.config_dump = &d;
    kvd_pb_admin_response_t *rsp = NULL;
    kvd_status_t s = cl_admin(c, &rq, &rsp);
    if (s == KVD_OK) {
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        if (f == NULL) {
            s = KVD_ERR_NOMEM;
        }
        for (size_t i = 0; f != NULL && i < rsp->config_dump->n_entries; i++) {
            const kvd_pb_config_entry_t *e = rsp->config_dump->entries[i];
            fprintf(f, "%s = %s  # from: %s\n", e->key, e->value, e->source);
        }
        if (f != NULL) {
            bool failed = ferror(f) != 0;
            if (fclose(f) != 0 || failed) {
                s = KVD_ERR_NOMEM;
            }
        }
        if (s == KVD_OK) {
            *text_out = text;
        } else {
            free(text);
        }
    }
    kvd_proto_admin_response_free(rsp);
    return s;
}

kvd_status_t kvd_client_pin(kvd_client_t *c, const kvd_store_key_t *keys,
                            size_t num, bool pinned, size_t *num_done_out,
                            size_t *num_missing_out)
{
    size_t done = 0, missing = 0;
    kvd_status_t s = KVD_OK;
    /* One call per run of keys of one namespace, at most
     * KVD_PROTO_MAX_PIN_KEYS each. */
    for (size_t i = 0; i < num && s == KVD_OK;) {
        size_t n = 1;
        while (i + n < num && n < KVD_PROTO_MAX_PIN_KEYS &&
               memcmp(&keys[i + n].ns, &keys[i].ns, sizeof keys[i].ns) == 0) {
            n++;
        }
        ProtobufCBinaryData *h = calloc(n, sizeof *h);
        if (h == NULL) {
            s = KVD_ERR_NOMEM;
            break;
        }
        for (size_t k = 0; k < n; k++) {
            h[k].data = (uint8_t *)keys[i + k].hash.bytes;
            h[k].len = KVD_SHA256_BYTES;
        }
        kvd_pb_pin_t op = KVDEPOT__V1__PIN__INIT;
        op.namespace_id.data = (uint8_t *)keys[i].ns.bytes;
        op.namespace_id.len = KVD_NAMESPACE_BYTES;
        op.n_block_hashes = n;
        op.block_hashes = h;
        op.pinned = pinned;
        kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
        rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_PIN;
        rq.pin = &op;
        kvd_pb_admin_response_t *rsp = NULL;
        s = cl_admin(c, &rq, &rsp);
        free(h);
        if (s == KVD_OK) {
            done += rsp->pin->num_done;
            missing += rsp->pin->num_missing;
            if (rsp->pin->quota_reached) {
                s = KVD_ERR_QUOTA;
            }
        }
        kvd_proto_admin_response_free(rsp);
        i += n;
    }
    if (num_done_out != NULL) {
        *num_done_out = done;
    }
    if (num_missing_out != NULL) {
        *num_missing_out = missing;
    }
    return s;
}

kvd_status_t kvd_client_cluster_nodes(kvd_client_t *c,
                                      kvd_client_cluster_t *out)
{
    if (out == NULL) {
        return KVD_ERR_INVALID;
    }
    memset(out, 0, sizeof *out);
    kvd_pb_cluster_nodes_t op = KVDEPOT__V1__CLUSTER_NODES__INIT;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_CLUSTER_NODES;
    rq.cluster_nodes = &op;
    kvd_pb_admin_response_t *rsp = NULL;
    kvd_status_t s = cl_admin(c, &rq, &rsp);
    if (s != KVD_OK) {
        return s;
    }
    const kvd_pb_cluster_nodes_reply_t *r = rsp->cluster_nodes;
    out->clustered = r->clustered;
    out->stale = r->stale;
    out->registered = r->registered;
    out->truncated = r->truncated;
    out->generation = r->generation;
    out->reconnects = r->reconnects;
    snprintf(out->self, sizeof out->self, "%s", r->self_node_id);
    if (r->n_nodes > 0) {
        out->nodes = calloc(r->n_nodes, sizeof *out->nodes);
        if (out->nodes == NULL) {
            kvd_proto_admin_response_free(rsp);
            return KVD_ERR_NOMEM;
        }
    }
    for (size_t i = 0; i < r->n_nodes; i++) {
        const kvd_pb_cluster_node_t *n = r->nodes[i];
        kvd_client_node_t *o = &out->nodes[i];
        /* The reply was validated: every text fits its field. */
        snprintf(o->node_id, sizeof o->node_id, "%s", n->node_id);
        snprintf(o->grpc_address, sizeof o->grpc_address, "%s",
                 n->grpc_address);
        snprintf(o->version, sizeof o->version, "%s", n->version);
        o->capacity_bytes = n->capacity_bytes;
        o->protocol_revision = n->protocol_revision;
        o->ucx = n->ucx;
    }
    out->num_nodes = r->n_nodes;
    kvd_proto_admin_response_free(rsp);
    return KVD_OK;
}

kvd_status_t kvd_client_ping(kvd_client_t *c, char *version, size_t version_len,
                             char *node_id, size_t node_len)
{
    kvd_pb_ping_t p = KVDEPOT__V1__PING__INIT;
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_PING;
    rq.ping = &p;
    kvd_pb_admin_response_t *rsp = NULL;
    kvd_status_t s = cl_admin(c, &rq, &rsp);
    if (s == KVD_OK) {
        snprintf(version, version_len, "%s", rsp->ping->version);
        snprintf(node_id, node_len, "%s", rsp->ping->node_id);
    }
    kvd_proto_admin_response_free(rsp);
    return s;
}

/* One Admin events call: the watched namespaces' events after *seq into
 * out (at most max, at most KVD_PROTO_MAX_EVENTS). `ev_mu` held. */
static kvd_status_t cl_events_call(kvd_client_t *c, kvd_store_event_t *out,
                                   size_t max, size_t *n_out,
                                   uint64_t *missed_out)
{
    ProtobufCBinaryData ids[KVD_STORE_EVENTS_WATCH_MAX];
    for (size_t i = 0; i < c->ev_n_watch; i++) {
        ids[i].data = c->ev_watch[i].bytes;
        ids[i].len = KVD_NAMESPACE_BYTES;
    }
    kvd_pb_events_t op = KVDEPOT__V1__EVENTS__INIT;
    op.n_namespace_ids = c->ev_n_watch;
    op.namespace_ids = ids;
    op.after_seq = c->ev_seq;
    op.max_events =
        (uint32_t)(max < KVD_PROTO_MAX_EVENTS ? max : KVD_PROTO_MAX_EVENTS);
    kvd_pb_admin_request_t rq = KVDEPOT__V1__ADMIN_REQUEST__INIT;
    rq.op_case = KVDEPOT__V1__ADMIN_REQUEST__OP_EVENTS;
    rq.events = &op;
    kvd_pb_admin_response_t *rsp = NULL;
    kvd_status_t s = cl_admin(c, &rq, &rsp);
    if (s != KVD_OK) {
        return s;
    }
    const kvd_pb_events_reply_t *r = rsp->events;
    size_t n = 0;
    for (size_t i = 0; i < r->n_events && n < max; i++) {
        const kvd_pb_store_event_t *e = r->events[i];
        if (e->namespace_index >= c->ev_n_watch) {
            s = KVD_ERR_PROTO; /* names a namespace we did not ask for */
            break;
        }
        out[n].key.ns = c->ev_watch[e->namespace_index];
        memcpy(out[n].key.hash.bytes, e->block_hash.data, KVD_SHA256_BYTES);
        out[n].kind =
            e->removed ? KVD_STORE_EVENT_REMOVED : KVD_STORE_EVENT_STORED;
        n++;
    }
    if (s == KVD_OK) {
        /* A number below the one we read on from: the daemon restarted and
         * numbers its new log from 1. Read that log from its start (the
         * caller repeats the call), rather than skip its first events. */
        bool restarted =
            op.after_seq != UINT64_MAX && r->next_seq < op.after_seq;
        c->ev_seq = restarted ? 0 : r->next_seq;
        *n_out = restarted ? 0 : n;
        *missed_out = r->missed;
        s = restarted ? KVD_AGAIN : KVD_OK;
    }
    kvd_proto_admin_response_free(rsp);
    return s;
}

kvd_status_t kvd_client_events_enable(kvd_client_t *c, size_t capacity)
{
    pthread_mutex_lock(&c->ev_mu);
    kvd_status_t s = KVD_OK;
    if (capacity == 0) {
        c->ev_on = false;
    } else {
        /* Read from now on: past the newest number, the daemon answers
         * with the newest. */
        c->ev_seq = UINT64_MAX;
        size_t n = 0;
        uint64_t missed = 0;
        s = cl_events_call(c, NULL, 0, &n, &missed);
        c->ev_on = s == KVD_OK;
    }
    pthread_mutex_unlock(&c->ev_mu);
    return s;
}

kvd_status_t kvd_client_take_events(kvd_client_t *c, kvd_store_event_t *out,
                                    size_t max, size_t *n_out,
                                    uint64_t *dropped_out)
{
    *n_out = 0;
    if (dropped_out != NULL) {
        *dropped_out = 0;
    }
    pthread_mutex_lock(&c->ev_mu);
    kvd_status_t s = KVD_OK;
    if (c->ev_on && c->ev_n_watch > 0 && max > 0) {
        uint64_t missed = 0;
        s = cl_events_call(c, out, max, n_out, &missed);
        if (s == KVD_AGAIN) { /* a new daemon: from its first event */
            s = cl_events_call(c, out, max, n_out, &missed);
        }
        if (s == KVD_OK && dropped_out != NULL) {
            *dropped_out = missed;
        }
    }
    pthread_mutex_unlock(&c->ev_mu);
    return s;
}

kvd_status_t kvd_client_events_watch(kvd_client_t *c, const kvd_namespace_t *ns,
                                     size_t num)
{
    pthread_mutex_lock(&c->ev_mu);
    if (num > 0) {
        memcpy(c->ev_watch, ns, num * sizeof *ns);
    }
    c->ev_n_watch = num;
    pthread_mutex_unlock(&c->ev_mu);
    return KVD_OK;
}
