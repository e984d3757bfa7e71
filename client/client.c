/*
 * The store client over kvdepotd (client_int.h). The only client file that
 * includes grpc.h.
 *
 * Per call: pack (validated) → one unary call with the deadline and the
 * daemon instance this process mapped → unpack the reply (validated: the
 * daemon is a peer, not trusted memory). The status comes back exactly
 * through the `kvdepot-status` trailer; without it (the daemon is down, the
 * transport failed) gRPC's code is translated by kvd_status_from_grpc
 * (common/status_int.h), the one translation the etcd client uses too.
 *
 * A reply saying the instance changed (KVD_ERR_STATE) means the daemon
 * restarted: `mu` is taken, the arena is mapped again, and calls that carry
 * no ids are sent once more. Offsets are only meaningful in the arena of
 * the instance that gave them, so every mapping is kept with its instance
 * and a count of the leases and reservations the caller still holds from
 * it: kvd_client_lease_ptr and kvd_client_reservation_ptr resolve through
 * that mapping (never through a newer arena, where the same offset is
 * another object's slot), and an old mapping is unmapped when its count
 * reaches zero, so a restarted daemon's memory is not kept alive by every
 * client that knew it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <grpc/byte_buffer.h>
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/time.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/ring_int.h"
#include "common/status_int.h"
#include "common/time_int.h"
#include "proto/kvd_proto.h"
#include "store/arena.h"
#include "client/client.h"
#include "store/ops.h"
#include "client/handoff.h"

#define CL_BUCKETS 4096u
#define CL_MAPPINGS_MAX 16u
#define CL_MAX_MESSAGE (32 << 20)
/* Released lease ids wait at most this long for a Lookup to carry them. */
#define CL_RELEASE_DELAY_MS 2
#define CL_RELEASE_BATCH 1024u

/* One mapping of a daemon instance's arena. `held`: leases (blocks) and
 * reservations of that instance the caller holds; a mapping that is not
 * the current one is unmapped when it reaches zero. */
typedef struct cl_map {
    kvd_arena_mapping_t *map;
    uint64_t instance;
    uint32_t gen; /* kvd_store_reservation_t.reserved */
    uint64_t held;
} cl_map_t;

/* Handed-out blocks of one daemon lease id. */
typedef struct cl_group {
    uint64_t lease_id;
    uint64_t instance;
    uint32_t refs;
    uint32_t next_free; /* free list, index + 1 */
} cl_group_t;

/* A reserved key waiting for commit or abort. */
typedef struct cl_resv {
    struct cl_resv *next;
    kvd_store_key_t key;
    uint64_t reservation_id;
    uint64_t instance;
    uint64_t offset, size;
} cl_resv_t;

/* A get of a disk-tier block, driven by the get thread. */
typedef struct cl_get {
    struct cl_get *next;
    kvd_store_get_t get;
    uint64_t lease_id;
} cl_get_t;

struct kvd_client {
    kvd_store_t base; /* first: the store handle is the client */
    kvd_client_config_t cfg;
    char address[KVD_CONFIG_STRING_MAX];
    char shm_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    grpc_channel *ch;

    pthread_mutex_t mu; /* everything below */
    uint64_t instance;
    char instance_hex[17];
    char session_hex[2 * KVD_HANDOFF_SESSION_BYTES + 1]; /* from the hand-off */
    kvd_arena_mapping_t *map; /* the current instance's, maps[n_maps - 1] */
    cl_map_t maps[CL_MAPPINGS_MAX];
    size_t n_maps;
    uint32_t map_gen; /* generation of the newest mapping */
    uint64_t map_bytes, size_bytes;
    uint64_t offset; /* arena offset of the mapping's first byte: the
                        caller's tenant's partition starts there */
    int arena_fd;

    cl_group_t *groups;
    uint32_t n_groups, cap_groups, free_head;
    /* Lease ids the engine released, not yet told to the daemon: the next
     * Lookup carries them, or the get thread sends them after
     * CL_RELEASE_DELAY_MS. */
    uint64_t *rel;
    size_t n_rel, cap_rel;
    uint64_t rel_since_ms;
    /* The get thread sleeps with a deadline and will look at the deferred
     * releases when it wakes: a new release need not wake it. */
    bool rel_timer_armed;
    cl_resv_t *resv[CL_BUCKETS];

    /* Gets: `gets` is the queue the get thread works through. */
    cl_get_t *gets;
    pthread_cond_t get_cv;
    bool stopping;
    pthread_t get_thread;
    bool get_thread_started;
    kvd_ring_t *cq;
    uint64_t outstanding; /* accepted, not yet polled (atomic) */
};

static bool md_status(const grpc_metadata_array *md, kvd_status_t *out)
{
    static const char key[] = "kvdepot-status";
    for (size_t i = 0; i < md->count; i++) {
        grpc_slice k = md->metadata[i].key, v = md->metadata[i].value;
        if (GRPC_SLICE_LENGTH(k) != sizeof key - 1 ||
            memcmp(GRPC_SLICE_START_PTR(k), key, sizeof key - 1) != 0 ||
            GRPC_SLICE_LENGTH(v) == 0 || GRPC_SLICE_LENGTH(v) > 11) {
            continue;
        }
        char buf[12];
        memcpy(buf, GRPC_SLICE_START_PTR(v), GRPC_SLICE_LENGTH(v));
        buf[GRPC_SLICE_LENGTH(v)] = '\0';
        char *end = NULL;
        long s = strtol(buf, &end, 10);
        if (*end == '\0' && s <= 0 && s >= KVD_ERR_INTERNAL) {
            *out = (kvd_status_t)s;
            return true;
        }
    }
    return false;
}

/* ---- one unary call ------------------------------------------------------ */

static const char *const cl_paths[] = {
    "/kvdepot.v1.KvStore/Lookup",  "/kvdepot.v1.KvStore/Reserve",
    "/kvdepot.v1.KvStore/Commit",  "/kvdepot.v1.KvStore/Abort",
    "/kvdepot.v1.KvStore/Release", "/kvdepot.v1.KvStore/Get",
    "/kvdepot.v1.KvStore/Promote", "/kvdepot.v1.KvStore/Stats",
    "/kvdepot.v1.KvStore/Admin",   "/kvdepot.v1.KvStore/Delete",
};
enum cl_method {
    CL_LOOKUP,
    CL_RESERVE,
    CL_COMMIT,
    CL_ABORT,
    CL_RELEASE,
    CL_GET,
    CL_PROMOTE,
    CL_STATS,
    CL_ADMIN,
    CL_DELETE
};

/*
 * Sends `req` (of type `rq_type`) and unpacks the reply as `rsp_type` into
 * *rsp_out (kvd_proto_free it). `instance_used` gets the instance the call
 * named, so a caller can tell a restart.
 */
