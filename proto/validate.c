/*
 * Semantic validation of decoded (or caller-built) messages.
 *
 * One generic walk over the protobuf-c descriptors applies each field's
 * rule from schema.c (lengths, ranges, required, counts, known enum values,
 * UTF-8, uniqueness), recurses into sub-messages, then runs the message's
 * cross-field check. Driving it from descriptors means a field added to the
 * .proto is validated (at least for enum values, string sanity and
 * pointers) without new code here.
 *
 * The walk keeps the field path as a stack of (name, index) frames and
 * formats it only on failure, so a valid plan costs no string work. Caller-
 * built messages can hold what the decoder never produces (NULL arrays,
 * NULL entries, sub-messages of the wrong type, bools other than 0/1);
 * those are rejected here too, because protobuf-c's packer would crash on
 * some of them or emit bytes a reader decodes differently.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/codec_int.h"

/* ------------------------------------------------------------------------ */
/* Walk                                                                     */
/* ------------------------------------------------------------------------ */

void kvd_proto_walk_init(kvd_proto_walk_t *walk, const char *root, char *reason,
                         size_t reason_len)
{
    walk->root = root;
    walk->depth = 0;
    walk->reason = reason;
    walk->reason_len = reason_len;
}

void kvd_proto_walk_push(kvd_proto_walk_t *walk, const char *name, size_t index)
{
    /* schema.c bounds the nesting; past the array the path just stops
     * growing rather than overrunning it. */
    if (walk->depth < sizeof(walk->frames) / sizeof(walk->frames[0])) {
        walk->frames[walk->depth].name = name;
        walk->frames[walk->depth].index = index;
    }
    walk->depth++;
}

void kvd_proto_walk_pop(kvd_proto_walk_t *walk)
{
    walk->depth--;
}

kvd_status_t kvd_proto_walk_fail(kvd_proto_walk_t *walk, kvd_status_t status,
                                 const char *fmt, ...)
{
    if (walk->reason == NULL || walk->reason_len == 0) {
        return status;
    }
    char *out = walk->reason;
    size_t room = walk->reason_len;
    /* snprintf returns the untruncated length; clamp so `out` never moves
     * past the terminating NUL. */
#define KVD_APPEND_(...)                                                       \
    do {                                                                       \
        int n_ = snprintf(out, room, __VA_ARGS__);                             \
        size_t used_ = n_ < 0 ? 0 : (size_t)n_;                                \
        if (used_ >= room) {                                                   \
            used_ = room - 1;                                                  \
        }                                                                      \
        out += used_;                                                          \
        room -= used_;                                                         \
    } while (0)
    KVD_APPEND_("%s", walk->root);
    unsigned depth = walk->depth;
    if (depth > sizeof(walk->frames) / sizeof(walk->frames[0])) {
        depth = sizeof(walk->frames) / sizeof(walk->frames[0]);
    }
    for (unsigned i = 0; i < depth; i++) {
        KVD_APPEND_(".%s", walk->frames[i].name);
        if (walk->frames[i].index != KVD_PROTO_NO_INDEX) {
            KVD_APPEND_("[%zu]", walk->frames[i].index);
        }
    }
    KVD_APPEND_(": ");
#undef KVD_APPEND_
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(out, room, fmt, ap);
    va_end(ap);
    return status;
}

static int item_cmp(const void *a, const void *b)
{
    const kvd_proto_item_t *x = a, *y = b;
    if (x->num != y->num) {
        return x->num < y->num ? -1 : 1;
    }
    if (x->len != y->len) {
        return x->len < y->len ? -1 : 1;
    }
    int c = x->len > 0 ? memcmp(x->bytes, y->bytes, x->len) : 0;
    if (c != 0) {
        return c;
    }
    /* Equal keys sort by position, so the report names the later one as
     * the duplicate of the earlier one. */
    return x->index < y->index ? -1 : x->index > y->index;
}

