/*
 * kvdepot wire messages (package kvdepot.v1): pack, unpack and validate.
 *
 * The leader, the workers, the store client and the daemon exchange the
 * protobuf messages of proto/kvdepot/v1/{metadata,store}.proto. The C types
 * are protoc-c's generated structs (Kvdepot__V1__StepPlan, ...; aliases
 * kvd_pb_<message>_t below). This header is the only way into them: no
 * file outside proto/ includes a protobuf-c header itself.
 *
 * Every top-level message has the same five calls, generated below as thin
 * typed wrappers around one table-driven core:
 *
 *   kvd_proto_<msg>_unpack(data, len, &msg, reason, reason_len)
 *   kvd_proto_<msg>_validate(msg, reason, reason_len)
 *   kvd_proto_<msg>_packed_size(msg, &len, reason, reason_len)
 *   kvd_proto_<msg>_pack(msg, buf, buf_len, &len, reason, reason_len)
 *   kvd_proto_<msg>_pack_alloc(msg, &buf, &len, reason, reason_len)
 *   kvd_proto_<msg>_free(msg)
 *
 * for <msg> in step_plan, worker_report, namespace_descriptor,
 * object_descriptor, lookup_request, lookup_response, reserve_request,
 * reserve_response, commit_request, commit_response, abort_request,
 * abort_response, release_request, release_response, get_request,
 * get_response, promote_request, promote_response, stats_request,
 * stats_response, admin_request, admin_response.
 *
 * Unpack treats its input as hostile. In order it: bounds the input size
 * (kvd_proto_max_bytes); scans the wire bytes without allocating (field
 * numbers, wire types, truncation, repeated-field counts against the limits
 * below, at most one occurrence of each singular field and oneof, no NUL
 * byte inside a string, at most KVD_PROTO_MAX_UNKNOWN_FIELDS unknown fields
 * per message); decodes with protobuf-c through a budget allocator that
 * fails once the memory in use would exceed kvd_proto_unpack_budget(len);
 * then validates the semantics (lengths, ranges, enum values, uniqueness,
 * cross-field rules; docs/protocol.md lists them all). Pack validates first,
 * so nothing invalid is ever sent.
 *
 * Errors (every call): KVD_ERR_INVALID for a bad argument (NULL, unknown
 * type, a message of another type); KVD_ERR_PROTO for malformed or invalid
 * bytes or messages (also for input over the size limit or over the
 * memory budget); KVD_ERR_NOMEM when malloc itself fails; KVD_ERR_RANGE
 * when a caller buffer is too small. On any error a NUL-terminated reason
 * naming the field path, e.g. "step_plan.requests[3].loads[7].key.block_hash:
 * 31 bytes, want 32", is written into `reason` (at most `reason_len` bytes,
 * truncated; `reason` may be NULL when `reason_len` is 0); on success
 * `reason` is left alone. Out-parameters are written only on success.
 *
 * Ownership: a message returned by unpack belongs to the caller and must be
 * released with the matching _free (it was allocated by the budget
 * allocator, so protobuf-c's own free must not be used). Messages passed to
 * validate/pack are borrowed for the call; they may be built by the caller
 * on the stack with the generated *__INIT macros and are never freed here.
 * Unpacked messages do not point into the input buffer.
 *
 * Threads: every call is thread-safe and reentrant; distinct messages may
 * be used from different threads concurrently, one message from one
 * thread at a time. The first call builds read-only schema tables once.
 */
#ifndef KVD_PROTO_H
#define KVD_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"
#include "kvdepot/v1/metadata.pb-c.h"
#include "kvdepot/v1/store.pb-c.h"
#include "kvdepot/v1/cluster.pb-c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Versioning                                                               */
/* ------------------------------------------------------------------------ */

/* Package kvdepot.v1; PingReply.protocol_major. */
#define KVD_PROTO_MAJOR 1
/* Additive revision of v1 this build speaks (PingReply.protocol_revision);
 * bumped whenever a field, message or enum value is added. */
#define KVD_PROTO_REVISION 9

/* ------------------------------------------------------------------------ */
/* Validation limits (docs/protocol.md explains each choice)                */
/* ------------------------------------------------------------------------ */

