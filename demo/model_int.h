/*
 * The demo's model: a small Llama-architecture decoder in plain C (RMSNorm,
 * rotary embeddings, grouped-query attention over a paged fp16 KV cache
 * with a block table, SwiGLU MLP, greedy sampling), byte-level tokens.
 *
 * Weights are fp32, either drawn from a seed (sizes from the config) or
 * read from a llama2.c checkpoint (7 int32 header fields, then the fp32
 * tensors in llama2.c's order; a negative vocab_size means a separate
 * classifier). The KV cache is the engine's: per layer one tensor laid out
 * as vLLM's FlashAttention NHD [2][num_blocks][block_size][kv_heads]
 * [head_dim] in fp16, addressed through the request's block table.
 * Attention reads K and V only from that cache (the connector fills it),
 * never from a copy kept by the model.
 *
 * A forward pass runs layer by layer over all the step's tokens, calling
 * the hooks before and after each layer (where the connector waits for a
 * layer's load and starts its save).
 */
#ifndef KVD_DEMO_MODEL_INT_H
#define KVD_DEMO_MODEL_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"

typedef struct kvd_demo_config {
    uint32_t dim;        /* hidden size */
    uint32_t hidden_dim; /* MLP inner size */
    uint32_t num_layers;
    uint32_t num_heads;
    uint32_t num_kv_heads; /* divides num_heads */
    uint32_t vocab_size;
    uint32_t max_seq;
    float rope_theta;
} kvd_demo_config_t;

typedef struct kvd_demo_layer {
    float *rms_att, *wq, *wk, *wv, *wo; /* W[out][in] */
    float *rms_ffn, *w1, *w2, *w3;
} kvd_demo_layer_t;

typedef struct kvd_demo_model {
    kvd_demo_config_t cfg;
    uint32_t head_dim;
    float *mem; /* every tensor */
    float *embed, *rms_final, *wcls;
    kvd_demo_layer_t *layers;
} kvd_demo_model_t;

/* The engine's paged KV cache: per layer [2][num_blocks][block_size]
 * [kv_heads][head_dim] fp16 (vLLM NHD). */
typedef struct kvd_demo_cache {
    uint32_t num_layers, num_blocks, block_size;
    uint16_t **layer; /* num_layers tensors */
    size_t layer_bytes;
} kvd_demo_cache_t;

/* Called before and after each layer of a forward pass. */
typedef struct kvd_demo_hooks {
    void *ctx;
    void (*before_layer)(void *ctx, uint32_t layer);
    void (*after_layer)(void *ctx, uint32_t layer);
} kvd_demo_hooks_t;

/* Weights drawn from `seed` (uniform, scaled by 1/sqrt(fan_in)). */
kvd_status_t kvd_demo_model_init(const kvd_demo_config_t *cfg, uint64_t seed,
                                 kvd_demo_model_t *m);
/* Weights from a llama2.c checkpoint file; the file's header sets the
 * sizes (rope_theta 10000). */
kvd_status_t kvd_demo_model_load(const char *path, kvd_demo_model_t *m,
                                 char *err, size_t err_len);
/* Writes `m` as a llama2.c checkpoint (with a separate classifier). */
kvd_status_t kvd_demo_model_save(const kvd_demo_model_t *m, const char *path);
void kvd_demo_model_free(kvd_demo_model_t *m);

kvd_status_t kvd_demo_cache_init(const kvd_demo_model_t *m, uint32_t num_blocks,
                                 uint32_t block_size, kvd_demo_cache_t *c);
void kvd_demo_cache_free(kvd_demo_cache_t *c);

/* A digest of the K and V rows of positions [0, num_pos) in every layer,
 * in position order through `block_table`: equal digests mean the same KV
 * bytes, wherever the blocks sit. */
uint64_t kvd_demo_cache_digest(const kvd_demo_cache_t *c,
                               const uint32_t *block_table, uint32_t num_pos,
                               size_t kv_dim);

/*
 * Runs tokens[0..n) at positions pos0.. through the model: writes their K
 * and V into the cache at (block_table[pos / block_size], pos %
 * block_size), attends over positions 0..pos from the cache, and returns
 * the greedy next token after the last one in *next_out. The cache must
 * already hold positions < pos0.
 */
kvd_status_t kvd_demo_forward(const kvd_demo_model_t *m, kvd_demo_cache_t *c,
                              const uint32_t *block_table,
                              const uint32_t *tokens, size_t n, uint32_t pos0,
                              const kvd_demo_hooks_t *hooks,
                              uint32_t *next_out);

/* CacheBlend's selection for kvd_demo_forward_at: layers 0..check_layer
 * compute every token of the step; after check_layer only the tokens not
 * reused and the `budget` reused ones whose fresh K/V deviated most from
 * the cached (loaded) rows in check_layer go on (the others keep their
 * loaded KV in the later layers). */
typedef struct kvd_demo_blend {
    const uint8_t *reused; /* per position: loaded by content */
    uint32_t check_layer;
    uint32_t budget;
} kvd_demo_blend_t;

/*
 * kvd_demo_forward for any set of positions: tokens[t] at pos[t]
 * (increasing, t < n); every position not in the set must already be in
 * the cache (computed before, or loaded). Writes the greedy next token
 * after the last one into *next_out and, when logits_out is not NULL, the
 * vocab_size logits. `blend` may be NULL; the last token must not be a
 * reused one. Errors: KVD_ERR_RANGE (positions, tokens), KVD_ERR_INVALID
 * (blend), KVD_ERR_NOMEM.
 */
kvd_status_t kvd_demo_forward_at(const kvd_demo_model_t *m, kvd_demo_cache_t *c,
                                 const uint32_t *block_table,
                                 const uint32_t *tokens, const uint32_t *pos,
                                 size_t n, const kvd_demo_blend_t *blend,
                                 const kvd_demo_hooks_t *hooks,
                                 uint32_t *next_out, float *logits_out);

#endif /* KVD_DEMO_MODEL_INT_H */
