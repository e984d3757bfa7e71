/*
 * The demo's engine: one request served by the model with kvdepot as its
 * KV connector, in one process, on the embedded store (host arena + NVMe
 * tier in a directory). It drives the leader and the worker in vLLM's call
 * order: match, allocate, wait for an asynchronous load if there is one,
 * prefill what was not loaded (layer by layer, with the worker's per-layer
 * load waits and saves around each layer), then decode, saving each block
 * as it fills. Blocks whose load failed are computed again.
 */
#ifndef KVD_DEMO_ENGINE_INT_H
#define KVD_DEMO_ENGINE_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "demo/model_int.h"
#include "kvdepot/kernels.h"
#include "kvdepot/leader.h"

#define KVD_DEMO_MAX_GEN 256u
#define KVD_DEMO_BLOCK_SIZE 16u

/* Where the engine's paged KV cache lives, hence the worker's backend. */
typedef enum kvd_demo_device {
    KVD_DEMO_DEVICE_AUTO = 0, /* the GPU when there is one, else host */
    KVD_DEMO_DEVICE_HOST = 1, /* host memory, the worker's host backend */
    KVD_DEMO_DEVICE_CUDA = 2  /* GPU memory, the worker's CUDA backend */
} kvd_demo_device_t;

/* How a request reuses stored KV (docs/chunk-reuse.md). */
typedef enum kvd_demo_reuse {
    KVD_DEMO_REUSE_PREFIX = 0,    /* prefix matches only */
    KVD_DEMO_REUSE_CHUNKS = 1,    /* and content matches, no seam repair */
    KVD_DEMO_REUSE_SELECTIVE = 2, /* and recompute each run's first tokens */
    KVD_DEMO_REUSE_CACHEBLEND = 3 /* and recompute the most deviated 15 % */
} kvd_demo_reuse_t;

/* Teacher-forced steps whose log-probabilities a result keeps (KL). */
#define KVD_DEMO_LOGP_STEPS 64u
#define KVD_DEMO_LOGP_VOCAB 256u

typedef struct kvd_demo_opts {
    const char *store_dir;     /* NVMe tier and index live here */
    const char *store_address; /* kvdepotd's "unix:PATH", or NULL: the
                                  embedded store in store_dir */
    kvd_codec_t codec;         /* for K and V */
    uint32_t prompt_tokens;    /* prompt length, question included */
    const char *question;      /* the prompt's last words */
    uint32_t gen_tokens;       /* 1..KVD_DEMO_MAX_GEN */
    kvd_demo_config_t model;
    uint64_t seed;
    const char *checkpoint; /* llama2.c file, or NULL: seeded weights */
    /* With a GPU cache the model still computes on the CPU: each layer's
     * cache is copied from the GPU before the layer and back after it, so
     * attention reads exactly what the connector loaded into GPU memory.
     * Decided inside kvd_demo_run (a process that forks must not touch
     * CUDA before it forks). */
    kvd_demo_device_t device;
    /* Chunk reuse: content keys on every save (the leader's chunk reuse),
     * the worker rotating reused keys, and `reuse` deciding what the
     * request matches. Off: the persistence demo's prefix path. */
    bool chunks;
    kvd_demo_reuse_t reuse;
    /* The prompt's tokens (prompt_tokens of them), or NULL: kvd_demo_prompt
     * with `question`. */
    const uint32_t *prompt;
    /* Teacher forcing: decode step i feeds force[i - 1] instead of the
     * model's own token (the result's tokens are still its own argmax), so
     * that log-probabilities compare step by step with a reference's. */
    const uint32_t *force;
    /* The reference's log-probabilities (KVD_DEMO_LOGP_STEPS rows of
     * KVD_DEMO_LOGP_VOCAB): with them the result gets the mean KL
     * divergence KL(reference || this run) over the generated steps. */
    const float *ref_logp;
    /* The leader's recompute-vs-fetch gate (kvd_leader_set_gate), or NULL:
     * off. The result reports its estimates after the request. */
    const kvd_leader_gate_t *gate;
} kvd_demo_opts_t;

typedef struct kvd_demo_result {
    uint32_t tokens[KVD_DEMO_MAX_GEN];
    uint32_t num_tokens;
    uint32_t prompt_tokens;
    uint32_t matched_tokens;  /* the leader's answer */
    uint32_t computed_tokens; /* prompt tokens the model computed */
    uint32_t failed_blocks;   /* loads that failed and were computed */
    double ttft_ms;           /* request in -> first token out */
    double total_ms;
    uint64_t bytes_loaded, bytes_stored;
    bool on_cuda; /* the cache was in GPU memory (CUDA backend) */
    /* kvd_demo_cache_digest of every position the run wrote or loaded
     * (prompt and generated tokens but the last), read back from the GPU
     * when the cache is there. */
    uint64_t kv_digest;
    /* Chunk reuse: prompt tokens loaded by content, and of those the ones
     * the seam repair computed again (CACHEBLEND: after the check layer;
     * every reused token is computed in layers 0 and 1). */
    uint32_t reused_tokens, recomputed_tokens;
    double kl_mean; /* with opts.ref_logp */
    /* With opts.gate: the gate's estimates once the request is done (the
     * worker's measured loads folded in). */
    kvd_leader_gate_t gate_est;
    /* Log-probabilities of the first min(gen, KVD_DEMO_LOGP_STEPS) steps
     * (vocabularies up to KVD_DEMO_LOGP_VOCAB). */
    float logp[KVD_DEMO_LOGP_STEPS][KVD_DEMO_LOGP_VOCAB];
} kvd_demo_result_t;

/* The prompt: a fixed text repeated up to prompt_tokens - len(question)
 * bytes, then the question. Writes prompt_tokens byte tokens. */
void kvd_demo_prompt(uint32_t prompt_tokens, const char *question,
                     uint32_t *tokens_out);

/* The namespace of the request's objects: model (checkpoint or seeded
 * sizes and seed), fp16, the codec, the shape, block size 16, TP 1. */
kvd_status_t kvd_demo_namespace(const kvd_demo_opts_t *opts,
                                const kvd_demo_model_t *model,
                                kvd_namespace_t *ns_out);

/* Serves one request; `err` gets the reason of a failure. */
kvd_status_t kvd_demo_run(const kvd_demo_opts_t *opts,
                          kvd_demo_result_t *result, char *err, size_t err_len);

/* What kvd_demo_run_child's process sends back. */
typedef struct kvd_demo_outcome {
    kvd_status_t status;
    char err[256];
    kvd_demo_result_t r;
} kvd_demo_outcome_t;

/* Runs kvd_demo_run in a new process (fork: nothing of this one is open
 * there) and waits for its outcome. Returns 0, or -1 with the reason on
 * stderr (the process died, or the run failed). */
int kvd_demo_run_child(const kvd_demo_opts_t *o, kvd_demo_outcome_t *out);

#endif /* KVD_DEMO_ENGINE_INT_H */