static kvd_status_t
cl_call_once(kvd_client_t *c, enum cl_method m, kvd_proto_msg_t rq_type,
             const ProtobufCMessage *req, kvd_proto_msg_t rsp_type,
             ProtobufCMessage **rsp_out, uint64_t *instance_used)
{
    char reason[KVD_PROTO_REASON_MAX];
    uint8_t *buf = NULL;
    size_t len = 0;
    kvd_status_t s =
        kvd_proto_pack_alloc(rq_type, req, &buf, &len, reason, sizeof reason);
    if (s != KVD_OK) {
        KVD_LOG_ERROR("store client: %s not sent: %s", cl_paths[m], reason);
        return s;
    }
    char inst[17], sess[sizeof c->session_hex];
    pthread_mutex_lock(&c->mu);
    memcpy(inst, c->instance_hex, sizeof inst);
    memcpy(sess, c->session_hex, sizeof sess);
    *instance_used = c->instance;
    pthread_mutex_unlock(&c->mu);

    grpc_completion_queue *cq = grpc_completion_queue_create_for_pluck(NULL);
    gpr_timespec deadline = gpr_time_add(
        gpr_now(GPR_CLOCK_MONOTONIC),
        gpr_time_from_millis((int64_t)c->cfg.timeout_ms, GPR_TIMESPAN));
    grpc_call *call = grpc_channel_create_call(
        c->ch, NULL, GRPC_PROPAGATE_DEFAULTS, cq,
        grpc_slice_from_static_string(cl_paths[m]), NULL, deadline, NULL);
    grpc_slice body = grpc_slice_new(buf, len, free);
    grpc_byte_buffer *send = grpc_raw_byte_buffer_create(&body, 1);
    grpc_slice_unref(body);
    grpc_metadata md[2] = {
        {.key = grpc_slice_from_static_string("kvdepot-instance"),
         .value = grpc_slice_from_copied_string(inst)},
        {.key = grpc_slice_from_static_string("kvdepot-session"),
         .value = grpc_slice_from_copied_string(sess)}};
    grpc_metadata_array initial, trailing;
    grpc_metadata_array_init(&initial);
    grpc_metadata_array_init(&trailing);
    grpc_byte_buffer *recv = NULL;
    grpc_status_code code = GRPC_STATUS_UNKNOWN;
    grpc_slice details = grpc_empty_slice();
    grpc_op ops[6];
    memset(ops, 0, sizeof ops);
    ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
    ops[0].data.send_initial_metadata.count = 2;
    ops[0].data.send_initial_metadata.metadata = md;
    ops[1].op = GRPC_OP_SEND_MESSAGE;
    ops[1].data.send_message.send_message = send;
    ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
    ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
    ops[3].data.recv_initial_metadata.recv_initial_metadata = &initial;
    ops[4].op = GRPC_OP_RECV_MESSAGE;
    ops[4].data.recv_message.recv_message = &recv;
    ops[5].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
    ops[5].data.recv_status_on_client.trailing_metadata = &trailing;
    ops[5].data.recv_status_on_client.status = &code;
    ops[5].data.recv_status_on_client.status_details = &details;
    grpc_call_error e = grpc_call_start_batch(call, ops, 6, ops, NULL);
    if (e == GRPC_CALL_OK) {
        /* The deadline bounds the call; the pluck waits a little longer so
         * the call's own DEADLINE_EXCEEDED is what we see. */
        (void)grpc_completion_queue_pluck(
            cq, ops,
            gpr_time_add(deadline, gpr_time_from_millis(1000, GPR_TIMESPAN)),
            NULL);
        kvd_status_t ks;
        if (md_status(&trailing, &ks)) {
            s = ks;
        } else {
            s = kvd_status_from_grpc((int)code, cl_paths[m]);
        }
        if (s != KVD_OK) {
            KVD_LOG_DEBUG("store client: %s: %s (%.*s)", cl_paths[m],
                          kvd_status_str(s), (int)GRPC_SLICE_LENGTH(details),
                          (const char *)GRPC_SLICE_START_PTR(details));
        }
    } else {
        s = KVD_ERR_RPC;
    }
    if (s == KVD_OK) {
        if (recv == NULL) {
            s = KVD_ERR_PROTO;
        } else {
            grpc_byte_buffer_reader rd;
            if (!grpc_byte_buffer_reader_init(&rd, recv)) {
                s = KVD_ERR_PROTO;
            } else {
                grpc_slice all = grpc_byte_buffer_reader_readall(&rd);
                grpc_byte_buffer_reader_destroy(&rd);
                s = kvd_proto_unpack(rsp_type, GRPC_SLICE_START_PTR(all),
                                     GRPC_SLICE_LENGTH(all), rsp_out, reason,
                                     sizeof reason);
                if (s != KVD_OK) {
                    KVD_LOG_ERROR("store client: %s: invalid reply: %s",
                                  cl_paths[m], reason);
                }
                grpc_slice_unref(all);
            }
        }
    }
    if (recv != NULL) {
        grpc_byte_buffer_destroy(recv);
    }
    grpc_slice_unref(details);
    grpc_slice_unref(md[0].value);
    grpc_slice_unref(md[1].value);
    grpc_metadata_array_destroy(&initial);
    grpc_metadata_array_destroy(&trailing);
    grpc_byte_buffer_destroy(send);
    grpc_call_unref(call);
    grpc_completion_queue_shutdown(cq);
    while (grpc_completion_queue_pluck(cq, NULL,
                                       gpr_inf_future(GPR_CLOCK_REALTIME), NULL)
               .type != GRPC_QUEUE_SHUTDOWN) {
    }
    grpc_completion_queue_destroy(cq);
    return s;
}

/* ---- the arena hand-off -------------------------------------------------- */

/* ---- arena mappings (`mu` held) ------------------------------------------ */

/* Whether arena offsets [offset, offset + len) are in the current mapping
 * (the caller's partition of the daemon's arena). */
static bool cl_in_arena(const kvd_client_t *c, uint64_t offset, uint64_t len)
{
    if (offset < c->offset) {
        return false;
    }
    offset -= c->offset;
    return offset < c->size_bytes && len <= c->size_bytes - offset;
}

static void map_remove(kvd_client_t *c, size_t i)
{
    kvd_arena_mapping_close(c->maps[i].map);
    memmove(c->maps + i, c->maps + i + 1,
            (c->n_maps - i - 1) * sizeof c->maps[0]);
    c->n_maps--;
}

static cl_map_t *map_of_instance(kvd_client_t *c, uint64_t instance)
{
    for (size_t i = 0; i < c->n_maps; i++) {
        if (c->maps[i].instance == instance) {
            return &c->maps[i];
        }
    }
    return NULL;
}

/* Adds `delta` to what the caller holds of `instance`'s arena; unmaps that
 * arena when it is not the current one and nothing of it is held. */
static void map_held(kvd_client_t *c, uint64_t instance, int64_t delta)
{
    cl_map_t *m = map_of_instance(c, instance);
    if (m == NULL) {
        return;
    }
    m->held =
        delta < 0 && (uint64_t)-delta > m->held ? 0 : m->held + (uint64_t)delta;
    if (m->held == 0 && m->instance != c->instance) {
        KVD_LOG_DEBUG("store client: arena of instance %016" PRIx64 " unmapped",
                      m->instance);
        map_remove(c, (size_t)(m - c->maps));
    }
}

