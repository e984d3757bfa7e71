/*
 * Allocation-free scan of encoded messages, run before protobuf-c decodes.
 *
 * protobuf-c counts every repeated field's entries and allocates arrays for
 * them before it looks at a single value, so an input of a few megabytes
 * could ask for a million empty sub-messages. This scan walks the same wire
 * format with the schema in hand and refuses, before any allocation:
 * malformed tags, varints and lengths (with the byte offset); a wire type
 * the field's type cannot have; repeated fields with more entries than the
 * field's rule allows in one message; a singular field or a oneof given
 * twice (proto's merge-on-repeat is not supported: no kvdepot writer emits
 * it, and it would make decoding depend on protobuf-c's merge code); more
 * than KVD_PROTO_MAX_UNKNOWN_FIELDS unknown fields in one message; and NUL
 * bytes inside strings, which protobuf-c would silently truncate at (so
 * "a\0b" would read as the id "a").
 *
 * It accepts a subset of what protobuf-c 1.4 accepts (same tag, varint and
 * length limits), so a message that passes is decoded, barring memory.
 */
#include <string.h>

#include "proto/codec_int.h"

/* protobuf-c reads tags of at most 5 bytes, lengths of at most 5 bytes,
 * varint values of at most 10. */
#define TAG_MAX_BYTES 5
#define LEN_MAX_BYTES 5
#define VARINT_MAX_BYTES 10
#define FIELD_NUMBER_MAX ((UINT32_C(1) << 29) - 1)

/* Reads a varint of at most `max_bytes` bytes at data[*off]; false if it
 * does not end in time or runs past `len`. */
static bool read_varint(const uint8_t *data, size_t len, size_t *off,
                        unsigned max_bytes, uint64_t *value_out)
{
    uint64_t value = 0;
    for (unsigned i = 0; i < max_bytes; i++) {
        if (*off + i >= len) {
            return false;
        }
        uint8_t b = data[*off + i];
        value |= (uint64_t)(b & 0x7f) << (7 * i);
        if ((b & 0x80) == 0) {
            *off += i + 1;
            *value_out = value;
            return true;
        }
    }
    return false;
}

static bool is_packable(ProtobufCType type)
{
    return type != PROTOBUF_C_TYPE_STRING && type != PROTOBUF_C_TYPE_BYTES &&
           type != PROTOBUF_C_TYPE_MESSAGE;
}

/* The one wire type a non-packed value of `type` is encoded with. */
static unsigned wire_type_of(ProtobufCType type)
{
    switch (type) {
    case PROTOBUF_C_TYPE_SFIXED32:
    case PROTOBUF_C_TYPE_FIXED32:
    case PROTOBUF_C_TYPE_FLOAT: return PROTOBUF_C_WIRE_TYPE_32BIT;
    case PROTOBUF_C_TYPE_SFIXED64:
    case PROTOBUF_C_TYPE_FIXED64:
    case PROTOBUF_C_TYPE_DOUBLE: return PROTOBUF_C_WIRE_TYPE_64BIT;
    case PROTOBUF_C_TYPE_STRING:
    case PROTOBUF_C_TYPE_BYTES:
    case PROTOBUF_C_TYPE_MESSAGE: return PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
    default: return PROTOBUF_C_WIRE_TYPE_VARINT;
    }
}

/* Counts the entries of a packed run, checking it splits into whole
 * values exactly as protobuf-c will split it. */
static bool count_packed(ProtobufCType type, const uint8_t *p, size_t len,
                         size_t *count_out)
{
    switch (wire_type_of(type)) {
    case PROTOBUF_C_WIRE_TYPE_32BIT: *count_out = len / 4; return len % 4 == 0;
    case PROTOBUF_C_WIRE_TYPE_64BIT: *count_out = len / 8; return len % 8 == 0;
    default: break;
    }
    if (type == PROTOBUF_C_TYPE_BOOL) {
        /* protobuf-c takes one byte per packed bool. */
        for (size_t i = 0; i < len; i++) {
            if (p[i] & 0x80) {
                return false;
            }
        }
        *count_out = len;
        return true;
    }
    size_t count = 0, run = 0;
    for (size_t i = 0; i < len; i++) {
        if (++run > VARINT_MAX_BYTES) {
            return false;
        }
        if ((p[i] & 0x80) == 0) {
            count++;
            run = 0;
        }
    }
    *count_out = count;
    return run == 0;
}