/* ObjectKey.namespace_id and every *.namespace_id: exact length. */
#define KVD_PROTO_NAMESPACE_ID_BYTES 16
/* ObjectKey.block_hash and every *.block_hash(es): exact length (SHA-256). */
#define KVD_PROTO_BLOCK_HASH_BYTES 32
/* Request ids, model id, tenant, version strings: UTF-8 bytes, at most. */
#define KVD_PROTO_MAX_ID_BYTES 256
/* Node ids: UTF-8 bytes, at most. */
#define KVD_PROTO_MAX_NODE_ID_BYTES 128
/* Requests in one StepPlan; ids in finished/preempted lists. */
#define KVD_PROTO_MAX_REQUESTS 8192
/* Loads, and separately saves, of one StepRequest (1M tokens at 16). */
#define KVD_PROTO_MAX_BLOCKS_PER_REQUEST 65536
/* Loads plus saves over a whole StepPlan; failed loads in one report. */
#define KVD_PROTO_MAX_BLOCKS_PER_PLAN 131072
/* Hashes (or entries) in one store batch: Lookup, Reserve, Commit, Abort,
 * Get, Promote, and their responses. */
#define KVD_PROTO_MAX_HASHES 65536
/* Lease ids in one Release. */
#define KVD_PROTO_MAX_LEASES 4096
/* Namespaces, and separately tenants, in one ListNamespacesReply. */
#define KVD_PROTO_MAX_NAMESPACES 4096
/* A node's UCX worker address and gRPC address in its NodeInfo. */
#define KVD_PROTO_MAX_UCX_ADDRESS_BYTES 1024
#define KVD_PROTO_MAX_ADDRESS_BYTES 256
/* Nodes in one ClusterNodesReply (the daemon's view holds at most this
 * many, cluster/membership.h KVD_MEMBERSHIP_MAX_NODES). */
#define KVD_PROTO_MAX_CLUSTER_NODES 1024
/* Keys in one Admin pin. */
#define KVD_PROTO_MAX_PIN_KEYS 4096
/* Namespaces one Admin events call names, and events in one reply. */
#define KVD_PROTO_MAX_EVENT_NAMESPACES 64
#define KVD_PROTO_MAX_EVENTS 4096
/* Entries of a ConfigDumpReply, and the longest key, value or source. */
#define KVD_PROTO_MAX_CONFIG_ENTRIES 256
#define KVD_PROTO_MAX_CONFIG_TEXT 1024
/* Engine block ids and worker ranks are non-negative int32 values. */
#define KVD_PROTO_MAX_BLOCK_ID INT32_MAX
/* A token's position in a request (StepPlan loads and saves): 2^40, far
 * beyond any context length, and exact in a double. */
#define KVD_PROTO_MAX_POSITION (INT64_C(1) << 40)
/* Layers per shard and per-layer checksums per object; KV heads; head
 * elements; tokens per block; tensor-parallel size. */
#define KVD_PROTO_MAX_LAYERS 1024
#define KVD_PROTO_MAX_HEADS 1024
#define KVD_PROTO_MAX_HEAD_DIM 1024
#define KVD_PROTO_MAX_BLOCK_SIZE 4096
#define KVD_PROTO_MAX_TP_SIZE 1024
/* One stored object's payload. */
#define KVD_PROTO_MAX_OBJECT_BYTES (UINT64_C(1) << 30)
/* Parts of one object written by several writers (ReserveRequest.num_parts;
 * KVD_STORE_MAX_PARTS). */
#define KVD_PROTO_MAX_PARTS 64u
/* Lease, reservation and flush timeouts (one hour). */
#define KVD_PROTO_MAX_TTL_MS 3600000u
/* Entries of StatsResponse.tiers (one per Tier value). */
#define KVD_PROTO_MAX_TIERS 3
/* Fields a reader does not know, per message instance (forward
 * compatibility room; see docs/protocol.md, versioning). */
#define KVD_PROTO_MAX_UNKNOWN_FIELDS 1024
/* Largest encoded message of any type (see kvd_proto_max_bytes). */
#define KVD_PROTO_MAX_MESSAGE_BYTES (16u << 20)
/* Encoded size cap of the small messages (descriptors, admin, stats,
 * release and the count-only responses). */
#define KVD_PROTO_MAX_SMALL_MESSAGE_BYTES (64u << 10)
/* Unpack memory budget: BASE + PER_INPUT_BYTE * input length, counting every
 * live allocation protobuf-c makes plus a 16-byte header each. The densest
 * valid message measured needs 36x its size; a flood of empty sub-messages
 * needs 52-68x and is refused. */
#define KVD_PROTO_BUDGET_BASE_BYTES (64u << 10)
#define KVD_PROTO_BUDGET_PER_INPUT_BYTE 48u
/* A reason buffer of this size never truncates a path of this schema. */
#define KVD_PROTO_REASON_MAX 256

/* ------------------------------------------------------------------------ */
/* Message table                                                            */
/* ------------------------------------------------------------------------ */

