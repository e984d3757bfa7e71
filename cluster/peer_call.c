/*
 * This node's calls on the data plane (cluster/peer.h): kvd_peer_lookup,
 * kvd_peer_fetch and kvd_peer_offer, and the operations they hand the
 * progress thread (cluster/peer_int.h for the reference rules).
 *
 * A call builds one operation per node, puts them into the table (where
 * answers find them) and the queue, wakes the progress thread and waits on
 * its condition variable until every operation finished or the deadline
 * passed; then it copies the results out and never touches the caller's
 * memory again. A FETCH reserves the arena slots here first; how each of
 * its keys ends (committed with its verified checksum, or aborted) is
 * decided here too, for the answers peer_recv.c applies.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cluster/peer_int.h"
#include "common/endian_int.h"
#include "common/time_int.h"
#include "proto/kvd_proto.h"
#include "store/engine.h"

#define PEER_QUEUE_MAX 4096u

struct peer_call {
    pthread_cond_t cv;
    size_t pending; /* operations not finished */
};

static void rx_free(peer_rx_t *rx)
{
    if (rx != NULL) {
        kvd_xxh3_stream_free(rx->hash);
        free(rx);
    }
}

static void op_free(peer_op_t *op)
{
    if (op->rx != NULL) {
        for (size_t i = 0; i < op->n; i++) {
            rx_free(op->rx[i]);
        }
    }
    free(op->rx);
    free(op->addr);
    free(op->body);
    free(op->hashes);
    free(op->sizes);
    free(op->offsets);
    free(op->checksums);
    free(op->status);
    free(op->batch_index);
    free(op->state);
    free(op);
}

/* Under mu. */
void kvd_peer_op_unref(peer_op_t *op)
{
    if (--op->refs == 0) {
        op_free(op);
    }
}

/* Under mu. */
void kvd_peer_table_remove(kvd_peer_t *p, peer_op_t *op)
{
    if (!op->in_table) {
        return;
    }
    peer_op_t **pp = &p->table[op->id % PEER_BUCKETS];
    while (*pp != NULL && *pp != op) {
        pp = &(*pp)->next;
    }
    if (*pp == op) {
        *pp = op->next;
    }
    op->in_table = false;
    kvd_peer_op_unref(op);
}

/* Under mu. */
peer_op_t *kvd_peer_table_find(kvd_peer_t *p, uint64_t id)
{
    for (peer_op_t *op = p->table[id % PEER_BUCKETS]; op != NULL;
         op = op->next) {
        if (op->id == id) {
            return op;
        }
    }
    return NULL;
}

/* The operation is over for its caller (under mu). It stays in the table
 * while bytes are still arriving into its slots. */
void kvd_peer_op_finish(kvd_peer_t *p, peer_op_t *op)
{
    if (!op->finished) {
        op->finished = true;
        if (op->call != NULL && op->call->pending > 0) {
            op->call->pending--;
            pthread_cond_broadcast(&op->call->cv);
        }
    }
    if (op->receiving == 0) {
        kvd_peer_table_remove(p, op);
    }
}

static kvd_store_key_t op_key(const peer_op_t *op, size_t i)
{
    kvd_store_key_t k;
    k.ns = op->ns;
    k.hash = op->hashes[i];
    return k;
}

/* A fetched key reached its end (under mu): committed when `s` is KVD_OK,
 * else its slot goes back. */