typedef struct scan {
    kvd_proto_walk_t walk;
    const uint8_t *data; /* whole input, for absolute offsets */
} scan_t;

static kvd_status_t scan_message(scan_t *scan, const kvd_proto_schema_t *schema,
                                 size_t start, size_t end, unsigned depth);

/* Handles one occurrence of a known field whose value spans
 * data[value_start, value_end). `counts` holds per-field occurrences (or
 * entries, for repeated fields) seen so far in this message. */
static kvd_status_t scan_field(scan_t *scan, const kvd_proto_schema_t *schema,
                               unsigned fi, unsigned wire_type,
                               size_t value_start, size_t value_end,
                               size_t tag_offset, uint32_t *counts,
                               unsigned depth)
{
    kvd_proto_walk_t *walk = &scan->walk;
    const ProtobufCMessageDescriptor *desc = schema->desc;
    const ProtobufCFieldDescriptor *field = &desc->fields[fi];
    bool repeated = field->label == PROTOBUF_C_LABEL_REPEATED;
    bool packed = repeated && is_packable(field->type) &&
                  wire_type == PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED;
    size_t index = repeated ? counts[fi] : KVD_PROTO_NO_INDEX;
    kvd_status_t status = KVD_OK;

    kvd_proto_walk_push(walk, field->name, packed ? KVD_PROTO_NO_INDEX : index);
    if (!packed && wire_type != wire_type_of(field->type)) {
        status = kvd_proto_walk_fail(
            walk, KVD_ERR_PROTO, "wire type %u at byte %zu, want %u", wire_type,
            tag_offset, wire_type_of(field->type));
        goto out;
    }
    if (!repeated) {
        if (counts[fi] > 0) {
            status = kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                         "given twice (byte %zu)", tag_offset);
            goto out;
        }
        if (field->flags & PROTOBUF_C_FIELD_FLAG_ONEOF) {
            for (unsigned k = 0; k < desc->n_fields; k++) {
                if (k != fi && counts[k] > 0 &&
                    (desc->fields[k].flags & PROTOBUF_C_FIELD_FLAG_ONEOF) &&
                    desc->fields[k].quantifier_offset ==
                        field->quantifier_offset) {
                    status = kvd_proto_walk_fail(
                        walk, KVD_ERR_PROTO,
                        "second member of a oneof (with %s, byte %zu)",
                        desc->fields[k].name, tag_offset);
                    goto out;
                }
            }
        }
        counts[fi] = 1;
    } else {
        size_t n = 1;
        if (packed && !count_packed(field->type, scan->data + value_start,
                                    value_end - value_start, &n)) {
            status = kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                         "malformed packed run at byte %zu",
                                         value_start);
            goto out;
        }
        uint32_t max = schema->rules[fi]->max_count;
        if (n > max || counts[fi] > max - n) {
            /* The count belongs to the field, not to one entry. */
            kvd_proto_walk_pop(walk);
            kvd_proto_walk_push(walk, field->name, KVD_PROTO_NO_INDEX);
            status = kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                         "more than %u entries", max);
            goto out;
        }
        counts[fi] += (uint32_t)n;
    }
    if (field->type == PROTOBUF_C_TYPE_STRING &&
        memchr(scan->data + value_start, 0, value_end - value_start) != NULL) {
        status = kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                     "NUL byte inside the string (byte %zu)",
                                     value_start);
    } else if (field->type == PROTOBUF_C_TYPE_MESSAGE) {
        status = scan_message(scan, schema->children[fi], value_start,
                              value_end, depth + 1);
    }
