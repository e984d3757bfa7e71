/*
 * The message table and the pack/unpack/free entry points of kvd_proto.h.
 *
 * Unpacking runs four gates, cheapest first, so hostile input is refused
 * before it costs memory: the per-type size cap; wire.c's allocation-free
 * scan (structure, counts, strings); protobuf-c's decoder behind a budget
 * allocator; validate.c's semantic rules. The budget exists because
 * protobuf-c amplifies: an empty sub-message is two bytes on the wire but
 * sizeof(struct) plus a pointer in memory, and its scanner keeps a 32-byte
 * record per field while it decodes a level. The budget allocator therefore
 * counts live bytes (with a small header per block so frees are counted
 * too) and refuses the allocation that would cross the limit; protobuf-c
 * then unwinds and returns NULL, and the allocator's flags tell a budget
 * refusal from a real out-of-memory.
 *
 * Everything else here is one generic function per operation, driven by the
 * table; kvd_proto.h wraps them per message type.
 */
#include <stdalign.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log_int.h"
#include "proto/codec_int.h"

#define KVD_PROTO_INFO_(snake, UPPER, Camel)                                   \
    [KVD_PROTO_MSG_##UPPER] = {#snake, &kvdepot__v1__##snake##__descriptor},
static const kvd_proto_msg_info_t msg_table[KVD_PROTO_MSG_COUNT] = {
    KVD_PROTO_MESSAGES(KVD_PROTO_INFO_)};
#undef KVD_PROTO_INFO_

/* Messages whose valid encodings are small get the small cap, so a peer
 * cannot make the daemon buffer and scan 16 MiB for a ping. */
static const kvd_proto_msg_t small_messages[] = {
    KVD_PROTO_MSG_NAMESPACE_DESCRIPTOR,
    KVD_PROTO_MSG_OBJECT_DESCRIPTOR,
    KVD_PROTO_MSG_COMMIT_RESPONSE,
    KVD_PROTO_MSG_ABORT_RESPONSE,
    KVD_PROTO_MSG_RELEASE_REQUEST,
    KVD_PROTO_MSG_RELEASE_RESPONSE,
    KVD_PROTO_MSG_PROMOTE_RESPONSE,
    KVD_PROTO_MSG_STATS_REQUEST,
    KVD_PROTO_MSG_STATS_RESPONSE,
    KVD_PROTO_MSG_ADMIN_REQUEST,
    KVD_PROTO_MSG_ADMIN_RESPONSE,
    KVD_PROTO_MSG_DELETE_RESPONSE,
    KVD_PROTO_MSG_NODE_INFO,
};

const kvd_proto_msg_info_t *kvd_proto_msg_info(kvd_proto_msg_t type)
{
    if ((unsigned)type >= KVD_PROTO_MSG_COUNT) {
        return NULL;
    }
    return &msg_table[type];
}

const char *kvd_proto_msg_name(kvd_proto_msg_t type)
{
    const kvd_proto_msg_info_t *info = kvd_proto_msg_info(type);
    return info ? info->name : NULL;
}

size_t kvd_proto_max_bytes(kvd_proto_msg_t type)
{
    if (kvd_proto_msg_info(type) == NULL) {
        return 0;
    }
    for (size_t i = 0; i < sizeof(small_messages) / sizeof(*small_messages);
         i++) {
        if (small_messages[i] == type) {
            return KVD_PROTO_MAX_SMALL_MESSAGE_BYTES;
        }
    }
    return KVD_PROTO_MAX_MESSAGE_BYTES;
}

size_t kvd_proto_unpack_budget(size_t len)
{
    if (len > (SIZE_MAX - KVD_PROTO_BUDGET_BASE_BYTES) /
                  KVD_PROTO_BUDGET_PER_INPUT_BYTE) {
        return SIZE_MAX;
    }
    return KVD_PROTO_BUDGET_BASE_BYTES + len * KVD_PROTO_BUDGET_PER_INPUT_BYTE;
}

/* Writes a reason that has no field path (argument errors, size caps). */
static kvd_status_t fail(kvd_status_t status, char *reason, size_t reason_len,
                         const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static kvd_status_t fail(kvd_status_t status, char *reason, size_t reason_len,
                         const char *fmt, ...)
{
    if (reason != NULL && reason_len > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(reason, reason_len, fmt, ap);
        va_end(ap);
    }
    return status;
}

/* ------------------------------------------------------------------------ */
/* Budget allocator                                                         */
/* ------------------------------------------------------------------------ */

/* Each block carries its size in front, so free can give it back to the
 * budget and messages can be freed later without the budget's state. The
 * header keeps malloc's alignment for the protobuf-c structs behind it. */
#define ALLOC_HDR_BYTES alignof(max_align_t)
_Static_assert(alignof(max_align_t) >= sizeof(size_t),
               "allocation header must hold a size_t");

typedef struct budget {
    size_t limit;
    size_t live;
    bool over_budget;
    bool out_of_memory;
} budget_t;

static void *budget_alloc(void *data, size_t size)
{
    budget_t *budget = data;
    if (size > SIZE_MAX - ALLOC_HDR_BYTES ||
        size + ALLOC_HDR_BYTES > budget->limit - budget->live) {
        budget->over_budget = true;
        return NULL;
    }
    size_t total = size + ALLOC_HDR_BYTES;
    unsigned char *block = malloc(total);
    if (block == NULL) {
        budget->out_of_memory = true;
        return NULL;
    }
    memcpy(block, &total, sizeof(total));
    budget->live += total;
    return block + ALLOC_HDR_BYTES;
}

static void budget_free(void *data, void *ptr)
{
    if (ptr == NULL) {
        return;
    }
    unsigned char *block = (unsigned char *)ptr - ALLOC_HDR_BYTES;
    if (data != NULL) {
        budget_t *budget = data;
        size_t total;
        memcpy(&total, block, sizeof(total));
        budget->live -= total;
    }
    free(block);
}

/* Frees messages after their unpack returned: same block layout, no
 * budget left to update. */
static ProtobufCAllocator release_allocator = {budget_alloc, budget_free, NULL};

/* ------------------------------------------------------------------------ */
/* Entry points                                                             */
/* ------------------------------------------------------------------------ */

/* Checks `type` and fetches its info and schema. */
static kvd_status_t lookup(kvd_proto_msg_t type,
                           const kvd_proto_msg_info_t **info_out,
                           const kvd_proto_schema_t **schema_out, char *reason,
                           size_t reason_len)
{
    const kvd_proto_msg_info_t *info = kvd_proto_msg_info(type);
    if (info == NULL) {
        return fail(KVD_ERR_INVALID, reason, reason_len,
                    "unknown message type %d", (int)type);
    }
    const kvd_proto_schema_t *schema = NULL;
    kvd_status_t status = kvd_proto_schema_get(type, &schema);
    if (status != KVD_OK) {
        return fail(status, reason, reason_len,
                    "%s: schema tables do not match the generated code",
                    info->name);
    }
    *info_out = info;
    *schema_out = schema;
    return KVD_OK;
}

kvd_status_t kvd_proto_unpack_with_budget(kvd_proto_msg_t type,
                                          const void *data, size_t len,
                                          size_t budget_bytes,
                                          ProtobufCMessage **msg_out,
                                          char *reason, size_t reason_len)
{
    const kvd_proto_msg_info_t *info = NULL;
    const kvd_proto_schema_t *schema = NULL;
    kvd_status_t status = lookup(type, &info, &schema, reason, reason_len);
    if (status != KVD_OK) {
        return status;
    }
    if (msg_out == NULL || (data == NULL && len > 0)) {
        return fail(KVD_ERR_INVALID, reason, reason_len, "%s: NULL %s",
                    info->name, msg_out == NULL ? "msg_out" : "data");
    }
    size_t max_bytes = kvd_proto_max_bytes(type);
    if (len > max_bytes) {
        status = fail(KVD_ERR_PROTO, reason, reason_len,
                      "%s: %zu bytes, max %zu", info->name, len, max_bytes);
        goto err_log;
    }
    /* protobuf-c never reads `data` when len is 0, but it must not be
     * handed NULL all the same. */
    static const uint8_t empty[1];
    const uint8_t *bytes = len > 0 ? data : empty;

    status =
        kvd_proto_wire_scan(schema, info->name, bytes, len, reason, reason_len);
    if (status != KVD_OK) {
        goto err_log;
    }

    budget_t budget = {.limit = budget_bytes};
    ProtobufCAllocator allocator = {budget_alloc, budget_free, &budget};
    ProtobufCMessage *msg =
        protobuf_c_message_unpack(info->desc, &allocator, len, bytes);
    if (msg == NULL) {
        if (budget.out_of_memory) {
            status =
                fail(KVD_ERR_NOMEM, reason, reason_len,
                     "%s: out of memory decoding %zu bytes", info->name, len);
        } else if (budget.over_budget) {
            status = fail(KVD_ERR_PROTO, reason, reason_len,
                          "%s: decoding %zu bytes exceeds the memory budget "
                          "of %zu bytes",
                          info->name, len, budget_bytes);
        } else {
            /* wire.c accepts only what protobuf-c decodes; reaching this
             * means the two disagree, which the fuzzers look for. */
            status = fail(KVD_ERR_PROTO, reason, reason_len,
                          "%s: protobuf-c rejected the encoding", info->name);
        }
        goto err_log;
    }

    status =
        kvd_proto_validate_schema(schema, info->name, msg, reason, reason_len);
    if (status != KVD_OK) {
        goto err_free;
    }
    *msg_out = msg;
    return KVD_OK;

err_free:
    protobuf_c_message_free_unpacked(msg, &release_allocator);
err_log:
    /* Peers control this input: DEBUG only, the caller decides whether a
     * refusal is worth more (it has the reason). */
    KVD_LOG_DEBUG("%s: unpack of %zu bytes refused: %s", info->name, len,
                  reason != NULL && reason_len > 0 ? reason : "(no reason)");
    return status;
}

kvd_status_t kvd_proto_unpack(kvd_proto_msg_t type, const void *data,
                              size_t len, ProtobufCMessage **msg_out,
                              char *reason, size_t reason_len)
{
    return kvd_proto_unpack_with_budget(type, data, len,
                                        kvd_proto_unpack_budget(len), msg_out,
                                        reason, reason_len);
}

kvd_status_t kvd_proto_validate(kvd_proto_msg_t type,
                                const ProtobufCMessage *msg, char *reason,
                                size_t reason_len)
{
    const kvd_proto_msg_info_t *info = NULL;
    const kvd_proto_schema_t *schema = NULL;
    kvd_status_t status = lookup(type, &info, &schema, reason, reason_len);
    if (status != KVD_OK) {
        return status;
    }
    if (msg == NULL) {
        return fail(KVD_ERR_INVALID, reason, reason_len, "%s: NULL message",
                    info->name);
    }
    if (msg->descriptor != info->desc) {
        return fail(KVD_ERR_INVALID, reason, reason_len, "%s: message is a %s",
                    info->name,
                    msg->descriptor != NULL ? msg->descriptor->name
                                            : "(no descriptor)");
    }
    return kvd_proto_validate_schema(schema, info->name, msg, reason,
                                     reason_len);
}

kvd_status_t kvd_proto_packed_size(kvd_proto_msg_t type,
                                   const ProtobufCMessage *msg, size_t *len_out,
                                   char *reason, size_t reason_len)
{
    kvd_status_t status = kvd_proto_validate(type, msg, reason, reason_len);
    if (status != KVD_OK) {
        return status;
    }
    if (len_out == NULL) {
        return fail(KVD_ERR_INVALID, reason, reason_len, "%s: NULL len_out",
                    kvd_proto_msg_name(type));
    }
    size_t len = protobuf_c_message_get_packed_size(msg);
    size_t max_bytes = kvd_proto_max_bytes(type);
    if (len > max_bytes) {
        return fail(KVD_ERR_PROTO, reason, reason_len,
                    "%s: encodes to %zu bytes, max %zu",
                    kvd_proto_msg_name(type), len, max_bytes);
    }
    *len_out = len;
    return KVD_OK;
}

/* Encodes an already validated message of `len` bytes into `buf`. */
static kvd_status_t pack_into(kvd_proto_msg_t type, const ProtobufCMessage *msg,
                              uint8_t *buf, size_t len, char *reason,
                              size_t reason_len)
{
    if (len > 0 && protobuf_c_message_pack(msg, buf) != len) {
        return fail(KVD_ERR_INTERNAL, reason, reason_len,
                    "%s: protobuf-c packed a different size than it computed",
                    kvd_proto_msg_name(type));
    }
    return KVD_OK;
}

kvd_status_t kvd_proto_pack(kvd_proto_msg_t type, const ProtobufCMessage *msg,
                            uint8_t *buf, size_t buf_len, size_t *len_out,
                            char *reason, size_t reason_len)
{
    size_t len;
    kvd_status_t status =
        kvd_proto_packed_size(type, msg, &len, reason, reason_len);
    if (status != KVD_OK) {
        return status;
    }
    if (len_out == NULL || (buf == NULL && buf_len > 0)) {
        return fail(KVD_ERR_INVALID, reason, reason_len, "%s: NULL %s",
                    kvd_proto_msg_name(type),
                    len_out == NULL ? "len_out" : "buf");
    }
    if (len > buf_len) {
        return fail(KVD_ERR_RANGE, reason, reason_len,
                    "%s: needs %zu bytes, buffer has %zu",
                    kvd_proto_msg_name(type), len, buf_len);
    }
    status = pack_into(type, msg, buf, len, reason, reason_len);
    if (status != KVD_OK) {
        return status;
    }
    *len_out = len;
    return KVD_OK;
}

kvd_status_t kvd_proto_pack_alloc(kvd_proto_msg_t type,
                                  const ProtobufCMessage *msg,
                                  uint8_t **buf_out, size_t *len_out,
                                  char *reason, size_t reason_len)
{
    size_t len;
    kvd_status_t status =
        kvd_proto_packed_size(type, msg, &len, reason, reason_len);
    if (status != KVD_OK) {
        return status;
    }
    if (buf_out == NULL || len_out == NULL) {
        return fail(KVD_ERR_INVALID, reason, reason_len, "%s: NULL %s",
                    kvd_proto_msg_name(type),
                    buf_out == NULL ? "buf_out" : "len_out");
    }
    uint8_t *buf = malloc(len > 0 ? len : 1);
    if (buf == NULL) {
        return fail(KVD_ERR_NOMEM, reason, reason_len,
                    "%s: out of memory for %zu bytes", kvd_proto_msg_name(type),
                    len);
    }
    status = pack_into(type, msg, buf, len, reason, reason_len);
    if (status != KVD_OK) {
        goto err_free;
    }
    *buf_out = buf;
    *len_out = len;
    return KVD_OK;

err_free:
    free(buf);
    return status;
}

void kvd_proto_free(ProtobufCMessage *msg)
{
    if (msg != NULL) {
        protobuf_c_message_free_unpacked(msg, &release_allocator);
    }
}