/* Asks the daemon for its arena and maps it; `mu` held. */
static kvd_status_t cl_map(kvd_client_t *c, char *err, size_t err_len)
{
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
        return kvd_status_from_errno(errno);
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", c->shm_path);
    if (connect(sock, (struct sockaddr *)&a, sizeof a) != 0) {
        kvd_config_err(err, err_len, "store.address: %s: %s", c->shm_path,
                       strerror(errno));
        close(sock);
        return KVD_ERR_UNREACHABLE;
    }
    uint8_t hello[KVD_HANDOFF_HELLO_BYTES], rbuf[KVD_HANDOFF_REPLY_BYTES];
    kvd_handoff_hello_encode(hello);
    int fd = -1;
    kvd_status_t s = kvd_handoff_send(sock, hello, sizeof hello, -1);
    if (s == KVD_OK) {
        s = kvd_handoff_recv(sock, rbuf, sizeof rbuf, (int)c->cfg.timeout_ms,
                             &fd);
    }
    close(sock);
    kvd_handoff_reply_t r;
    if (s == KVD_OK) {
        s = kvd_handoff_reply_decode(rbuf, sizeof rbuf, &r, err, err_len);
    } else {
        kvd_config_err(err, err_len, "store.address: %s: hand-off: %s",
                       c->shm_path, kvd_status_str(s));
    }
    if (s == KVD_OK && r.status != KVD_OK) {
        kvd_config_err(err, err_len,
                       "store.address: the daemon refused the "
                       "hand-off: %s",
                       kvd_status_str(r.status));
        s = r.status;
    }
    if (s == KVD_OK && fd < 0) {
        kvd_config_err(err, err_len, "hand-off reply without a descriptor");
        s = KVD_ERR_PROTO;
    }
    kvd_arena_mapping_t *map = NULL;
    if (s == KVD_OK) {
        kvd_arena_export_t exp = {.fd = fd,
                                  .map_bytes = r.map_bytes,
                                  .size_bytes = r.size_bytes,
                                  .chunk_bytes = r.size_bytes,
                                  .offset = r.offset};
        s = kvd_arena_mapping_open(&exp, &map);
        if (s != KVD_OK) {
            kvd_config_err(err, err_len, "mapping the daemon's arena: %s",
                           kvd_status_str(s));
        }
    }
    if (s != KVD_OK) {
        if (fd >= 0) {
            close(fd);
        }
        return s;
    }
    if (c->n_maps == CL_MAPPINGS_MAX) {
        /* A daemon that restarted this often while the caller held on to
         * leases of each instance: the oldest mapping goes. */
        KVD_LOG_WARN("store client: %u arena mappings: unmapping the oldest "
                     "with %" PRIu64 " leases or reservations still held",
                     CL_MAPPINGS_MAX, c->maps[0].held);
        map_remove(c, 0);
    }
    c->maps[c->n_maps++] =
        (cl_map_t){.map = map, .instance = r.instance_id, .gen = ++c->map_gen};
    if (c->arena_fd >= 0) {
        close(c->arena_fd);
    }
    c->arena_fd = fd;
    c->map = map;
    c->map_bytes = r.map_bytes;
    c->size_bytes = r.size_bytes;
    c->offset = r.offset;
    c->instance = r.instance_id;
    snprintf(c->instance_hex, sizeof c->instance_hex, "%016" PRIx64,
             r.instance_id);
    if (c->n_maps >= 2) {
        map_held(c, c->maps[c->n_maps - 2].instance, 0);
    }
    for (size_t i = 0; i < KVD_HANDOFF_SESSION_BYTES; i++) {
        snprintf(c->session_hex + 2 * i, 3, "%02x", r.session[i]);
    }
    return KVD_OK;
}

/* After KVD_ERR_STATE from an instance we used: map the new arena (once,
 * whichever thread sees it first). */