kvd_status_t kvd_proto_walk_unique(kvd_proto_walk_t *walk,
                                   kvd_proto_item_t *items, size_t num_items,
                                   const char *list, const char *member)
{
    if (num_items < 2) {
        return KVD_OK;
    }
    qsort(items, num_items, sizeof(*items), item_cmp);
    for (size_t i = 1; i < num_items; i++) {
        const kvd_proto_item_t *a = &items[i - 1], *b = &items[i];
        if (a->num != b->num || a->len != b->len ||
            (a->len > 0 && memcmp(a->bytes, b->bytes, a->len) != 0)) {
            continue;
        }
        kvd_proto_walk_push(walk, list, b->index);
        if (member != NULL) {
            kvd_proto_walk_push(walk, member, KVD_PROTO_NO_INDEX);
        }
        kvd_status_t status = kvd_proto_walk_fail(
            walk, KVD_ERR_PROTO, "duplicates %s[%zu]", list, a->index);
        if (member != NULL) {
            kvd_proto_walk_pop(walk);
        }
        kvd_proto_walk_pop(walk);
        return status;
    }
    return KVD_OK;
}

/* ------------------------------------------------------------------------ */
/* UTF-8                                                                    */
/* ------------------------------------------------------------------------ */

bool kvd_proto_utf8_valid(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        unsigned c = p[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t need;
        unsigned lo = 0x80, hi = 0xbf; /* range of the second byte */
        if (c >= 0xc2 && c <= 0xdf) {
            need = 1;
        } else if (c >= 0xe0 && c <= 0xef) {
            need = 2;
            if (c == 0xe0) {
                lo = 0xa0; /* overlong */
            } else if (c == 0xed) {
                hi = 0x9f; /* UTF-16 surrogates */
            }
        } else if (c >= 0xf0 && c <= 0xf4) {
            need = 3;
            if (c == 0xf0) {
                lo = 0x90; /* overlong */
            } else if (c == 0xf4) {
                hi = 0x8f; /* above U+10FFFF */
            }
        } else {
            return false;
        }
        if (len - i <= need) {
            return false;
        }
        if (p[i + 1] < lo || p[i + 1] > hi) {
            return false;
        }
        for (size_t k = 2; k <= need; k++) {
            if ((p[i + k] & 0xc0) != 0x80) {
                return false;
            }
        }
        i += need + 1;
    }
    return true;
}

/* ------------------------------------------------------------------------ */
/* Field rules                                                              */
/* ------------------------------------------------------------------------ */

static kvd_status_t walk_message(kvd_proto_walk_t *walk,
                                 const kvd_proto_schema_t *schema,
                                 const ProtobufCMessage *msg);

static kvd_status_t range_fail(kvd_proto_walk_t *walk,
                               const kvd_proto_rule_t *rule, const char *value)
{
    if (rule->max == KVD_PROTO_NO_MAX) {
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "%s, want >= %lld",
                                   value, (long long)rule->min);
    }
    return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "%s, want %lld..%lld",
                               value, (long long)rule->min,
                               (long long)rule->max);
}

static kvd_status_t check_signed(kvd_proto_walk_t *walk,
                                 const kvd_proto_rule_t *rule, bool repeated,
                                 int64_t v)
{
    if (rule == NULL) {
        return KVD_OK;
    }
    if (!repeated && (rule->flags & KVD_PROTO_RULE_REQUIRED) && v == 0) {
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "unset, required");
    }
    if ((rule->flags & KVD_PROTO_RULE_RANGE) &&
        (v < rule->min || v > rule->max)) {
        char text[32];
        snprintf(text, sizeof(text), "%lld", (long long)v);
        return range_fail(walk, rule, text);
    }
    return KVD_OK;
}