void kvd_peer_entry_done(kvd_peer_t *p, peer_op_t *op, size_t i, kvd_status_t s)
{
    if (op->state[i] == ENTRY_DONE) {
        return;
    }
    if (op->state[i] == ENTRY_RECV) {
        op->receiving--;
    }
    if (op->state[i] == ENTRY_PARTS) {
        rx_free(op->rx[i]);
        op->rx[i] = NULL;
    }
    op->state[i] = ENTRY_DONE;
    kvd_store_key_t k = op_key(op, i);
    if (s == KVD_OK) { /* verified: the store keeps the checksum */
        s = kvd_store_commit_checksum(p->cfg.store, &k, op->checksums[i]);
        if (s == KVD_OK) {
            kvd_peer_stat_add(p, &p->stats.objects_fetched, 1);
            kvd_peer_stat_add(p, &p->stats.bytes_fetched, op->sizes[i]);
        }
    } else {
        (void)kvd_store_abort(p->cfg.store, &k, 1, NULL);
    }
    op->status[i] = s;
    if (op->remaining > 0) {
        op->remaining--;
    }
    if (op->remaining == 0 || (op->finished && op->receiving == 0)) {
        kvd_peer_op_finish(p, op);
    }
}

/* The whole operation failed with `s` (under mu): keys not yet arriving
 * and keys arriving in parts fail now (no part is written after this);
 * keys arriving by rendezvous finish when UCX says so. */
void kvd_peer_op_fail(kvd_peer_t *p, peer_op_t *op, kvd_status_t s)
{
    if (op->finished && op->receiving == 0) {
        return;
    }
    if (op->result == KVD_OK) {
        op->result = s;
    }
    if (op->kind == KVD_PEER_OP_FETCH) {
        for (size_t i = 0; i < op->n; i++) {
            if (op->state[i] == ENTRY_WAIT || op->state[i] == ENTRY_PARTS) {
                kvd_peer_entry_done(p, op, i, s);
            }
        }
    }
    kvd_peer_op_finish(p, op);
}

static peer_op_t *op_new(kvd_peer_t *p, uint16_t kind, const uint8_t *addr,
                         size_t addr_len, const kvd_namespace_t *ns, size_t n)
{
    peer_op_t *op = calloc(1, sizeof *op);
    if (op == NULL) {
        return NULL;
    }
    op->kind = kind;
    op->ns = *ns;
    op->n = n;
    op->addr = malloc(addr_len ? addr_len : 1);
    op->hashes = calloc(n, sizeof *op->hashes);
    op->sizes = calloc(n, sizeof *op->sizes);
    if (op->addr == NULL || op->hashes == NULL || op->sizes == NULL) {
        op_free(op);
        return NULL;
    }
    memcpy(op->addr, addr, addr_len);
    op->addr_len = addr_len;
    (void)p;
    return op;
}

/* Puts prepared operations into the table and the queue (one caller
 * reference each is already counted) and wakes the thread. */
static kvd_status_t ops_submit(kvd_peer_t *p, peer_op_t **ops, size_t n)
{
    pthread_mutex_lock(&p->mu);
    if (p->queued + n > PEER_QUEUE_MAX) {
        pthread_mutex_unlock(&p->mu);
        return KVD_ERR_BUSY;
    }
    for (size_t i = 0; i < n; i++) {
        peer_op_t *op = ops[i];
        op->id = ++p->next_id;
        kvd_peer_hdr_t h;
        kvd_peer_hdr_init(p, &h, op->kind, op->id, &op->ns);
        h.count = (uint32_t)op->n;
        if (op->kind == KVD_PEER_OP_OFFER) {
            h.size = op->tenant;
        } else if (op->kind == KVD_PEER_OP_FETCH) {
            h.size = p->cfg.part_bytes;
        }
        kvd_peer_hdr_encode(&h, op->hdr);
        op->refs += 2; /* the table's and the queue's (then the send's) */
        op->in_table = op->kind != KVD_PEER_OP_OFFER;
        if (!op->in_table) {
            op->refs--;
        } else {
            op->next = p->table[op->id % PEER_BUCKETS];
            p->table[op->id % PEER_BUCKETS] = op;
        }
        op->qnext = NULL;
        if (p->queue_tail != NULL) {
            p->queue_tail->qnext = op;
        } else {
            p->queue = op;
        }
        p->queue_tail = op;
        p->queued++;
    }
    pthread_mutex_unlock(&p->mu);
    (void)ucp_worker_signal(p->worker);
    return KVD_OK;
}

/* Waits for the call's operations; at the deadline the ones not finished
 * fail with KVD_ERR_TIMEOUT. */