/* X(snake_name, UPPER_NAME, GeneratedCamelName) for every top-level
 * message, in kvd_proto_msg_t order. */
#define KVD_PROTO_MESSAGES(X)                                                  \
    X(step_plan, STEP_PLAN, StepPlan)                                          \
    X(worker_report, WORKER_REPORT, WorkerReport)                              \
    X(namespace_descriptor, NAMESPACE_DESCRIPTOR, NamespaceDescriptor)         \
    X(object_descriptor, OBJECT_DESCRIPTOR, ObjectDescriptor)                  \
    X(lookup_request, LOOKUP_REQUEST, LookupRequest)                           \
    X(lookup_response, LOOKUP_RESPONSE, LookupResponse)                        \
    X(reserve_request, RESERVE_REQUEST, ReserveRequest)                        \
    X(reserve_response, RESERVE_RESPONSE, ReserveResponse)                     \
    X(commit_request, COMMIT_REQUEST, CommitRequest)                           \
    X(commit_response, COMMIT_RESPONSE, CommitResponse)                        \
    X(abort_request, ABORT_REQUEST, AbortRequest)                              \
    X(abort_response, ABORT_RESPONSE, AbortResponse)                           \
    X(release_request, RELEASE_REQUEST, ReleaseRequest)                        \
    X(release_response, RELEASE_RESPONSE, ReleaseResponse)                     \
    X(get_request, GET_REQUEST, GetRequest)                                    \
    X(get_response, GET_RESPONSE, GetResponse)                                 \
    X(promote_request, PROMOTE_REQUEST, PromoteRequest)                        \
    X(promote_response, PROMOTE_RESPONSE, PromoteResponse)                     \
    X(stats_request, STATS_REQUEST, StatsRequest)                              \
    X(stats_response, STATS_RESPONSE, StatsResponse)                           \
    X(admin_request, ADMIN_REQUEST, AdminRequest)                              \
    X(admin_response, ADMIN_RESPONSE, AdminResponse)                           \
    X(delete_request, DELETE_REQUEST, DeleteRequest)                           \
    X(delete_response, DELETE_RESPONSE, DeleteResponse)                        \
    X(node_info, NODE_INFO, NodeInfo)

/* KVD_PROTO_MSG_STEP_PLAN, ... KVD_PROTO_MSG_COUNT. */
typedef enum kvd_proto_msg {
#define KVD_PROTO_ENUM_(snake, UPPER, Camel) KVD_PROTO_MSG_##UPPER,
    KVD_PROTO_MESSAGES(KVD_PROTO_ENUM_)
#undef KVD_PROTO_ENUM_
        KVD_PROTO_MSG_COUNT
} kvd_proto_msg_t;

/* Short aliases of the generated types, top-level and nested. */
#define KVD_PROTO_TYPEDEF_(snake, UPPER, Camel)                                \
    typedef Kvdepot__V1__##Camel kvd_pb_##snake##_t;
KVD_PROTO_MESSAGES(KVD_PROTO_TYPEDEF_)
KVD_PROTO_TYPEDEF_(object_key, OBJECT_KEY, ObjectKey)
KVD_PROTO_TYPEDEF_(block_source, BLOCK_SOURCE, BlockSource)
KVD_PROTO_TYPEDEF_(block_load, BLOCK_LOAD, BlockLoad)
KVD_PROTO_TYPEDEF_(block_save, BLOCK_SAVE, BlockSave)
KVD_PROTO_TYPEDEF_(step_request, STEP_REQUEST, StepRequest)
KVD_PROTO_TYPEDEF_(failed_load, FAILED_LOAD, FailedLoad)
KVD_PROTO_TYPEDEF_(tier_load, TIER_LOAD, TierLoad)
KVD_PROTO_TYPEDEF_(block_location, BLOCK_LOCATION, BlockLocation)
KVD_PROTO_TYPEDEF_(block_reservation, BLOCK_RESERVATION, BlockReservation)
KVD_PROTO_TYPEDEF_(commit_entry, COMMIT_ENTRY, CommitEntry)
KVD_PROTO_TYPEDEF_(get_entry, GET_ENTRY, GetEntry)
KVD_PROTO_TYPEDEF_(tier_stats, TIER_STATS, TierStats)
KVD_PROTO_TYPEDEF_(ping, PING, Ping)
KVD_PROTO_TYPEDEF_(ping_reply, PING_REPLY, PingReply)
KVD_PROTO_TYPEDEF_(drop_namespace, DROP_NAMESPACE, DropNamespace)
KVD_PROTO_TYPEDEF_(drop_namespace_reply, DROP_NAMESPACE_REPLY,
                   DropNamespaceReply)