static kvd_status_t check_unsigned(kvd_proto_walk_t *walk,
                                   const kvd_proto_rule_t *rule, bool repeated,
                                   uint64_t v)
{
    if (rule == NULL) {
        return KVD_OK;
    }
    if (!repeated && (rule->flags & KVD_PROTO_RULE_REQUIRED) && v == 0) {
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "unset, required");
    }
    /* Rules on unsigned fields have min >= 0 (schema.c checks). */
    if ((rule->flags & KVD_PROTO_RULE_RANGE) &&
        (v < (uint64_t)rule->min ||
         (rule->max != KVD_PROTO_NO_MAX && v > (uint64_t)rule->max))) {
        char text[32];
        snprintf(text, sizeof(text), "%llu", (unsigned long long)v);
        return range_fail(walk, rule, text);
    }
    return KVD_OK;
}

static kvd_status_t check_enum(kvd_proto_walk_t *walk,
                               const ProtobufCFieldDescriptor *field,
                               const kvd_proto_rule_t *rule, bool repeated,
                               int32_t v)
{
    const ProtobufCEnumDescriptor *ed = field->descriptor;
    if (protobuf_c_enum_descriptor_get_value(ed, v) == NULL) {
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "%d is not a %s value",
                                   (int)v, ed->name);
    }
    if (!repeated && rule != NULL && (rule->flags & KVD_PROTO_RULE_REQUIRED) &&
        v == 0) {
        return kvd_proto_walk_fail(
            walk, KVD_ERR_PROTO, "unset (%s), required",
            protobuf_c_enum_descriptor_get_value(ed, 0)->name);
    }
    return KVD_OK;
}

/* Strings: a repeated entry must be non-empty; a singular one may be empty
 * (unset) unless required. Length is checked before anything scans it. */
static kvd_status_t check_string(kvd_proto_walk_t *walk,
                                 const kvd_proto_rule_t *rule, bool repeated,
                                 const char *s)
{
    if (s == NULL) {
        if (repeated) {
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "NULL entry");
        }
        s = "";
    }
    size_t max = KVD_PROTO_MAX_ID_BYTES, min = 0;
    if (rule != NULL && (rule->flags & KVD_PROTO_RULE_RANGE)) {
        min = (size_t)rule->min;
        max = (size_t)rule->max;
    }
    size_t len = strnlen(s, max + 1);
    if (len == 0) {
        if (repeated) {
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "empty string");
        }
        if (rule != NULL && (rule->flags & KVD_PROTO_RULE_REQUIRED)) {
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "empty, required");
        }
        return KVD_OK;
    }
    if (len > max) {
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "longer than %zu bytes",
                                   max);
    }
    if (len < min) {
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                   "%zu bytes, want at least %zu", len, min);
    }
    if (!kvd_proto_utf8_valid(s, len)) {
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "not valid UTF-8");
    }
    return KVD_OK;
}

static kvd_status_t check_bytes(kvd_proto_walk_t *walk,
                                const kvd_proto_rule_t *rule, bool repeated,
                                const ProtobufCBinaryData *b)
{
    if (b->len > 0 && b->data == NULL) {
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "%zu bytes at NULL",
                                   b->len);
    }
    if (!repeated && b->len == 0) {
        if (rule->flags & KVD_PROTO_RULE_REQUIRED) {
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "empty, required");
        }
        return KVD_OK;
    }
    if (b->len < (uint64_t)rule->min || b->len > (uint64_t)rule->max) {
        if (rule->min == rule->max) {
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                       "%zu bytes, want %lld", b->len,
                                       (long long)rule->min);
        }
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                   "%zu bytes, want %lld..%lld", b->len,
                                   (long long)rule->min, (long long)rule->max);
    }
    return KVD_OK;
}