static kvd_status_t cl_remap(kvd_client_t *c, uint64_t used)
{
    kvd_status_t s = KVD_OK;
    pthread_mutex_lock(&c->mu);
    if (c->instance == used) {
        char err[256] = "";
        s = cl_map(c, err, sizeof err);
        if (s == KVD_OK) {
            KVD_LOG_INFO("store client: daemon restarted; arena mapped again "
                         "(instance %s)",
                         c->instance_hex);
        } else {
            KVD_LOG_WARN("store client: daemon restarted, remap failed: %s",
                         err);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* A call that names no id: sent again once after a remap. */
static kvd_status_t
cl_call(kvd_client_t *c, enum cl_method m, kvd_proto_msg_t rq_type,
        const ProtobufCMessage *req, kvd_proto_msg_t rsp_type,
        ProtobufCMessage **rsp_out, uint64_t *instance_used, bool retry)
{
    kvd_status_t s =
        cl_call_once(c, m, rq_type, req, rsp_type, rsp_out, instance_used);
    if (s == KVD_ERR_STATE && cl_remap(c, *instance_used) == KVD_OK) {
        if (!retry) {
            return KVD_ERR_NOT_FOUND;
        }
        s = cl_call_once(c, m, rq_type, req, rsp_type, rsp_out, instance_used);
    }
    return s;
}

/* ---- lease groups -------------------------------------------------------- */

/* `mu` held. Returns the index + 1, or 0 when out of memory. */
static uint32_t group_new(kvd_client_t *c, uint64_t lease_id, uint64_t inst,
                          uint32_t refs)
{
    uint32_t i;
    if (c->free_head != 0) {
        i = c->free_head - 1;
        c->free_head = c->groups[i].next_free;
    } else {
        if (c->n_groups == c->cap_groups) {
            uint32_t cap = c->cap_groups ? c->cap_groups * 2 : 256;
            cl_group_t *g = realloc(c->groups, cap * sizeof *g);
            if (g == NULL) {
                return 0;
            }
            c->groups = g;
            c->cap_groups = cap;
        }
        i = c->n_groups++;
    }
    c->groups[i] =
        (cl_group_t){.lease_id = lease_id, .instance = inst, .refs = refs};
    map_held(c, inst, refs);
    return i + 1;
}

/* Drops one block of group `g` (index + 1); writes the lease id to release
 * on the daemon into *release (0: not yet, or not this daemon's). `mu`
 * held. */
static kvd_status_t group_unref(kvd_client_t *c, uint32_t g, uint64_t *release)
{
    *release = 0;
    if (g == 0 || g > c->n_groups || c->groups[g - 1].refs == 0) {
        return KVD_ERR_NOT_FOUND;
    }
    cl_group_t *grp = &c->groups[g - 1];
    map_held(c, grp->instance, -1);
    if (--grp->refs == 0) {
        if (grp->instance == c->instance) {
            *release = grp->lease_id;
        }
        grp->next_free = c->free_head;
        c->free_head = g;
    }
    return KVD_OK;
}

static void cl_release_ids(kvd_client_t *c, uint64_t *ids, size_t n)
{
    if (n == 0) {
        return;
    }
    kvd_pb_release_request_t rq = KVDEPOT__V1__RELEASE_REQUEST__INIT;
    rq.n_lease_ids = n;
    rq.lease_ids = ids;
    ProtobufCMessage *rsp = NULL;
    uint64_t used;
    kvd_status_t s =
        cl_call(c, CL_RELEASE, KVD_PROTO_MSG_RELEASE_REQUEST, &rq.base,
                KVD_PROTO_MSG_RELEASE_RESPONSE, &rsp, &used, false);
    if (s != KVD_OK) {
        /* The daemon reclaims them at their TTL. */
        KVD_LOG_DEBUG("store client: release of %zu leases: %s", n,
                      kvd_status_str(s));
    }
    kvd_proto_free(rsp);
}

/* ---- lookup / release ---------------------------------------------------- */

/* Moves up to `max` deferred release ids into `out`; `mu` held. */
static size_t rel_take(kvd_client_t *c, uint64_t *out, size_t max)
{
    size_t n = c->n_rel < max ? c->n_rel : max;
    if (n == 0) {
        return 0; /* c->rel may still be NULL: no memcpy from it */
    }
    memcpy(out, c->rel + (c->n_rel - n), n * sizeof *out);
    c->n_rel -= n;
    return n;
}

/* Sends every deferred release now (before calls whose answer depends on
 * them: stats, admin, delete, close). */
static void cl_flush_releases(kvd_client_t *c)
{
    uint64_t ids[256];
    for (;;) {
        pthread_mutex_lock(&c->mu);
        size_t n = rel_take(c, ids, sizeof ids / sizeof ids[0]);
        pthread_mutex_unlock(&c->mu);
        if (n == 0) {
            return;
        }
        cl_release_ids(c, ids, n);
    }
}

static void cl_hash_refs(const kvd_block_hash_t *hashes, size_t n,
                         ProtobufCBinaryData *out)
{
    for (size_t i = 0; i < n; i++) {
        out[i].data = (uint8_t *)hashes[i].bytes;
        out[i].len = sizeof hashes[i].bytes;
    }
}

kvd_status_t kvd_client_lookup(kvd_client_t *c, const kvd_namespace_t *ns,
                               const kvd_block_hash_t *hashes, size_t n,
                               const char *source_node,
                               kvd_store_lease_t *leases_out,
                               size_t *matched_out)
{
    if (n == 0) {
        *matched_out = 0;
        return KVD_OK;
    }
    /* The chain goes packed: the hashes array is already 32 bytes each,
     * back to back. */
    kvd_pb_lookup_request_t rq = KVDEPOT__V1__LOOKUP_REQUEST__INIT;
    rq.namespace_id.data = (uint8_t *)ns->bytes;
    rq.namespace_id.len = sizeof ns->bytes;
    rq.packed_hashes.data = (uint8_t *)hashes;
    rq.packed_hashes.len = n * sizeof *hashes;
    rq.lease_ttl_ms = (uint32_t)c->cfg.lease_ttl_ms;
    rq.packed_locations = true;
    /* In a cluster the daemon fills a local miss from the other nodes. */
    rq.include_remote = true;
    rq.source_node = (char *)(source_node != NULL ? source_node : "");
    /* Releases ride along (a failed call leaves them to the daemon's TTL). */
    uint64_t rel[256];
    pthread_mutex_lock(&c->mu);
    rq.n_release_lease_ids = rel_take(c, rel, sizeof rel / sizeof rel[0]);
    pthread_mutex_unlock(&c->mu);
    rq.release_lease_ids = rel;
    kvd_pb_lookup_response_t *rsp = NULL;
    uint64_t used;
    kvd_status_t s = cl_call(c, CL_LOOKUP, KVD_PROTO_MSG_LOOKUP_REQUEST,
                             &rq.base, KVD_PROTO_MSG_LOOKUP_RESPONSE,
                             (ProtobufCMessage **)&rsp, &used, true);
    if (s != KVD_OK) {
        return s;
    }
    /* A daemon of revision 1 answers with one message per location. */
    bool packed = rsp->n_tiers > 0;
    size_t m = packed ? rsp->n_tiers : rsp->n_locations;
    uint32_t g = 0;
    if (m > n || (m > 0 && rsp->lease_id == 0)) {
        KVD_LOG_ERROR("store client: Lookup reply: %zu hits of %zu, lease "
                      "%" PRIu64,
                      m, n, rsp->lease_id);
        s = KVD_ERR_PROTO;
    } else if (m > 0) {
        pthread_mutex_lock(&c->mu);
        g = group_new(c, rsp->lease_id, used, (uint32_t)m);
        pthread_mutex_unlock(&c->mu);
        if (g == 0) {
            s = KVD_ERR_NOMEM;
        }
    }
    if (s != KVD_OK) {
        if (rsp->lease_id != 0) {
            cl_release_ids(c, &rsp->lease_id, 1);
        }
        kvd_proto_lookup_response_free(rsp);
        return s;
    }
    for (size_t i = 0; i < m; i++) {
        Kvdepot__V1__Tier tier =
            packed ? rsp->tiers[i] : rsp->locations[i]->tier;
        kvd_store_lease_t *o = &leases_out[i];
        memset(o, 0, sizeof *o);
        o->key.ns = *ns;
        o->key.hash = hashes[i];
        o->tier = tier == KVDEPOT__V1__TIER__TIER_HOST ? KVD_STORE_TIER_HOST
                                                       : KVD_STORE_TIER_DISK;
        o->reserved = g;
        o->arena_offset =
            packed ? rsp->arena_offsets[i] : rsp->locations[i]->arena_offset;
        o->size_bytes = packed ? rsp->sizes[i] : rsp->locations[i]->size_bytes;
    }
    kvd_proto_lookup_response_free(rsp);
    *matched_out = m;
    return KVD_OK;
}

kvd_status_t kvd_client_release(kvd_client_t *c,
                                const kvd_store_lease_t *leases, size_t n)
{
    kvd_status_t first = KVD_OK;
    bool flush = false;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        uint64_t id = 0;
        kvd_status_t s = group_unref(c, leases[i].reserved, &id);
        if (s != KVD_OK && first == KVD_OK) {
            first = s;
        }
        if (id == 0) {
            continue;
        }
        if (c->n_rel == c->cap_rel) {
            size_t cap = c->cap_rel ? c->cap_rel * 2 : 64;
            uint64_t *r = realloc(c->rel, cap * sizeof *r);
            if (r == NULL) {
                pthread_mutex_unlock(&c->mu);
                cl_release_ids(c, &id, 1); /* no room to defer it */
                pthread_mutex_lock(&c->mu);
                continue;
            }
            c->rel = r;
            c->cap_rel = cap;
        }
        if (c->n_rel == 0) {
            c->rel_since_ms = kvd_time_now_ms();
            if (!c->rel_timer_armed) {
                pthread_cond_signal(&c->get_cv); /* arms the timed flush */
            }
        }
        c->rel[c->n_rel++] = id;
        flush = c->n_rel >= CL_RELEASE_BATCH;
    }
    pthread_mutex_unlock(&c->mu);
    if (flush) {
        cl_flush_releases(c);
    }
    return first;
}

/* ---- reserve / commit / abort -------------------------------------------- */

static size_t resv_bucket(const kvd_store_key_t *k)
{
    return (size_t)kvd_xxh3_64(k, sizeof *k) % CL_BUCKETS;
}

/* Removes and returns the reservation of `k`, or NULL. `mu` held. */
static cl_resv_t *resv_take(kvd_client_t *c, const kvd_store_key_t *k)
{
    for (cl_resv_t **pp = &c->resv[resv_bucket(k)]; *pp != NULL;
         pp = &(*pp)->next) {
        if (memcmp(&(*pp)->key, k, sizeof *k) == 0) {
            cl_resv_t *r = *pp;
            *pp = r->next;
            return r;
        }
    }
    return NULL;
}

kvd_status_t kvd_client_reserve(kvd_client_t *c, const kvd_namespace_t *ns,
                                const kvd_block_hash_t *hashes, size_t n,
                                uint64_t object_bytes, uint32_t tenant,
                                kvd_store_reservation_t *out)
{
    if (n == 0) {
        return KVD_OK;
    }
    if (object_bytes == 0 || object_bytes > c->size_bytes) {
        return KVD_ERR_INVALID;
    }
    ProtobufCBinaryData *hb = malloc(n * sizeof *hb);
    if (hb == NULL) {
        return KVD_ERR_NOMEM;
    }
    cl_hash_refs(hashes, n, hb);
    char tenant_name[16] = "";
    if (tenant != 0) {
        snprintf(tenant_name, sizeof tenant_name, "%" PRIu32, tenant);
    }
    kvd_pb_reserve_request_t rq = KVDEPOT__V1__RESERVE_REQUEST__INIT;
    rq.namespace_id.data = (uint8_t *)ns->bytes;
    rq.namespace_id.len = sizeof ns->bytes;
    rq.n_block_hashes = n;
    rq.block_hashes = hb;
    rq.object_size_bytes = object_bytes;
    rq.tenant = tenant_name;
    kvd_pb_reserve_response_t *rsp = NULL;
    uint64_t used;
    kvd_status_t s = cl_call(c, CL_RESERVE, KVD_PROTO_MSG_RESERVE_REQUEST,
                             &rq.base, KVD_PROTO_MSG_RESERVE_RESPONSE,
                             (ProtobufCMessage **)&rsp, &used, true);
    free(hb);
    if (s == KVD_ERR_INVALID || s == KVD_ERR_PROTO) {
        return s; /* the call itself is wrong (e.g. larger than a chunk) */
    }
    if (s != KVD_OK) {
        /* No daemon, or it failed the call: the saves are skipped, the
         * engine goes on; each key says why (not "no space"). */
        for (size_t i = 0; i < n; i++) {
            out[i] = (kvd_store_reservation_t){.status = s};
        }
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 5000,
                            "store client: Reserve failed (%s): saves skipped",
                            kvd_status_str(s));
        return KVD_OK;
    }
    if (rsp->n_blocks != n) {
        KVD_LOG_ERROR("store client: Reserve reply: %zu outcomes for %zu",
                      rsp->n_blocks, n);
        if (rsp->reservation_id != 0) {
            /* Give everything back rather than guess. */
            kvd_pb_abort_request_t ab = KVDEPOT__V1__ABORT_REQUEST__INIT;
            ab.reservation_id = rsp->reservation_id;
            ProtobufCMessage *ar = NULL;
            (void)cl_call(c, CL_ABORT, KVD_PROTO_MSG_ABORT_REQUEST, &ab.base,
                          KVD_PROTO_MSG_ABORT_RESPONSE, &ar, &used, false);
            kvd_proto_free(ar);
        }
        kvd_proto_reserve_response_free(rsp);
        return KVD_ERR_PROTO;
    }
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        const kvd_pb_block_reservation_t *b = rsp->blocks[i];
        out[i] = (kvd_store_reservation_t){.status = KVD_ERR_NOSPACE};
        if (b->outcome ==
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_EXISTS) {
            out[i].status = KVD_ERR_EXISTS;
            continue;
        }
        /* Why a block was refused, from revision 3 on (before: 0, taken
         * as no space). */
        if (b->outcome ==
                KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_REJECTED &&
            b->status < 0) {
            out[i].status = (kvd_status_t)b->status;
        }
        if (b->outcome !=
            KVDEPOT__V1__RESERVE_OUTCOME__RESERVE_OUTCOME_RESERVED) {
            continue;
        }
        cl_resv_t *r = NULL;
        if (cl_in_arena(c, b->arena_offset, object_bytes) &&
            memcmp(b->block_hash.data, hashes[i].bytes, 32) == 0) {
            r = calloc(1, sizeof *r);
        }
        if (r == NULL) {
            /* Not recorded: the daemon aborts it at its TTL. */
            continue;
        }
        r->key.ns = *ns;
        r->key.hash = hashes[i];
        r->reservation_id = rsp->reservation_id;
        r->instance = used;
        r->offset = b->arena_offset;
        r->size = object_bytes;
        cl_resv_t *old = resv_take(c, &r->key);
        if (old != NULL) {
            map_held(c, old->instance, -1);
            free(old);
        }
        map_held(c, used, 1);
        cl_map_t *m = map_of_instance(c, used);
        size_t bk = resv_bucket(&r->key);
        r->next = c->resv[bk];
        c->resv[bk] = r;
        out[i].status = KVD_OK;
        out[i].reserved = m != NULL ? m->gen : 0;
        out[i].arena_offset = b->arena_offset;
    }
    pthread_mutex_unlock(&c->mu);
    kvd_proto_reserve_response_free(rsp);
    return KVD_OK;
}

