/*
 * The object header (kernels.h, kernels/ref/header.c): packed and parsed
 * back unchanged; kvd_object_header_check accepts the object it was
 * written for and refuses, with a reason, any object whose size, format
 * version, codec, TurboQuant seed, geometry, namespace or block hash is
 * not the reader's, or whose header bytes were changed; parameters a
 * format does not use (the seed without TurboQuant, the second codec of a
 * single plane) do not make two equal formats differ.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvdepot/kernels.h"

static kvd_object_format_t fmt_tq(void)
{
    kvd_object_format_t f = {
        KVD_DTYPE_BF16, 4, 2, 2, 128, 16, {KVD_CODEC_TQ4, KVD_CODEC_RAW}, 1};
    return f;
}

typedef struct obj {
    uint8_t *bytes;
    size_t size;
    kvd_namespace_t ns;
    kvd_block_hash_t hash;
} obj_t;

static obj_t obj_make(const kvd_object_format_t *f)
{
    obj_t o;
    memset(&o, 0, sizeof o);
    memset(o.ns.bytes, 0x42, sizeof o.ns.bytes);
    memset(o.hash.bytes, 0x17, sizeof o.hash.bytes);
    o.size = kvd_object_stored_bytes(f);
    assert_int_equal(o.size, kvd_object_bytes(f) + KVD_OBJECT_HEADER_BYTES);
    o.bytes = calloc(1, o.size);
    assert_non_null(o.bytes);
    assert_int_equal(kvd_object_header_pack(f, &o.ns, &o.hash,
                                            o.bytes + kvd_object_bytes(f)),
                     KVD_OK);
    return o;
}

static kvd_status_t check(const kvd_object_format_t *f, const obj_t *o,
                          char *why)
{
    why[0] = '\0';
    return kvd_object_header_check(f, &o->ns, &o->hash, o->bytes, o->size, why,
                                   160);
}

static void test_round_trip(void **state)
{
    (void)state;
    kvd_object_format_t f = fmt_tq();
    obj_t o = obj_make(&f);
    kvd_object_header_t h;
    char why[160];
    assert_int_equal(kvd_object_header_unpack(o.bytes + kvd_object_bytes(&f),
                                              KVD_OBJECT_HEADER_BYTES, &h, why,
                                              sizeof why),
                     KVD_OK);
    assert_int_equal(h.version, KVD_OBJECT_FORMAT_V);
    assert_memory_equal(&h.format, &f, sizeof f);
    assert_int_equal(h.payload_bytes, kvd_object_bytes(&f));
    assert_memory_equal(h.ns.bytes, o.ns.bytes, KVD_NAMESPACE_BYTES);
    assert_memory_equal(h.hash.bytes, o.hash.bytes, KVD_SHA256_BYTES);
    assert_int_equal(check(&f, &o, why), KVD_OK);
    free(o.bytes);
}

static void test_position_round_trip(void **state)
{
    (void)state;
    kvd_object_format_t f = fmt_tq();
    obj_t o = obj_make(&f);
    uint8_t *hdr = o.bytes + kvd_object_bytes(&f);
    kvd_object_header_t h;
    char why[160];
    /* The position a content load rotates from: recorded, checksummed,
     * not part of what the reader compares. */
    assert_int_equal(kvd_object_header_pack_at(&f, &o.ns, &o.hash,
                                               KVD_OBJECT_MAX_POSITION, hdr),
                     KVD_OK);
    assert_int_equal(kvd_object_header_unpack(hdr, KVD_OBJECT_HEADER_BYTES, &h,
                                              why, sizeof why),
                     KVD_OK);
    assert_int_equal(h.position, KVD_OBJECT_MAX_POSITION);
    assert_int_equal(check(&f, &o, why), KVD_OK);
    assert_int_equal(kvd_object_header_pack_at(
                         &f, &o.ns, &o.hash, KVD_OBJECT_MAX_POSITION + 1, hdr),
                     KVD_ERR_INVALID);
    /* A flipped position bit is caught by the header's checksum. */
    hdr[96] ^= 1;
    assert_int_equal(kvd_object_header_unpack(hdr, KVD_OBJECT_HEADER_BYTES, &h,
                                              why, sizeof why),
                     KVD_ERR_CORRUPT);
    free(o.bytes);
}