static kvd_status_t check_submessage(kvd_proto_walk_t *walk,
                                     const ProtobufCFieldDescriptor *field,
                                     const kvd_proto_rule_t *rule,
                                     const kvd_proto_schema_t *child,
                                     bool repeated, const ProtobufCMessage *m)
{
    if (m == NULL) {
        if (repeated) {
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "NULL entry");
        }
        if (rule != NULL && (rule->flags & KVD_PROTO_RULE_REQUIRED)) {
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                       "missing, required");
        }
        return KVD_OK;
    }
    if (m->descriptor != field->descriptor) {
        return kvd_proto_walk_fail(
            walk, KVD_ERR_PROTO, "is a %s, want %s",
            m->descriptor != NULL ? m->descriptor->name : "(no descriptor)",
            ((const ProtobufCMessageDescriptor *)field->descriptor)->name);
    }
    return walk_message(walk, child, m);
}

/* Checks one value (a singular field or one repeated entry) at `p`. */
static kvd_status_t check_value(kvd_proto_walk_t *walk,
                                const kvd_proto_schema_t *schema, unsigned fi,
                                bool repeated, const void *p)
{
    const ProtobufCFieldDescriptor *field = &schema->desc->fields[fi];
    const kvd_proto_rule_t *rule = schema->rules[fi];
    switch (field->type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
        return check_signed(walk, rule, repeated, *(const int32_t *)p);
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
        return check_signed(walk, rule, repeated, *(const int64_t *)p);
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
        return check_unsigned(walk, rule, repeated, *(const uint32_t *)p);
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
        return check_unsigned(walk, rule, repeated, *(const uint64_t *)p);
    case PROTOBUF_C_TYPE_BOOL: {
        protobuf_c_boolean v = *(const protobuf_c_boolean *)p;
        if (v != 0 && v != 1) {
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                       "bool holds %d, want 0 or 1", (int)v);
        }
        return KVD_OK;
    }
    case PROTOBUF_C_TYPE_ENUM:
        return check_enum(walk, field, rule, repeated, *(const int32_t *)p);
    case PROTOBUF_C_TYPE_STRING:
        return check_string(walk, rule, repeated, *(char *const *)p);
    case PROTOBUF_C_TYPE_BYTES:
        return check_bytes(walk, rule, repeated,
                           (const ProtobufCBinaryData *)p);
    case PROTOBUF_C_TYPE_MESSAGE:
        return check_submessage(walk, field, rule, schema->children[fi],
                                repeated, *(ProtobufCMessage *const *)p);
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_DOUBLE: return KVD_OK;
    }
    return kvd_proto_walk_fail(walk, KVD_ERR_INTERNAL, "field type %d",
                               (int)field->type);
}

/* Bytes per element of a repeated field's array (protobuf-c's layout). */
static size_t element_size(ProtobufCType type)
{
    switch (type) {
    case PROTOBUF_C_TYPE_INT32:
    case PROTOBUF_C_TYPE_SINT32:
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_UINT32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT:
    case PROTOBUF_C_TYPE_ENUM: return 4;
    case PROTOBUF_C_TYPE_INT64:
    case PROTOBUF_C_TYPE_SINT64:
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_UINT64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: return 8;
    case PROTOBUF_C_TYPE_BOOL: return sizeof(protobuf_c_boolean);
    case PROTOBUF_C_TYPE_STRING: return sizeof(char *);
    case PROTOBUF_C_TYPE_BYTES: return sizeof(ProtobufCBinaryData);
    case PROTOBUF_C_TYPE_MESSAGE: return sizeof(ProtobufCMessage *);
    }
    return 0;
}

/* Fills `item` with the identity of entry `p` for a uniqueness check. */
static void item_of(ProtobufCType type, const void *p, size_t index,
                    kvd_proto_item_t *item)
{
    memset(item, 0, sizeof(*item));
    item->index = index;
    switch (type) {
    case PROTOBUF_C_TYPE_STRING:
        item->bytes = *(const uint8_t *const *)p;
        item->len = strlen(*(char *const *)p);
        break;
    case PROTOBUF_C_TYPE_BYTES:
        item->bytes = ((const ProtobufCBinaryData *)p)->data;
        item->len = ((const ProtobufCBinaryData *)p)->len;
        break;
    default:
        item->num = element_size(type) == 8 ? *(const uint64_t *)p
                                            : *(const uint32_t *)p;
        break;
    }
}

