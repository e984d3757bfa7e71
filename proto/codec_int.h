/*
 * Internal plumbing shared by the proto/ sources: the per-message schema
 * (field rules and cross-field checks, schema.c), the path-tracking walk
 * that formats reasons (validate.c), the allocation-free wire scan
 * (wire.c) and the message table (codec.c). Not for use outside proto/.
 *
 * A schema is built once per message descriptor reachable from the
 * top-level messages, so a walk finds a field's rule and a sub-message's
 * schema by index in O(1) instead of looking names up per element.
 */
#ifndef KVD_PROTO_CODEC_INT_H
#define KVD_PROTO_CODEC_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <protobuf-c/protobuf-c.h>

#include "proto/kvd_proto.h"

/* Deepest nesting in the schema plus room: StepPlan.requests.loads.key is
 * four levels. schema.c refuses a schema deeper than this. */
#define KVD_PROTO_MAX_DEPTH 8
/* Most fields one kvdepot message may declare (per-field arrays below). */
#define KVD_PROTO_MAX_FIELDS 32
/* Upper bound of an int64 rule: no maximum. */
#define KVD_PROTO_NO_MAX INT64_MAX
/* Frame index of a singular field (no "[i]" in the path). */
#define KVD_PROTO_NO_INDEX SIZE_MAX

enum {
    /* Singular: must be set (non-zero, non-empty, present). Repeated: at
     * least one entry. */
    KVD_PROTO_RULE_REQUIRED = 1u << 0,
    /* Repeated scalars, strings or bytes: entries pairwise different. */
    KVD_PROTO_RULE_UNIQUE = 1u << 1,
    /* Integers: value in [min, max]. Strings and bytes: length in [min,
     * max] (strings default to 0..KVD_PROTO_MAX_ID_BYTES without it). */
    KVD_PROTO_RULE_RANGE = 1u << 2,
};

/* The constraints of one field; fields without a rule get the defaults
 * above (schema.c insists that bytes and repeated fields have one). */
typedef struct kvd_proto_rule {
    const ProtobufCMessageDescriptor *message;
    const char *field;
    unsigned flags;
    int64_t min, max;
    uint32_t max_count; /* repeated: most entries per message instance */
} kvd_proto_rule_t;

typedef struct kvd_proto_walk kvd_proto_walk_t;

/* Cross-field rules of one message type; runs after every field of `msg`
 * (and every sub-message) passed its own rules. */
typedef kvd_status_t (*kvd_proto_check_fn)(kvd_proto_walk_t *walk,
                                           const ProtobufCMessage *msg);

typedef struct kvd_proto_schema kvd_proto_schema_t;
struct kvd_proto_schema {
    const ProtobufCMessageDescriptor *desc;
    kvd_proto_check_fn check;
    const kvd_proto_rule_t *rules[KVD_PROTO_MAX_FIELDS];
    const kvd_proto_schema_t *children[KVD_PROTO_MAX_FIELDS];
};

/* One top-level message type (codec.c). */
typedef struct kvd_proto_msg_info {
    const char *name;
    const ProtobufCMessageDescriptor *desc;
} kvd_proto_msg_info_t;

/* NULL for an unknown type. */
const kvd_proto_msg_info_t *kvd_proto_msg_info(kvd_proto_msg_t type);

/* The schema of a top-level type, built on first use (thread-safe).
 * KVD_ERR_INTERNAL if the rule tables do not match the generated code. */
kvd_status_t kvd_proto_schema_get(kvd_proto_msg_t type,
                                  const kvd_proto_schema_t **schema_out);

/* ------------------------------------------------------------------------ */
/* Walk: the current field path, formatted only when something fails.       */
/* ------------------------------------------------------------------------ */

struct kvd_proto_walk {
    const char *root;
    struct {
        const char *name;
        size_t index;
    } frames[KVD_PROTO_MAX_DEPTH * 2];
    unsigned depth;
    char *reason;
    size_t reason_len;
};

void kvd_proto_walk_init(kvd_proto_walk_t *walk, const char *root, char *reason,
                         size_t reason_len);
/* Enters field `name` (element `index`, or KVD_PROTO_NO_INDEX). Callers
 * stay within the schema depth, which schema.c bounds. */
void kvd_proto_walk_push(kvd_proto_walk_t *walk, const char *name,
                         size_t index);
void kvd_proto_walk_pop(kvd_proto_walk_t *walk);
/* Writes "<path>: <message>" as the reason and returns `status`. */
kvd_status_t kvd_proto_walk_fail(kvd_proto_walk_t *walk, kvd_status_t status,
                                 const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* One entry of a uniqueness check: compared on (num, bytes[0..len)). */
typedef struct kvd_proto_item {
    const uint8_t *bytes;
    size_t len;
    uint64_t num;
    size_t index;
} kvd_proto_item_t;

/* Sorts `items` and fails on the first two that compare equal, reporting
 * "<path>.<list>[j].<member>: duplicates <list>[i]" (`member` may be NULL
 * for lists of scalars). */
kvd_status_t kvd_proto_walk_unique(kvd_proto_walk_t *walk,
                                   kvd_proto_item_t *items, size_t num_items,
                                   const char *list, const char *member);

/* Validates a whole message against `schema` (validate.c). */
kvd_status_t kvd_proto_validate_schema(const kvd_proto_schema_t *schema,
                                       const char *root,
                                       const ProtobufCMessage *msg,
                                       char *reason, size_t reason_len);

/* Scans encoded bytes against `schema` without allocating (wire.c). */
kvd_status_t kvd_proto_wire_scan(const kvd_proto_schema_t *schema,
                                 const char *root, const uint8_t *data,
                                 size_t len, char *reason, size_t reason_len);

/* True if `len` bytes at `s` are well-formed UTF-8 (no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
bool kvd_proto_utf8_valid(const char *s, size_t len);

#endif /* KVD_PROTO_CODEC_INT_H */