out:
    kvd_proto_walk_pop(walk);
    return status;
}

static kvd_status_t scan_message(scan_t *scan, const kvd_proto_schema_t *schema,
                                 size_t start, size_t end, unsigned depth)
{
    kvd_proto_walk_t *walk = &scan->walk;
    const uint8_t *data = scan->data;
    uint32_t counts[KVD_PROTO_MAX_FIELDS] = {0};
    size_t unknown = 0;
    size_t off = start;

    if (depth > KVD_PROTO_MAX_DEPTH) {
        return kvd_proto_walk_fail(walk, KVD_ERR_PROTO, "nested too deep");
    }
    while (off < end) {
        size_t tag_offset = off;
        uint64_t tag;
        if (!read_varint(data, end, &off, TAG_MAX_BYTES, &tag)) {
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                       "malformed tag at byte %zu", tag_offset);
        }
        uint64_t number = tag >> 3;
        unsigned wire_type = (unsigned)(tag & 7);
        if (number == 0 || number > FIELD_NUMBER_MAX) {
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                       "field number %llu at byte %zu",
                                       (unsigned long long)number, tag_offset);
        }
        size_t value_start = off, value_end;
        uint64_t value;
        switch (wire_type) {
        case PROTOBUF_C_WIRE_TYPE_VARINT:
            if (!read_varint(data, end, &off, VARINT_MAX_BYTES, &value)) {
                return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                           "malformed varint at byte %zu",
                                           value_start);
            }
            value_end = off;
            break;
        case PROTOBUF_C_WIRE_TYPE_64BIT:
        case PROTOBUF_C_WIRE_TYPE_32BIT: {
            size_t width = wire_type == PROTOBUF_C_WIRE_TYPE_64BIT ? 8 : 4;
            if (end - off < width) {
                return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                           "truncated at byte %zu", off);
            }
            off += width;
            value_end = off;
            break;
        }
        case PROTOBUF_C_WIRE_TYPE_LENGTH_PREFIXED:
            if (!read_varint(data, end, &off, LEN_MAX_BYTES, &value)) {
                return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                           "malformed length at byte %zu",
                                           value_start);
            }
            if (value > end - off) {
                return kvd_proto_walk_fail(
                    walk, KVD_ERR_PROTO,
                    "length %llu at byte %zu runs past the end",
                    (unsigned long long)value, value_start);
            }
            value_start = off;
            off += (size_t)value;
            value_end = off;
            break;
        default:
            return kvd_proto_walk_fail(walk, KVD_ERR_PROTO,
                                       "unsupported wire type %u at byte %zu",
                                       wire_type, tag_offset);
        }

        const ProtobufCFieldDescriptor *field =
            protobuf_c_message_descriptor_get_field(schema->desc,
                                                    (unsigned)number);
        if (field == NULL) {
            if (++unknown > KVD_PROTO_MAX_UNKNOWN_FIELDS) {
                return kvd_proto_walk_fail(
                    walk, KVD_ERR_PROTO, "more than %u unknown fields",
                    (unsigned)KVD_PROTO_MAX_UNKNOWN_FIELDS);
            }
            continue;
        }
        kvd_status_t status = scan_field(
            scan, schema, (unsigned)(field - schema->desc->fields), wire_type,
            value_start, value_end, tag_offset, counts, depth);
        if (status != KVD_OK) {
            return status;
        }
    }
    return KVD_OK;
}

kvd_status_t kvd_proto_wire_scan(const kvd_proto_schema_t *schema,
                                 const char *root, const uint8_t *data,
                                 size_t len, char *reason, size_t reason_len)
{
    scan_t scan = {.data = data};
    kvd_proto_walk_init(&scan.walk, root, reason, reason_len);
    return scan_message(&scan, schema, 0, len, 0);
}