/* Commits (or aborts) the keys of one reservation id in one call. */
static kvd_status_t cl_finish_batch(kvd_client_t *c, bool commit,
                                    cl_resv_t **rs, size_t n, kvd_status_t *st)
{
    uint64_t used;
    kvd_status_t s;
    if (commit) {
        kvd_pb_commit_entry_t *e = calloc(n, sizeof *e);
        kvd_pb_commit_entry_t **ep = calloc(n, sizeof *ep);
        uint64_t *sums = calloc(n, sizeof *sums);
        if (e == NULL || ep == NULL || sums == NULL) {
            free(e);
            free(ep);
            free(sums);
            return KVD_ERR_NOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            kvdepot__v1__commit_entry__init(&e[i]);
            e[i].block_hash.data = rs[i]->key.hash.bytes;
            e[i].block_hash.len = 32;
            const void *p = kvd_client_arena_ptr(c, rs[i]->offset, rs[i]->size);
            sums[i] = p != NULL ? kvd_xxh3_64(p, rs[i]->size) : 0;
            e[i].n_layer_checksums = 1;
            e[i].layer_checksums = &sums[i];
            ep[i] = &e[i];
        }
        kvd_pb_commit_request_t rq = KVDEPOT__V1__COMMIT_REQUEST__INIT;
        rq.reservation_id = rs[0]->reservation_id;
        rq.n_entries = n;
        rq.entries = ep;
        kvd_pb_commit_response_t *rsp = NULL;
        s = cl_call(c, CL_COMMIT, KVD_PROTO_MSG_COMMIT_REQUEST, &rq.base,
                    KVD_PROTO_MSG_COMMIT_RESPONSE, (ProtobufCMessage **)&rsp,
                    &used, false);
        if (s == KVD_OK) {
            for (size_t i = 0; i < n; i++) {
                st[i] = rsp->n_statuses == n ? (kvd_status_t)rsp->statuses[i]
                                             : KVD_ERR_PROTO;
            }
        }
        kvd_proto_free(rsp ? &rsp->base : NULL);
        free(e);
        free(ep);
        free(sums);
    } else {
        ProtobufCBinaryData *hb = calloc(n, sizeof *hb);
        if (hb == NULL) {
            return KVD_ERR_NOMEM;
        }
        for (size_t i = 0; i < n; i++) {
            hb[i].data = rs[i]->key.hash.bytes;
            hb[i].len = 32;
        }
        kvd_pb_abort_request_t rq = KVDEPOT__V1__ABORT_REQUEST__INIT;
        rq.reservation_id = rs[0]->reservation_id;
        rq.n_block_hashes = n;
        rq.block_hashes = hb;
        ProtobufCMessage *rsp = NULL;
        s = cl_call(c, CL_ABORT, KVD_PROTO_MSG_ABORT_REQUEST, &rq.base,
                    KVD_PROTO_MSG_ABORT_RESPONSE, &rsp, &used, false);
        for (size_t i = 0; s == KVD_OK && i < n; i++) {
            st[i] = KVD_OK;
        }
        kvd_proto_free(rsp);
        free(hb);
    }
    if (s != KVD_OK) {
        for (size_t i = 0; i < n; i++) {
            st[i] = s;
        }
    }
    return KVD_OK;
}