static void call_wait(kvd_peer_t *p, peer_call_t *call, peer_op_t **ops,
                      size_t n, uint64_t deadline_ns)
{
    pthread_mutex_lock(&p->mu);
    while (call->pending > 0) {
        uint64_t now = kvd_time_now_ns();
        if (now >= deadline_ns) {
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t wait = deadline_ns - now;
        uint64_t ns = (uint64_t)ts.tv_nsec + wait % KVD_NSEC_PER_SEC;
        ts.tv_sec += (time_t)(wait / KVD_NSEC_PER_SEC + ns / KVD_NSEC_PER_SEC);
        ts.tv_nsec = (long)(ns % KVD_NSEC_PER_SEC);
        (void)pthread_cond_timedwait(&call->cv, &p->mu, &ts);
    }
    bool timed_out = false;
    for (size_t i = 0; i < n; i++) {
        if (ops[i] != NULL && !ops[i]->finished) {
            timed_out = true;
            kvd_peer_op_fail(p, ops[i], KVD_ERR_TIMEOUT);
        }
        if (ops[i] != NULL) {
            ops[i]->call = NULL;
        }
    }
    pthread_mutex_unlock(&p->mu);
    if (timed_out) {
        kvd_peer_stat_add(p, &p->stats.timeouts, 1);
    }
}

static void call_init(peer_call_t *call)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&call->cv, &ca);
    pthread_condattr_destroy(&ca);
    call->pending = 0;
}

static bool batch_ok(const kvd_peer_batch_t *b, bool fetch)
{
    return b->address != NULL && b->address_len > 0 && b->hashes != NULL &&
           b->n >= 1 && b->n <= KVD_PEER_MAX_KEYS && b->sizes != NULL &&
           (!fetch || b->status != NULL);
}

kvd_status_t kvd_peer_lookup(kvd_peer_t *p, const kvd_namespace_t *ns,
                             kvd_peer_batch_t *batches, size_t nb,
                             uint64_t deadline_ns)
{
    if (p == NULL || ns == NULL || (batches == NULL && nb > 0)) {
        return KVD_ERR_INVALID;
    }
    for (size_t b = 0; b < nb; b++) {
        if (!batch_ok(&batches[b], false)) {
            return KVD_ERR_INVALID;
        }
    }
    peer_op_t **ops = calloc(nb ? nb : 1, sizeof *ops);
    if (ops == NULL) {
        return KVD_ERR_NOMEM;
    }
    peer_call_t call;
    call_init(&call);
    kvd_status_t s = KVD_OK;
    for (size_t b = 0; b < nb; b++) {
        kvd_peer_batch_t *bt = &batches[b];
        memset(bt->sizes, 0, bt->n * sizeof *bt->sizes);
        peer_op_t *op = op_new(p, KVD_PEER_OP_LOOKUP, bt->address,
                               bt->address_len, ns, bt->n);
        if (op != NULL && (op->body = malloc(bt->n * 32)) == NULL) {
            op_free(op);
            op = NULL;
        }
        if (op == NULL) {
            s = KVD_ERR_NOMEM;
            break;
        }
        memcpy(op->body, bt->hashes, bt->n * 32);
        op->body_len = bt->n * 32;
        op->refs = 1;
        op->call = &call;
        ops[b] = op;
    }
    if (s == KVD_OK) {
        call.pending = nb;
        s = ops_submit(p, ops, nb);
    }
    if (s != KVD_OK) {
        for (size_t b = 0; b < nb; b++) {
            if (ops[b] != NULL) {
                op_free(ops[b]);
            }
        }
        free(ops);
        pthread_cond_destroy(&call.cv);
        return s;
    }
    call_wait(p, &call, ops, nb, deadline_ns);
    pthread_mutex_lock(&p->mu);
    for (size_t b = 0; b < nb; b++) {
        batches[b].result = ops[b]->result;
        if (ops[b]->result == KVD_OK) {
            memcpy(batches[b].sizes, ops[b]->sizes,
                   batches[b].n * sizeof *batches[b].sizes);
        } else if (s == KVD_OK) {
            s = ops[b]->result;
        }
        kvd_peer_op_unref(ops[b]);
    }
    pthread_mutex_unlock(&p->mu);
    free(ops);
    pthread_cond_destroy(&call.cv);
    return s;
}