KVD_PROTO_TYPEDEF_(flush, FLUSH, Flush)
KVD_PROTO_TYPEDEF_(flush_reply, FLUSH_REPLY, FlushReply)
KVD_PROTO_TYPEDEF_(list_namespaces, LIST_NAMESPACES, ListNamespaces)
KVD_PROTO_TYPEDEF_(namespace_usage, NAMESPACE_USAGE, NamespaceUsage)
KVD_PROTO_TYPEDEF_(tenant_usage, TENANT_USAGE, TenantUsage)
KVD_PROTO_TYPEDEF_(list_namespaces_reply, LIST_NAMESPACES_REPLY,
                   ListNamespacesReply)
KVD_PROTO_TYPEDEF_(drain, DRAIN, Drain)
KVD_PROTO_TYPEDEF_(drain_reply, DRAIN_REPLY, DrainReply)
KVD_PROTO_TYPEDEF_(drop_tenant, DROP_TENANT, DropTenant)
KVD_PROTO_TYPEDEF_(drop_tenant_reply, DROP_TENANT_REPLY, DropTenantReply)
KVD_PROTO_TYPEDEF_(config_dump, CONFIG_DUMP, ConfigDump)
KVD_PROTO_TYPEDEF_(config_entry, CONFIG_ENTRY, ConfigEntry)
KVD_PROTO_TYPEDEF_(config_dump_reply, CONFIG_DUMP_REPLY, ConfigDumpReply)
KVD_PROTO_TYPEDEF_(cluster_nodes, CLUSTER_NODES, ClusterNodes)
KVD_PROTO_TYPEDEF_(cluster_node, CLUSTER_NODE, ClusterNode)
KVD_PROTO_TYPEDEF_(cluster_nodes_reply, CLUSTER_NODES_REPLY, ClusterNodesReply)
KVD_PROTO_TYPEDEF_(pin, PIN, Pin)
KVD_PROTO_TYPEDEF_(pin_reply, PIN_REPLY, PinReply)
KVD_PROTO_TYPEDEF_(events, EVENTS, Events)
KVD_PROTO_TYPEDEF_(store_event, STORE_EVENT, StoreEvent)
KVD_PROTO_TYPEDEF_(events_reply, EVENTS_REPLY, EventsReply)
#undef KVD_PROTO_TYPEDEF_

/* "step_plan", ... (the reason prefix); NULL for an unknown type. */
const char *kvd_proto_msg_name(kvd_proto_msg_t type);

/* Largest accepted encoding of `type` in bytes: KVD_PROTO_MAX_MESSAGE_BYTES
 * for plans, reports and store batches, KVD_PROTO_MAX_SMALL_MESSAGE_BYTES
 * for the rest; 0 for an unknown type. Unpack refuses longer input, pack
 * refuses to produce it. */
size_t kvd_proto_max_bytes(kvd_proto_msg_t type);

/* Memory budget of one unpack of `len` input bytes (see
 * KVD_PROTO_BUDGET_*); saturates instead of overflowing. */
size_t kvd_proto_unpack_budget(size_t len);

/* ------------------------------------------------------------------------ */
/* Generic core (the typed wrappers below are what callers use)             */
/* ------------------------------------------------------------------------ */

/*
 * Decodes and validates `len` bytes at `data` as a `type` message (see the
 * top of this file for the steps). `data` may be NULL only when `len` is 0.
 * On success *msg_out is a new message to release with kvd_proto_free.
 */
kvd_status_t kvd_proto_unpack(kvd_proto_msg_t type, const void *data,
                              size_t len, ProtobufCMessage **msg_out,
                              char *reason, size_t reason_len);

/*
 * kvd_proto_unpack with an explicit memory budget instead of
 * kvd_proto_unpack_budget(len): for callers that know a tighter bound, and
 * for tests of the budget itself. Exceeding it is KVD_ERR_PROTO with a
 * reason containing "memory budget".
 */
kvd_status_t kvd_proto_unpack_with_budget(kvd_proto_msg_t type,
                                          const void *data, size_t len,
                                          size_t budget_bytes,
                                          ProtobufCMessage **msg_out,
                                          char *reason, size_t reason_len);

/* Checks every semantic rule on `msg` (same rules unpack applies). The
 * message's descriptor must be the one of `type` (else KVD_ERR_INVALID).
 * May allocate scratch memory for uniqueness checks (KVD_ERR_NOMEM). */
kvd_status_t kvd_proto_validate(kvd_proto_msg_t type,
                                const ProtobufCMessage *msg, char *reason,
                                size_t reason_len);