static kvd_status_t cl_finish(kvd_client_t *c, bool commit,
                              const kvd_store_key_t *keys, size_t n,
                              kvd_status_t *statuses_out)
{
    cl_resv_t **rs = calloc(n ? n : 1, sizeof *rs);
    kvd_status_t *st = calloc(n ? n : 1, sizeof *st);
    size_t *idx = calloc(n ? n : 1, sizeof *idx);
    cl_resv_t **batch = calloc(n ? n : 1, sizeof *batch);
    kvd_status_t *bst = calloc(n ? n : 1, sizeof *bst);
    kvd_status_t first = KVD_OK;
    if (rs == NULL || st == NULL || idx == NULL || batch == NULL ||
        bst == NULL) {
        first = KVD_ERR_NOMEM;
        goto out;
    }
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < n; i++) {
        rs[i] = resv_take(c, &keys[i]);
        st[i] = KVD_ERR_NOT_FOUND;
        if (rs[i] != NULL && rs[i]->instance != c->instance) {
            /* Reserved from a daemon that is gone. */
            map_held(c, rs[i]->instance, -1);
            free(rs[i]);
            rs[i] = NULL;
        }
    }
    pthread_mutex_unlock(&c->mu);
    /* One call per reservation id, keys in the caller's order. */
    for (size_t i = 0; i < n; i++) {
        if (rs[i] == NULL) {
            continue;
        }
        size_t k = 0;
        uint64_t id = rs[i]->reservation_id;
        for (size_t j = i; j < n; j++) {
            if (rs[j] != NULL && rs[j]->reservation_id == id) {
                idx[k] = j;
                batch[k++] = rs[j];
            }
        }
        kvd_status_t s = cl_finish_batch(c, commit, batch, k, bst);
        pthread_mutex_lock(&c->mu);
        for (size_t b = 0; b < k; b++) {
            st[idx[b]] = s == KVD_OK ? bst[b] : s;
            map_held(c, rs[idx[b]]->instance, -1);
            free(rs[idx[b]]);
            rs[idx[b]] = NULL;
        }
        pthread_mutex_unlock(&c->mu);
    }
    for (size_t i = 0; i < n; i++) {
        if (statuses_out != NULL) {
            statuses_out[i] = st[i];
        }
        if (st[i] != KVD_OK && first == KVD_OK) {
            first = st[i];
        }
    }
out:
    free(bst);
    free(batch);
    free(idx);
    free(st);
    free(rs);
    return first;
}

kvd_status_t kvd_client_commit(kvd_client_t *c, const kvd_store_key_t *keys,
                               size_t n, kvd_status_t *statuses_out)
{
    return cl_finish(c, true, keys, n, statuses_out);
}

kvd_status_t kvd_client_abort(kvd_client_t *c, const kvd_store_key_t *keys,
                              size_t n, kvd_status_t *statuses_out)
{
    return cl_finish(c, false, keys, n, statuses_out);
}

/* ---- gets ---------------------------------------------------------------- */

static void cl_complete(kvd_client_t *c, const kvd_store_get_t *g,
                        kvd_status_t status, uint64_t offset)
{
    kvd_store_completion_t done = {
        .user_data = g->user_data, .status = status, .lease = g->lease};
    if (status == KVD_OK) {
        done.lease.tier = KVD_STORE_TIER_HOST;
        done.lease.arena_offset = offset;
    } else {
        /* store.h: a failed get has given its lease back. */
        uint64_t id = 0;
        pthread_mutex_lock(&c->mu);
        (void)group_unref(c, g->lease.reserved, &id);
        pthread_mutex_unlock(&c->mu);
        cl_release_ids(c, &id, id != 0);
    }
    /* The ring holds get_queue entries and at most that many are accepted,
     * so the push finds room. */
    if (kvd_ring_push(c->cq, &done) != KVD_OK) {
        KVD_LOG_ERROR("store client: completion ring full (bug)");
    }
}

/* One Get round for the gets of one lease id; the ones still pending go
 * back on *keep. */
static void cl_get_round(kvd_client_t *c, cl_get_t *list, cl_get_t **keep)
{
    size_t n = 0;
    for (cl_get_t *g = list; g != NULL; g = g->next) {
        n++;
    }
    ProtobufCBinaryData *hb = calloc(n, sizeof *hb);
    cl_get_t **arr = calloc(n, sizeof *arr);
    kvd_status_t s = hb && arr ? KVD_OK : KVD_ERR_NOMEM;
    kvd_pb_get_response_t *rsp = NULL;
    if (s == KVD_OK) {
        size_t i = 0;
        for (cl_get_t *g = list; g != NULL; g = g->next, i++) {
            arr[i] = g;
            hb[i].data = g->get.lease.key.hash.bytes;
            hb[i].len = 32;
        }
        kvd_pb_get_request_t rq = KVDEPOT__V1__GET_REQUEST__INIT;
        rq.namespace_id.data = list->get.lease.key.ns.bytes;
        rq.namespace_id.len = 16;
        rq.n_block_hashes = n;
        rq.block_hashes = hb;
        rq.lease_id = list->lease_id;
        rq.lease_ttl_ms = (uint32_t)c->cfg.lease_ttl_ms;
        uint64_t used;
        s = cl_call(c, CL_GET, KVD_PROTO_MSG_GET_REQUEST, &rq.base,
                    KVD_PROTO_MSG_GET_RESPONSE, (ProtobufCMessage **)&rsp,
                    &used, false);
        if (s == KVD_OK && rsp->n_entries != n) {
            s = KVD_ERR_PROTO;
        }
    }
    for (size_t i = 0; i < n; i++) {
        cl_get_t *g = arr != NULL ? arr[i] : NULL;
        if (g == NULL) {
            break;
        }
        if (s != KVD_OK) {
            cl_complete(c, &g->get, s, 0);
            free(g);
            continue;
        }
        const kvd_pb_get_entry_t *e = rsp->entries[i];
        switch (e->state) {
        case KVDEPOT__V1__GET_STATE__GET_STATE_READY:
            if (cl_in_arena(c, e->arena_offset, e->size_bytes)) {
                cl_complete(c, &g->get, KVD_OK, e->arena_offset);
            } else {
                cl_complete(c, &g->get, KVD_ERR_PROTO, 0);
            }
            free(g);
            break;
        case KVDEPOT__V1__GET_STATE__GET_STATE_PENDING:
            g->next = *keep;
            *keep = g;
            break;
        case KVDEPOT__V1__GET_STATE__GET_STATE_FAILED:
            cl_complete(c, &g->get,
                        e->status < 0 ? (kvd_status_t)e->status : KVD_ERR_IO,
                        0);
            free(g);
            break;
        default:
            cl_complete(c, &g->get, KVD_ERR_NOT_FOUND, 0);
            free(g);
            break;
        }
    }
    if (arr == NULL) {
        /* Out of memory before the round: fail them all. */
        while (list != NULL) {
            cl_get_t *next = list->next;
            cl_complete(c, &list->get, KVD_ERR_NOMEM, 0);
            free(list);
            list = next;
        }
    }
    kvd_proto_free(rsp ? &rsp->base : NULL);
    free(arr);
    free(hb);
}