/* Reserves a slot per key of `bt` and builds the FETCH for those reserved;
 * *op_out stays NULL when none needs fetching. */
static kvd_status_t fetch_prepare(kvd_peer_t *p, const kvd_namespace_t *ns,
                                  uint32_t tenant, kvd_peer_batch_t *bt,
                                  peer_op_t **op_out)
{
    *op_out = NULL;
    peer_op_t *op =
        op_new(p, KVD_PEER_OP_FETCH, bt->address, bt->address_len, ns, bt->n);
    if (op == NULL) {
        return KVD_ERR_NOMEM;
    }
    op->offsets = calloc(bt->n, sizeof *op->offsets);
    op->checksums = calloc(bt->n, sizeof *op->checksums);
    op->status = calloc(bt->n, sizeof *op->status);
    op->batch_index = calloc(bt->n, sizeof *op->batch_index);
    op->state = calloc(bt->n, 1);
    op->rx = calloc(bt->n, sizeof *op->rx);
    /* The body: this worker's address (the objects come to it), then the
     * entries. */
    size_t head = 2 + p->address_len;
    op->body = malloc(head + bt->n * 40);
    if (op->offsets == NULL || op->checksums == NULL || op->status == NULL ||
        op->batch_index == NULL || op->state == NULL || op->rx == NULL ||
        op->body == NULL) {
        op_free(op);
        return KVD_ERR_NOMEM;
    }
    size_t k = 0;
    for (size_t i = 0; i < bt->n; i++) {
        if (bt->sizes[i] == 0 || bt->sizes[i] > KVD_PROTO_MAX_OBJECT_BYTES) {
            bt->status[i] = KVD_ERR_INVALID;
            continue;
        }
        kvd_store_reservation_t r;
        kvd_status_t s = kvd_store_reserve(p->cfg.store, ns, &bt->hashes[i], 1,
                                           bt->sizes[i], tenant, &r);
        if (s == KVD_OK) {
            s = r.status;
        }
        bt->status[i] = s;
        if (s != KVD_OK) {
            continue;
        }
        op->hashes[k] = bt->hashes[i];
        op->sizes[k] = bt->sizes[i];
        op->offsets[k] = r.arena_offset;
        op->batch_index[k] = i;
        memcpy(op->body + head + k * 40, bt->hashes[i].bytes, 32);
        kvd_put_le64(op->body + head + k * 40 + 32, bt->sizes[i]);
        k++;
    }
    if (k == 0) {
        op_free(op);
        return KVD_OK;
    }
    kvd_put_le16(op->body, (uint16_t)p->address_len);
    memcpy(op->body + 2, p->address, p->address_len);
    op->n = op->remaining = k;
    op->body_len = head + k * 40;
    op->refs = 1;
    *op_out = op;
    return KVD_OK;
}

/* Gives back the slots of an operation that was never submitted. */
static void fetch_unprepare(kvd_peer_t *p, peer_op_t *op, kvd_peer_batch_t *bt,
                            kvd_status_t s)
{
    for (size_t i = 0; i < op->n; i++) {
        kvd_store_key_t k = op_key(op, i);
        (void)kvd_store_abort(p->cfg.store, &k, 1, NULL);
        bt->status[op->batch_index[i]] = s;
    }
    op_free(op);
}