/* Validates `msg`, then writes its encoded size to *len_out. KVD_ERR_PROTO
 * if that exceeds kvd_proto_max_bytes(type). */
kvd_status_t kvd_proto_packed_size(kvd_proto_msg_t type,
                                   const ProtobufCMessage *msg, size_t *len_out,
                                   char *reason, size_t reason_len);

/* Validates and encodes `msg` into `buf` (`buf_len` bytes), writing the
 * encoded length to *len_out. KVD_ERR_RANGE (nothing written) when the
 * buffer is too small; kvd_proto_packed_size says how much is needed. */
kvd_status_t kvd_proto_pack(kvd_proto_msg_t type, const ProtobufCMessage *msg,
                            uint8_t *buf, size_t buf_len, size_t *len_out,
                            char *reason, size_t reason_len);

/* Same into a new malloc'd buffer (*buf_out, release with free()); a valid
 * message that encodes to zero bytes still gets a non-NULL buffer. */
kvd_status_t kvd_proto_pack_alloc(kvd_proto_msg_t type,
                                  const ProtobufCMessage *msg,
                                  uint8_t **buf_out, size_t *len_out,
                                  char *reason, size_t reason_len);

/* Releases a message returned by kvd_proto_unpack; NULL is accepted. Never
 * pass a message built by the caller. */
void kvd_proto_free(ProtobufCMessage *msg);

/* ------------------------------------------------------------------------ */
/* Typed wrappers                                                           */
/* ------------------------------------------------------------------------ */

#define KVD_PROTO_WRAPPERS_(snake, UPPER, Camel)                               \
    static inline kvd_status_t kvd_proto_##snake##_unpack(                     \
        const void *data, size_t len, Kvdepot__V1__##Camel **msg_out,          \
        char *reason, size_t reason_len)                                       \
    {                                                                          \
        ProtobufCMessage *msg = NULL;                                          \
        kvd_status_t status =                                                  \
            kvd_proto_unpack(KVD_PROTO_MSG_##UPPER, data, len,                 \
                             msg_out ? &msg : NULL, reason, reason_len);       \
        if (status == KVD_OK) {                                                \
            *msg_out = (Kvdepot__V1__##Camel *)(void *)msg;                    \
        }                                                                      \
        return status;                                                         \
    }                                                                          \
    static inline kvd_status_t kvd_proto_##snake##_validate(                   \
        const Kvdepot__V1__##Camel *msg, char *reason, size_t reason_len)      \
    {                                                                          \
        return kvd_proto_validate(KVD_PROTO_MSG_##UPPER,                       \
                                  msg ? &msg->base : NULL, reason,             \
                                  reason_len);                                 \
    }                                                                          \
    static inline kvd_status_t kvd_proto_##snake##_packed_size(                \
        const Kvdepot__V1__##Camel *msg, size_t *len_out, char *reason,        \
        size_t reason_len)                                                     \
    {                                                                          \
        return kvd_proto_packed_size(KVD_PROTO_MSG_##UPPER,                    \
                                     msg ? &msg->base : NULL, len_out, reason, \
                                     reason_len);                              \
    }                                                                          \
    static inline kvd_status_t kvd_proto_##snake##_pack(                       \
        const Kvdepot__V1__##Camel *msg, uint8_t *buf, size_t buf_len,         \
        size_t *len_out, char *reason, size_t reason_len)                      \
    {                                                                          \
        return kvd_proto_pack(KVD_PROTO_MSG_##UPPER, msg ? &msg->base : NULL,  \
                              buf, buf_len, len_out, reason, reason_len);      \
    }                                                                          \
    static inline kvd_status_t kvd_proto_##snake##_pack_alloc(                 \
        const Kvdepot__V1__##Camel *msg, uint8_t **buf_out, size_t *len_out,   \
        char *reason, size_t reason_len)                                       \
    {                                                                          \
        return kvd_proto_pack_alloc(KVD_PROTO_MSG_##UPPER,                     \
                                    msg ? &msg->base : NULL, buf_out, len_out, \
                                    reason, reason_len);                       \
    }                                                                          \
    static inline void kvd_proto_##snake##_free(Kvdepot__V1__##Camel *msg)     \
    {                                                                          \
        kvd_proto_free(msg ? &msg->base : NULL);                               \
    }
KVD_PROTO_MESSAGES(KVD_PROTO_WRAPPERS_)
#undef KVD_PROTO_WRAPPERS_

#ifdef __cplusplus
}
#endif

#endif /* KVD_PROTO_H */
