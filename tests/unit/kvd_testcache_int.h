/*
 * Engine KV caches in host memory for the tests: vLLM FlashAttention NHD
 * and HND, FlashInfer [NB,2,BS,H,D], MLA [NB,BS,D], the TensorRT-LLM pool
 * [NB,L,2,H,BS,D] and an HND variant with padding between rows and blocks.
 * Each is described to kvdepot only by base pointers and byte strides
 * (cache_describe); flat_index gives an element's place from the engine's
 * tensor shape alone, so tests can check strides against shapes.
 * Header-only (static inline): each test is one executable built from one
 * source file. Needs cmocka.h (allocation failures fail the test).
 */
#ifndef KVD_TESTS_TESTCACHE_INT_H
#define KVD_TESTS_TESTCACHE_INT_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvdepot/kernels.h"

#define TEST_CACHE_MAX_LAYERS 8

typedef enum engine_layout {
    LAYOUT_VLLM_NHD,
    LAYOUT_VLLM_HND,
    LAYOUT_FLASHINFER,
    LAYOUT_MLA,
    LAYOUT_TRTLLM_POOL,
    LAYOUT_HND_PADDED,
    LAYOUT_COUNT
} engine_layout_t;

static inline const char *layout_name(engine_layout_t kind)
{
    static const char *const names[LAYOUT_COUNT] = {
        "vllm-nhd", "vllm-hnd",    "flashinfer",
        "mla",      "trtllm-pool", "hnd-padded",
    };
    return kind < LAYOUT_COUNT ? names[kind] : "?";
}

/* A cache in host memory: one allocation holding every layer. */
typedef struct test_cache {
    engine_layout_t kind;
    uint32_t layers, planes, blocks, bs, heads, dim;
    size_t elt;
    size_t bytes;
    unsigned char *mem;
    void *bases[TEST_CACHE_MAX_LAYERS];
    kvd_kv_layout_t layout;
} test_cache_t;

/* Padding of the padded variant, in elements. */
#define PAD_ROW 3
#define PAD_BLOCK 5

/* Element index of (layer, plane, block, token, head, channel) in the whole
 * allocation, straight from each engine's tensor shape. */
static inline size_t flat_index(const test_cache_t *c, uint32_t l, uint32_t p,
                                uint32_t b, uint32_t t, uint32_t h, uint32_t ch)
{
    size_t L = c->layers, NB = c->blocks, BS = c->bs, NH = c->heads,
           HS = c->dim;
    switch (c->kind) {
    case LAYOUT_VLLM_NHD: /* per layer [2, NB, BS, NH, HS] */
        return l * 2 * NB * BS * NH * HS + ((p * NB + b) * BS + t) * NH * HS +
               h * HS + ch;
    case LAYOUT_VLLM_HND: /* per layer [2, NB, NH, BS, HS] */
        return l * 2 * NB * NH * BS * HS + ((p * NB + b) * NH + h) * BS * HS +
               t * HS + ch;
    case LAYOUT_FLASHINFER: /* per layer [NB, 2, BS, NH, HS] */
        return l * NB * 2 * BS * NH * HS + ((b * 2 + p) * BS + t) * NH * HS +
               h * HS + ch;
    case LAYOUT_MLA: /* per layer [NB, BS, HS] */
        return l * NB * BS * HS + (b * BS + t) * HS + ch;
    case LAYOUT_TRTLLM_POOL: /* [NB, L, 2, NH, BS, HS] */
        return ((((b * L + l) * 2 + p) * NH + h) * BS + t) * HS + ch;
    case LAYOUT_HND_PADDED: {
        /* [L][2][NB][NH][BS][HS + PAD_ROW] with PAD_BLOCK elements after
         * every block. */
        size_t row = HS + PAD_ROW;
        size_t block = NH * BS * row + PAD_BLOCK;
        return l * 2 * NB * block + (p * NB + b) * block + (h * BS + t) * row +
               ch;
    }
    case LAYOUT_COUNT: break;
    }
    return 0;
}

static inline size_t total_elems(const test_cache_t *c)
{
    size_t L = c->layers, NB = c->blocks, BS = c->bs, NH = c->heads,
           HS = c->dim;
    if (c->kind == LAYOUT_MLA) {
        return L * NB * BS * HS;
    }
    if (c->kind == LAYOUT_HND_PADDED) {
        return L * 2 * NB * (NH * BS * (HS + PAD_ROW) + PAD_BLOCK);
    }
    return L * 2 * NB * BS * NH * HS;
}