kvd_status_t kvd_peer_fetch(kvd_peer_t *p, const kvd_namespace_t *ns,
                            uint32_t tenant, kvd_peer_batch_t *batches,
                            size_t nb, uint64_t deadline_ns)
{
    if (p == NULL || ns == NULL || (batches == NULL && nb > 0)) {
        return KVD_ERR_INVALID;
    }
    for (size_t b = 0; b < nb; b++) {
        if (!batch_ok(&batches[b], true)) {
            return KVD_ERR_INVALID;
        }
    }
    peer_op_t **ops = calloc(nb ? nb : 1, sizeof *ops);
    if (ops == NULL) {
        return KVD_ERR_NOMEM;
    }
    /* Which batch each operation belongs to (batches with nothing to
     * fetch have none). */
    size_t *owner = calloc(nb ? nb : 1, sizeof *owner);
    peer_call_t call;
    call_init(&call);
    kvd_status_t s = owner == NULL ? KVD_ERR_NOMEM : KVD_OK;
    size_t live = 0;
    for (size_t b = 0; b < nb && s == KVD_OK; b++) {
        batches[b].result = KVD_OK;
        s = fetch_prepare(p, ns, tenant, &batches[b], &ops[live]);
        if (s == KVD_OK && ops[live] != NULL) {
            ops[live]->call = &call;
            owner[live++] = b;
        }
    }
    if (s == KVD_OK && live > 0) {
        call.pending = live;
        s = ops_submit(p, ops, live);
    }
    if (s != KVD_OK) {
        for (size_t j = 0; j < live; j++) {
            fetch_unprepare(p, ops[j], &batches[owner[j]], s);
        }
        free(owner);
        free(ops);
        pthread_cond_destroy(&call.cv);
        return s;
    }
    call_wait(p, &call, ops, live, deadline_ns);
    pthread_mutex_lock(&p->mu);
    for (size_t j = 0; j < live; j++) {
        peer_op_t *op = ops[j];
        kvd_peer_batch_t *bt = &batches[owner[j]];
        bt->result = op->result;
        for (size_t i = 0; i < op->n; i++) {
            /* Keys still arriving report the timeout; the progress thread
             * commits or aborts them when UCX finishes. */
            bt->status[op->batch_index[i]] =
                op->state[i] == ENTRY_DONE ? op->status[i] : KVD_ERR_TIMEOUT;
        }
        if (op->result != KVD_OK && s == KVD_OK) {
            s = op->result;
        }
        kvd_peer_op_unref(op);
    }
    pthread_mutex_unlock(&p->mu);
    free(owner);
    free(ops);
    pthread_cond_destroy(&call.cv);
    return s;
}

kvd_status_t kvd_peer_offer(kvd_peer_t *p, const uint8_t *address,
                            size_t address_len, const kvd_namespace_t *ns,
                            uint32_t tenant, const kvd_block_hash_t *hashes,
                            const uint64_t *sizes, size_t n)
{
    if (p == NULL || address == NULL || address_len == 0 || ns == NULL ||
        hashes == NULL || sizes == NULL || n == 0 || n > KVD_PEER_MAX_KEYS) {
        return KVD_ERR_INVALID;
    }
    peer_op_t *op = op_new(p, KVD_PEER_OP_OFFER, address, address_len, ns, 1);
    size_t id_len = strlen(p->node_id);
    if (op != NULL && (op->body = malloc(2 + id_len + n * 40)) == NULL) {
        op_free(op);
        op = NULL;
    }
    if (op == NULL) {
        return KVD_ERR_NOMEM;
    }
    kvd_put_le16(op->body, (uint16_t)id_len);
    memcpy(op->body + 2, p->node_id, id_len);
    uint8_t *e = op->body + 2 + id_len;
    for (size_t i = 0; i < n; i++) {
        memcpy(e + i * 40, hashes[i].bytes, 32);
        kvd_put_le64(e + i * 40 + 32, sizes[i]);
    }
    op->body_len = 2 + id_len + n * 40;
    op->n = n; /* the header's count */
    op->tenant = tenant;
    op->refs = 0;
    kvd_status_t s = ops_submit(p, &op, 1);
    if (s != KVD_OK) {
        op_free(op);
        return s;
    }
    kvd_peer_stat_add(p, &p->stats.offers_sent, 1);
    return KVD_OK;
}