static void *cl_get_main(void *arg)
{
    kvd_client_t *c = arg;
    int idle_ms = 1;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (c->gets == NULL && !c->stopping) {
            if (c->n_rel == 0) {
                c->rel_timer_armed = false;
                pthread_cond_wait(&c->get_cv, &c->mu);
                continue;
            }
            /* Deferred releases no Lookup picked up: send them. */
            uint64_t due = c->rel_since_ms + CL_RELEASE_DELAY_MS;
            uint64_t now = kvd_time_now_ms();
            if (now >= due) {
                pthread_mutex_unlock(&c->mu);
                cl_flush_releases(c);
                pthread_mutex_lock(&c->mu);
                continue;
            }
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (long)(due - now) * 1000000L;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            c->rel_timer_armed = true;
            pthread_cond_timedwait(&c->get_cv, &c->mu, &ts);
        }
        c->rel_timer_armed = false;
        cl_get_t *all = c->gets;
        c->gets = NULL;
        bool stopping = c->stopping;
        pthread_mutex_unlock(&c->mu);
        if (stopping) {
            while (all != NULL) {
                cl_get_t *next = all->next;
                cl_complete(c, &all->get, KVD_ERR_CANCELED, 0);
                free(all);
                all = next;
            }
            return NULL;
        }
        /* Group by lease id, one Get call per group. */
        cl_get_t *keep = NULL;
        while (all != NULL) {
            uint64_t id = all->lease_id;
            cl_get_t *same = NULL, *rest = NULL;
            while (all != NULL) {
                cl_get_t *next = all->next;
                cl_get_t **to = all->lease_id == id ? &same : &rest;
                all->next = *to;
                *to = all;
                all = next;
            }
            cl_get_round(c, same, &keep);
            all = rest;
        }
        pthread_mutex_lock(&c->mu);
        if (keep != NULL) {
            cl_get_t *tail = keep;
            while (tail->next != NULL) {
                tail = tail->next;
            }
            tail->next = c->gets;
            c->gets = keep;
            /* Still being read from disk: ask again soon, backing off. */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += idle_ms * 1000000L;
            ts.tv_sec += ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&c->get_cv, &c->mu, &ts);
            idle_ms = idle_ms < 8 ? idle_ms * 2 : 8;
        } else {
            idle_ms = 1;
        }
    }
}

kvd_status_t kvd_client_get_submit(kvd_client_t *c, const kvd_store_get_t *g,
                                   size_t n, size_t *accepted_out)
{
    size_t made = 0;
    kvd_status_t s = KVD_OK;
    pthread_mutex_lock(&c->mu);
    for (; made < n; made++) {
        uint32_t gi = g[made].lease.reserved;
        if (gi == 0 || gi > c->n_groups || c->groups[gi - 1].refs == 0) {
            s = made == 0 ? KVD_ERR_INVALID : KVD_OK;
            break;
        }
        if (__atomic_load_n(&c->outstanding, __ATOMIC_RELAXED) >=
            c->cfg.get_queue) {
            s = made == 0 ? KVD_ERR_BUSY : KVD_OK;
            break;
        }
        __atomic_fetch_add(&c->outstanding, 1, __ATOMIC_RELAXED);
        if (g[made].lease.tier == KVD_STORE_TIER_HOST) {
            kvd_store_completion_t done = {.user_data = g[made].user_data,
                                           .lease = g[made].lease};
            (void)kvd_ring_push(c->cq, &done);
            continue;
        }
        cl_get_t *q = calloc(1, sizeof *q);
        if (q == NULL) {
            __atomic_fetch_sub(&c->outstanding, 1, __ATOMIC_RELAXED);
            s = made == 0 ? KVD_ERR_NOMEM : KVD_OK;
            break;
        }
        q->get = g[made];
        q->lease_id = c->groups[gi - 1].lease_id;
        q->next = c->gets;
        c->gets = q;
    }
    pthread_cond_signal(&c->get_cv);
    pthread_mutex_unlock(&c->mu);
    if (s != KVD_OK) {
        return s;
    }
    *accepted_out = made;
    return KVD_OK;
}

size_t kvd_client_poll(kvd_client_t *c, kvd_store_completion_t *out, size_t max)
{
    size_t n = kvd_ring_pop(c->cq, out, max);
    if (n > 0) {
        __atomic_fetch_sub(&c->outstanding, n, __ATOMIC_RELAXED);
    }
    return n;
}

kvd_status_t kvd_client_wait(kvd_client_t *c, int timeout_ms)
{
    return kvd_ring_wait(c->cq, timeout_ms);
}

int kvd_client_fd(kvd_client_t *c)
{
    return kvd_ring_fd(c->cq);
}

/* ---- delete -------------------------------------------------------------- */

kvd_status_t kvd_client_delete(kvd_client_t *c, const kvd_store_key_t *keys,
                               size_t n, size_t *num_deleted_out)
{
    cl_flush_releases(c);
    size_t total = 0;
    bool busy = false;
    kvd_status_t s = KVD_OK;
    /* One call per run of keys of one namespace (the request's unit). */
    for (size_t i = 0; i < n && s == KVD_OK;) {
        size_t j = i;
        while (j < n && j - i < KVD_PROTO_MAX_HASHES &&
               memcmp(&keys[j].ns, &keys[i].ns, sizeof keys[i].ns) == 0) {
            j++;
        }
        ProtobufCBinaryData *hb = malloc((j - i) * sizeof *hb);
        if (hb == NULL) {
            return KVD_ERR_NOMEM;
        }
        for (size_t k = i; k < j; k++) {
            hb[k - i].data = (uint8_t *)keys[k].hash.bytes;
            hb[k - i].len = sizeof keys[k].hash.bytes;
        }
        kvd_pb_delete_request_t rq = KVDEPOT__V1__DELETE_REQUEST__INIT;
        rq.namespace_id.data = (uint8_t *)keys[i].ns.bytes;
        rq.namespace_id.len = sizeof keys[i].ns.bytes;
        rq.n_block_hashes = j - i;
        rq.block_hashes = hb;
        kvd_pb_delete_response_t *rsp = NULL;
        uint64_t used;
        s = cl_call(c, CL_DELETE, KVD_PROTO_MSG_DELETE_REQUEST, &rq.base,
                    KVD_PROTO_MSG_DELETE_RESPONSE, (ProtobufCMessage **)&rsp,
                    &used, true);
        free(hb);
        if (s == KVD_OK) {
            total += rsp->num_deleted;
            busy |= rsp->busy;
            kvd_proto_delete_response_free(rsp);
        }
        i = j;
    }
    if (num_deleted_out != NULL) {
        *num_deleted_out = total;
    }
    if (s != KVD_OK) {
        return s;
    }
    return busy ? KVD_ERR_BUSY : KVD_OK;
}

