/*
 * Namespace digest (kvd_namespace_digest): two vectors computed outside C
 * with Debian's python3-cbor2 and hashlib,
 *
 *   hashlib.sha256(cbor2.dumps(["kvdepot-namespace-v2", model_id, dtype,
 *       k_codec, v_codec, num_layers, first_layer, num_kv_heads,
 *       head_start, total_kv_heads, head_dim, block_size, tp_size, tp_rank,
 *       kv_combined, format_version, tq_seed, model_revision, weight_quant,
 *       model_overrides, sliding_window, generation],
 *       canonical=True)).digest()[:16]
 *
 * every field changing the digest (the TurboQuant seed and the generation
 * included: version 1 left both out, so seeds 1 and 2 shared objects), and
 * the descriptors it refuses.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvdepot/common.h"

static kvd_namespace_desc_t llama(void)
{
    kvd_namespace_desc_t d = {
        .model_id = "meta-llama/Llama-3.1-8B@main",
        .dtype = 2,   /* DTYPE_BF16 */
        .k_codec = 1, /* CODEC_RAW */
        .v_codec = 1,
        .num_layers = 32,
        .num_kv_heads = 8,
        .total_kv_heads = 8,
        .head_dim = 128,
        .block_size = 16,
        .tp_size = 1,
    };
    return d;
}

static void hex_of(const kvd_namespace_t *ns, char out[33])
{
    for (int i = 0; i < 16; i++) {
        snprintf(out + 2 * i, 3, "%02x", ns->bytes[i]);
    }
}

static void test_vectors(void **state)
{
    (void)state;
    kvd_namespace_t ns;
    char hex[33];
    kvd_namespace_desc_t d = llama();
    assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_OK);
    hex_of(&ns, hex);
    assert_string_equal(hex, "e8350a277a84762fa9f5e51e80f8f14d");

    kvd_namespace_desc_t mla = {
        .model_id = "deepseek-ai/DeepSeek-V3",
        .dtype = 2,
        .k_codec = 3, /* CODEC_INT8 */
        .v_codec = 0,
        .num_layers = 61,
        .num_kv_heads = 1,
        .total_kv_heads = 1,
        .head_dim = 576,
        .block_size = 64,
        .tp_size = 8,
        .tp_rank = 3,
        .kv_combined = true,
        .tq_seed = 0x6b76646570,
        .model_revision = "a1b2c3",
        .weight_quant = "fp8",
        .model_overrides = "{\"rope_theta\":1000000}",
        .sliding_window = 4096,
        .generation = 7,
    };
    assert_int_equal(kvd_namespace_digest(&mla, &ns), KVD_OK);
    hex_of(&ns, hex);
    assert_string_equal(hex, "f59be775766d2243842385a0cd759e56");
}

static void test_every_field_matters(void **state)
{
    (void)state;
    kvd_namespace_desc_t base = llama();
    base.num_kv_heads = 4;
    base.tp_size = 2;
    kvd_namespace_t ref, ns;
    assert_int_equal(kvd_namespace_digest(&base, &ref), KVD_OK);
    for (int f = 0; f < 20; f++) {
        kvd_namespace_desc_t d = base;
        switch (f) {
        case 0: d.model_id = "meta-llama/Llama-3.1-8B@other"; break;
        case 1: d.dtype = 1; break;
        case 2: d.k_codec = 2; break;
        case 3: d.v_codec = 6; break;
        case 4: d.num_layers = 31; break;
        case 5: d.first_layer = 16; break;
        case 6: d.num_kv_heads = 2; break;
        case 7: d.head_start = 4; break;
        case 8: d.total_kv_heads = 16; break;
        case 9: d.head_dim = 64; break;
        case 10: d.block_size = 32; break;
        case 11: d.tp_size = 4; break;
        case 12: d.tp_rank = 1; break;
        case 13: d.kv_combined = true; break;
        case 14: d.tq_seed = 1; break;
        case 15: d.model_revision = "v2"; break;
        case 16: d.weight_quant = "awq"; break;
        case 17: d.model_overrides = "{}"; break;
        case 18: d.sliding_window = 4096; break;
        default: d.generation = 1; break;
        }
        assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_OK);
        assert_memory_not_equal(ns.bytes, ref.bytes, 16);
    }
}

/* Seeds 1 and 2 name different namespaces; a format_version of 0 is the
 * current one, and NULL strings are "". */
static void test_seed_and_defaults(void **state)
{
    (void)state;
    kvd_namespace_desc_t d = llama();
    kvd_namespace_t a, b;
    d.tq_seed = 1;
    assert_int_equal(kvd_namespace_digest(&d, &a), KVD_OK);
    d.tq_seed = 2;
    assert_int_equal(kvd_namespace_digest(&d, &b), KVD_OK);
    assert_memory_not_equal(a.bytes, b.bytes, 16);

    d = llama();
    assert_int_equal(kvd_namespace_digest(&d, &a), KVD_OK);
    d.format_version = KVD_OBJECT_FORMAT_V;
    d.model_revision = "";
    d.weight_quant = "";
    d.model_overrides = "";
    assert_int_equal(kvd_namespace_digest(&d, &b), KVD_OK);
    assert_memory_equal(a.bytes, b.bytes, 16);
}

static void test_refused(void **state)
{
    (void)state;
    kvd_namespace_t ns;
    kvd_namespace_desc_t d = llama();
    assert_int_equal(kvd_namespace_digest(NULL, &ns), KVD_ERR_INVALID);
    assert_int_equal(kvd_namespace_digest(&d, NULL), KVD_ERR_INVALID);
    d.model_id = "";
    assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_ERR_INVALID);
    d = llama();
    d.head_start = 1; /* 1 + 8 heads > 8 */
    assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_ERR_INVALID);
    d = llama();
    d.tp_rank = 1;
    assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_ERR_INVALID);
    d = llama();
    d.block_size = 0;
    assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_ERR_INVALID);
    char long_id[300];
    memset(long_id, 'a', sizeof long_id - 1);
    long_id[sizeof long_id - 1] = '\0';
    d = llama();
    d.model_id = long_id;
    assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_ERR_INVALID);
    d = llama();
    d.format_version = 1; /* payload-only objects: not readable here */
    assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_ERR_INVALID);
    char *huge = malloc(65538);
    assert_non_null(huge);
    memset(huge, 'o', 65537);
    huge[65537] = '\0';
    d = llama();
    d.model_overrides = huge;
    assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_ERR_INVALID);
    huge[65536] = '\0';
    assert_int_equal(kvd_namespace_digest(&d, &ns), KVD_OK);
    free(huge);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_every_field_matters),
        cmocka_unit_test(test_seed_and_defaults),
        cmocka_unit_test(test_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