/* Strides as an engine integration would derive them from the tensor's
 * shape; the only place the test speaks in strides. */
static inline void cache_describe(test_cache_t *c)
{
    int64_t e = (int64_t)c->elt, NB = c->blocks, BS = c->bs, NH = c->heads,
            HS = c->dim, L = c->layers;
    kvd_kv_layout_t *lo = &c->layout;
    size_t layer_elems = 0;

    memset(lo, 0, sizeof(*lo));
    lo->num_blocks = c->blocks;
    switch (c->kind) {
    case LAYOUT_VLLM_NHD:
        lo->stride_head = HS * e;
        lo->stride_token = NH * HS * e;
        lo->stride_block = BS * NH * HS * e;
        lo->stride_plane = NB * BS * NH * HS * e;
        layer_elems = (size_t)(2 * NB * BS * NH * HS);
        break;
    case LAYOUT_VLLM_HND:
        lo->stride_token = HS * e;
        lo->stride_head = BS * HS * e;
        lo->stride_block = NH * BS * HS * e;
        lo->stride_plane = NB * NH * BS * HS * e;
        layer_elems = (size_t)(2 * NB * BS * NH * HS);
        break;
    case LAYOUT_FLASHINFER:
        lo->stride_head = HS * e;
        lo->stride_token = NH * HS * e;
        lo->stride_plane = BS * NH * HS * e;
        lo->stride_block = 2 * BS * NH * HS * e;
        layer_elems = (size_t)(2 * NB * BS * NH * HS);
        break;
    case LAYOUT_MLA:
        lo->stride_token = HS * e;
        lo->stride_block = BS * HS * e;
        layer_elems = (size_t)(NB * BS * HS);
        break;
    case LAYOUT_TRTLLM_POOL:
        lo->stride_token = HS * e;
        lo->stride_head = BS * HS * e;
        lo->stride_plane = NH * BS * HS * e;
        lo->stride_block = L * 2 * NH * BS * HS * e;
        layer_elems = (size_t)(2 * NH * BS * HS); /* layer offset in pool */
        break;
    case LAYOUT_HND_PADDED:
        lo->stride_token = (HS + PAD_ROW) * e;
        lo->stride_head = BS * (HS + PAD_ROW) * e;
        lo->stride_block = (NH * BS * (HS + PAD_ROW) + PAD_BLOCK) * e;
        lo->stride_plane = NB * lo->stride_block;
        layer_elems = (size_t)(2 * NB * (NH * BS * (HS + PAD_ROW) + PAD_BLOCK));
        break;
    case LAYOUT_COUNT: break;
    }
    for (uint32_t l = 0; l < c->layers; l++) {
        c->bases[l] = c->mem + l * layer_elems * c->elt;
    }
    lo->layer_base = c->bases;
}

static inline void cache_init(test_cache_t *c, engine_layout_t kind, size_t elt,
                              uint32_t layers, uint32_t blocks, uint32_t bs,
                              uint32_t heads, uint32_t dim)
{
    assert_true(layers >= 1 && layers <= TEST_CACHE_MAX_LAYERS);
    memset(c, 0, sizeof(*c));
    c->kind = kind;
    c->elt = elt;
    c->layers = layers;
    c->planes = kind == LAYOUT_MLA ? 1 : 2;
    c->blocks = blocks;
    c->bs = bs;
    c->heads = kind == LAYOUT_MLA ? 1 : heads;
    c->dim = dim;
    c->bytes = total_elems(c) * elt;
    c->mem = malloc(c->bytes);
    assert_non_null(c->mem);
    cache_describe(c);
}

static inline void cache_cleanup(test_cache_t *c)
{
    free(c->mem);
}

static inline kvd_object_format_t
cache_format(const test_cache_t *c, kvd_dtype_t dtype, kvd_codec_t codec)
{
    kvd_object_format_t f = {dtype,  c->layers, c->planes,      c->heads,
                             c->dim, c->bs,     {codec, codec}, 7};
    return f;
}

#endif /* KVD_TESTS_TESTCACHE_INT_H */