/* ---- arena, stats, admin --------------------------------------------------
 */

void *kvd_client_arena_ptr(kvd_client_t *c, uint64_t offset, uint64_t len)
{
    pthread_mutex_lock(&c->mu);
    void *p = len == 0 ? NULL : kvd_arena_mapping_ptr(c->map, offset, len);
    pthread_mutex_unlock(&c->mu);
    return p;
}

void *kvd_client_lease_ptr(kvd_client_t *c, const kvd_store_lease_t *lease)
{
    void *p = NULL;
    uint32_t g = lease->reserved;
    pthread_mutex_lock(&c->mu);
    if (lease->tier == KVD_STORE_TIER_HOST && lease->size_bytes > 0 && g > 0 &&
        g <= c->n_groups && c->groups[g - 1].refs > 0) {
        cl_map_t *m = map_of_instance(c, c->groups[g - 1].instance);
        if (m != NULL) {
            p = kvd_arena_mapping_ptr(m->map, lease->arena_offset,
                                      lease->size_bytes);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return p;
}

kvd_status_t kvd_client_arena_hold(kvd_client_t *c, void **base_out,
                                   uint64_t *size_bytes_out,
                                   uint32_t *generation_out)
{
    kvd_status_t s = KVD_ERR_STATE;
    pthread_mutex_lock(&c->mu);
    if (c->n_maps > 0) {
        cl_map_t *m = &c->maps[c->n_maps - 1];
        m->held++;
        *base_out = kvd_arena_mapping_base(m->map);
        *size_bytes_out = kvd_arena_mapping_size(m->map);
        *generation_out = m->gen;
        s = KVD_OK;
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

void kvd_client_arena_unhold(kvd_client_t *c, uint32_t generation)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_maps; i++) {
        if (c->maps[i].gen == generation) {
            map_held(c, c->maps[i].instance, -1);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

uint32_t kvd_client_arena_generation(kvd_client_t *c)
{
    pthread_mutex_lock(&c->mu);
    uint32_t g = c->n_maps > 0 ? c->maps[c->n_maps - 1].gen : 0;
    pthread_mutex_unlock(&c->mu);
    return g;
}

void *kvd_client_reservation_ptr(kvd_client_t *c,
                                 const kvd_store_reservation_t *r, uint64_t len)
{
    void *p = NULL;
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; r->status == KVD_OK && len > 0 && i < c->n_maps; i++) {
        if (c->maps[i].gen == r->reserved) {
            p = kvd_arena_mapping_ptr(c->maps[i].map, r->arena_offset, len);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
    return p;
}

kvd_status_t kvd_client_arena_export(kvd_client_t *c,
                                     kvd_store_arena_export_t *out)
{
    pthread_mutex_lock(&c->mu);
    int fd = fcntl(c->arena_fd, F_DUPFD_CLOEXEC, 0);
    int e = errno;
    out->map_bytes = c->map_bytes;
    out->size_bytes = c->size_bytes;
    out->offset = c->offset;
    pthread_mutex_unlock(&c->mu);
    if (fd < 0) {
        return kvd_status_from_errno(e);
    }
    out->fd = fd;
    return KVD_OK;
}

kvd_status_t kvd_client_stats(kvd_client_t *c, kvd_store_stats_t *out)
{
    cl_flush_releases(c);
    kvd_pb_stats_request_t rq = KVDEPOT__V1__STATS_REQUEST__INIT;
    kvd_pb_stats_response_t *rsp = NULL;
    uint64_t used;
    kvd_status_t s = cl_call(c, CL_STATS, KVD_PROTO_MSG_STATS_REQUEST, &rq.base,
                             KVD_PROTO_MSG_STATS_RESPONSE,
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
        d->errors = t->checksum_errors;
        out->checksum_errors += t->checksum_errors;
    }
    out->leases = rsp->active_leases;
    kvd_proto_stats_response_free(rsp);
    return KVD_OK;
}

static kvd_status_t cl_admin(kvd_client_t *c, kvd_pb_admin_request_t *rq,
                             kvd_pb_admin_response_t **rsp)
{
    cl_flush_releases(c);
    uint64_t used;
    kvd_status_t s = cl_call(c, CL_ADMIN, KVD_PROTO_MSG_ADMIN_REQUEST,
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

/* ---- open / close -------------------------------------------------------- */

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
    grpc_init();
    /* The minimal stack leaves out what a local store call does not use
     * (census, compression, retry buffering); deadlines stay on. Reconnect
     * backoff starts at 100 ms and stays under 1 s, so a restarted daemon
     * is found again quickly. GRPC_ARG_MIN_RECONNECT_BACKOFF_MS is left
     * alone: gRPC also takes it as the time one connection attempt may
     * wait for the server's first SETTINGS frame, and a daemon slower than
     * that to answer (a loaded machine, valgrind) failed every call with
     * UNREACHABLE; each call's deadline (store.timeout) bounds the wait. */
    grpc_arg args[6] = {
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MINIMAL_STACK,
         .value.integer = 1},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_ENABLE_DEADLINE_CHECKS,
         .value.integer = 1},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_ENABLE_RETRIES,
         .value.integer = 0},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = CL_MAX_MESSAGE},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
         .value.integer = 1000},
        {.type = GRPC_ARG_INTEGER,
         .key = (char *)GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
         .value.integer = 100},
    };
    grpc_channel_args cargs = {.num_args = 6, .args = args};
    grpc_channel_credentials *creds = grpc_insecure_credentials_create();
    c->ch = grpc_channel_create(c->address, creds, &cargs);
    grpc_channel_credentials_release(creds);
    pthread_mutex_lock(&c->mu);
    s = cl_map(c, err, err_len);
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
    int rc = pthread_create(&c->get_thread, NULL, cl_get_main, c);
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
        cl_flush_releases(c);
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
        cl_release_ids(c, ids + off, k - off < 4096 ? k - off : 4096);
    }
    free(ids);
    for (size_t b = 0; b < CL_BUCKETS; b++) {
        while (c->resv[b] != NULL) {
            cl_resv_t *r = c->resv[b];
            c->resv[b] = r->next;
            free(r);
        }
    }
    if (c->ch != NULL) {
        grpc_channel_destroy(c->ch);
        grpc_shutdown();
    }
    while (c->n_maps > 0) {
        map_remove(c, c->n_maps - 1);
    }
    if (c->arena_fd >= 0) {
        close(c->arena_fd);
    }
    kvd_ring_destroy(c->cq);
    free(c->rel);
    free(c->groups);
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