static kvd_status_t check_repeated(kvd_proto_walk_t *walk,
                                   const kvd_proto_schema_t *schema,
                                   unsigned fi, const ProtobufCMessage *msg)
{
    const ProtobufCFieldDescriptor *field = &schema->desc->fields[fi];
    const kvd_proto_rule_t *rule = schema->rules[fi];
    const char *base = (const char *)msg;
    size_t n = *(const size_t *)(base + field->quantifier_offset);
    const char *array = *(char *const *)(base + field->offset);
    size_t esize = element_size(field->type);

    kvd_proto_walk_push(walk, field->name, KVD_PROTO_NO_INDEX);
    kvd_status_t status = KVD_OK;
    if (n > rule->max_count) {
        status = kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "%zu entries, max %u",
                                     n, (unsigned)rule->max_count);
    } else if (n == 0 && (rule->flags & KVD_PROTO_RULE_REQUIRED)) {
        status = kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                     "empty, at least one entry required");
    } else if (n > 0 && array == NULL) {
        status =
            kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "%zu entries at NULL", n);
    }
    kvd_proto_walk_pop(walk);
    for (size_t i = 0; status == KVD_OK && i < n; i++) {
        kvd_proto_walk_push(walk, field->name, i);
        status = check_value(walk, schema, fi, true, array + i * esize);
        kvd_proto_walk_pop(walk);
    }
    if (status != KVD_OK || !(rule->flags & KVD_PROTO_RULE_UNIQUE) || n < 2) {
        return status;
    }
    kvd_proto_item_t *items = malloc(n * sizeof(*items));
    if (items == NULL) {
        return kvd_proto_walk_fail(walk, KVD_ERR_NOMEM,
                                   "out of memory checking %s", field->name);
    }
    for (size_t i = 0; i < n; i++) {
        item_of(field->type, array + i * esize, i, &items[i]);
    }
    status = kvd_proto_walk_unique(walk, items, n, field->name, NULL);
    free(items);
    return status;
}

static kvd_status_t walk_message(kvd_proto_walk_t *walk,
                                 const kvd_proto_schema_t *schema,
                                 const ProtobufCMessage *msg)
{
    const ProtobufCMessageDescriptor *desc = schema->desc;
    const char *base = (const char *)msg;
    if (msg->n_unknown_fields > 0 && msg->unknown_fields == NULL) {
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                   "%u unknown fields at NULL",
                                   msg->n_unknown_fields);
    }
    for (unsigned fi = 0; fi < desc->n_fields; fi++) {
        const ProtobufCFieldDescriptor *field = &desc->fields[fi];
        kvd_status_t status;
        if (field->label == PROTOBUF_C_LABEL_REPEATED) {
            status = check_repeated(walk, schema, fi, msg);
        } else {
            /* Only the active member of a oneof holds a value; the others
             * alias the same union storage. */
            if ((field->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                *(const uint32_t *)(base + field->quantifier_offset) !=
                    field->id) {
                continue;
            }
            kvd_proto_walk_push(walk, field->name, KVD_PROTO_NO_INDEX);
            status = check_value(walk, schema, fi, false, base + field->offset);
            kvd_proto_walk_pop(walk);
        }
        if (status != KVD_OK) {
            return status;
        }
    }
    return schema->check != NULL ? schema->check(walk, msg) : KVD_OK;
}

kvd_status_t kvd_proto_validate_schema(const kvd_proto_schema_t *schema,
                                       const char *root,
                                       const ProtobufCMessage *msg,
                                       char *reason, size_t reason_len)
{
    kvd_proto_walk_t walk;
    kvd_proto_walk_init(&walk, root, reason, reason_len);
    return walk_message(&walk, schema, msg);
}