static void test_every_difference_refused(void **state)
{
    (void)state;
    kvd_object_format_t f = fmt_tq();
    obj_t o = obj_make(&f);
    char why[160];
    for (int k = 0; k < 9; k++) {
        kvd_object_format_t g = f;
        obj_t q = o;
        switch (k) {
        case 0: g.tq_seed = 2; break;
        case 1: g.codec[0] = KVD_CODEC_TQ3; break;
        case 2: g.codec[1] = KVD_CODEC_FP8_E4M3; break;
        case 3: g.dtype = KVD_DTYPE_FP16; break;
        case 4: g.num_heads = 1; break;
        case 5: g.block_size = 32; break;
        case 6: q.ns.bytes[3] ^= 1; break;
        case 7: q.hash.bytes[31] ^= 1; break;
        default: q.size--; break;
        }
        assert_int_equal(check(&g, &q, why), KVD_ERR_CORRUPT);
        assert_true(why[0] != '\0');
    }
    assert_int_equal(check(&f, &o, why), KVD_OK);
    /* Any header byte changed: refused (the header's own checksum, or the
     * field it changed). */
    size_t at = kvd_object_bytes(&f);
    for (size_t i = 0; i < KVD_OBJECT_HEADER_BYTES; i++) {
        o.bytes[at + i] ^= 0x80;
        assert_int_equal(check(&f, &o, why), KVD_ERR_CORRUPT);
        o.bytes[at + i] ^= 0x80;
    }
    assert_int_equal(check(&f, &o, why), KVD_OK);
    free(o.bytes);
}

static void test_unused_parameters(void **state)
{
    (void)state;
    char why[160];
    kvd_object_format_t raw = {
        KVD_DTYPE_FP16, 2, 2, 2, 64, 16, {KVD_CODEC_RAW, KVD_CODEC_RAW}, 7};
    obj_t o = obj_make(&raw);
    raw.tq_seed = 8; /* no TurboQuant plane: the seed is not a parameter */
    assert_int_equal(check(&raw, &o, why), KVD_OK);
    free(o.bytes);
    kvd_object_format_t mla = {
        KVD_DTYPE_BF16, 2, 1, 1, 576, 64, {KVD_CODEC_INT8, KVD_CODEC_RAW}, 0};
    o = obj_make(&mla);
    mla.codec[1] = KVD_CODEC_INT8; /* one plane: codec[1] unused */
    assert_int_equal(check(&mla, &o, why), KVD_OK);
    free(o.bytes);
}

static void test_refused_arguments(void **state)
{
    (void)state;
    kvd_object_format_t f = fmt_tq();
    obj_t o = obj_make(&f);
    uint8_t hdr[KVD_OBJECT_HEADER_BYTES];
    kvd_object_header_t h;
    assert_int_equal(kvd_object_header_pack(NULL, &o.ns, &o.hash, hdr),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_object_header_pack(&f, &o.ns, &o.hash, NULL),
                     KVD_ERR_INVALID);
    kvd_object_format_t bad = f;
    bad.head_dim = 100; /* TurboQuant needs 64, 128 or 256 */
    assert_int_equal(kvd_object_header_pack(&bad, &o.ns, &o.hash, hdr),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_object_header_unpack(NULL, 128, &h, NULL, 0),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_object_header_unpack(o.bytes + kvd_object_bytes(&f),
                                              KVD_OBJECT_HEADER_BYTES - 1, &h,
                                              NULL, 0),
                     KVD_ERR_CORRUPT);
    assert_int_equal(
        kvd_object_header_check(&f, &o.ns, &o.hash, NULL, o.size, NULL, 0),
        KVD_ERR_INVALID);
    assert_int_equal(kvd_object_stored_bytes(&bad), 0);
    assert_int_equal(kvd_object_stored_bytes(NULL), 0);
    free(o.bytes);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_position_round_trip),
        cmocka_unit_test(test_every_difference_refused),
        cmocka_unit_test(test_unused_parameters),
        cmocka_unit_test(test_refused_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
