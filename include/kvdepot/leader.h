/*
 * kvdepot leader: the scheduler side of the KV connector (leader/README.md,
 * docs/architecture.md §6).
 *
 * Mirrors the engines' scheduler API (vLLM KVConnectorBase_V1 scheduler
 * role, TensorRT-LLM KvCacheConnectorScheduler) in C, for a thin Python
 * shim to drive:
 *
 *   get_num_new_matched_tokens -> update_state_after_alloc ->
 *   request_scheduled (per scheduled request) -> build_connector_meta ->
 *   (workers run the plan) -> update_connector_output ->
 *   request_finished
 *
 * The leader recognises blocks by their hash chain (docs/architecture.md
 * §5: from the request's tokens, or the engine's own block hashes), asks
 * the store which prefix it holds, and writes each step's plan as a packed
 * kvdepot.v1 StepPlan: per request, the engine blocks to load (with their
 * object key and tier) and the newly completed full blocks to save. It
 * does no data I/O and never waits for a load or a save; its one wait is
 * the store's lookup (kvd_store_lookup_from; a daemon-mode store: one call
 * to the daemon, bounded by store.timeout).
 *
 * Leases: every block the leader promises the engine is leased in the store
 * by the lookup (under every shard namespace, cfg.shard_ns), so no copy of
 * it can be evicted before the workers load it; the
 * leader releases the leases when all workers report the request's loads
 * finished (or failed), when the engine allocates fewer blocks than
 * matched, or when the request is preempted, aborted or finished. Workers
 * resolve keys in the store themselves (lease_id 0 in the plan) and take
 * their own leases for the copy; a DISK block is promoted by the worker
 * (kvd_store_get_submit), which is why such loads are asynchronous.
 *
 * Threading: a leader is used from one thread (the engine's scheduler);
 * no call is thread-safe against another on the same leader. Distinct
 * leaders are independent. The leader calls its store (lookup and
 * release) only from inside its own calls, on the caller's thread.
 */
#ifndef KVDEPOT_LEADER_H
#define KVDEPOT_LEADER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"
#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_leader kvd_leader_t;

typedef struct kvd_leader_config {
    uint32_t block_size;   /* tokens per engine block, 1..4096 */
    kvd_namespace_t ns;    /* namespace of this engine's objects */
    kvd_block_hash_t root; /* chain root: kvd_block_hash_seed() */
    uint32_t num_workers;  /* reports that finish a request, >= 1 */
    bool layerwise;        /* plan loads/saves layer by layer */
    bool async_host_loads; /* report HOST-tier loads as async too */
    /* The engine has no "retry later" (TensorRT-LLM): instead of "not
     * yet", the match stops before a block another request is loading,
     * and a store lookup that answers KVD_AGAIN counts as a miss. */
    bool no_retry;
    const char *node_id; /* this node, for hand-offs (copied; NULL: "") */
    /* How long one request may be answered "not yet" (a store lookup that
     * answered KVD_AGAIN, or blocks another request is loading) before
     * it is matched against what is ready, as with no_retry. 0: the
     * default, KVD_LEADER_DEFAULT_LOOKUP_TIMEOUT_MS. */
    uint32_t lookup_timeout_ms;
    /* The other shards of every block: with tensor parallelism each rank
     * stores its shard of a block under its own namespace, `ns` being the
     * planning rank's (rank 0); shard_ns lists the other ranks'
     * namespaces (later also the pipeline stages'). A block counts as
     * stored only when it is stored under `ns` and under every shard
     * namespace, and the leader leases every shard's copy, so no rank
     * misses a block it was promised. NULL with 0: `ns` alone. At most
     * KVD_LEADER_MAX_SHARD_NS; the array is copied at create. */
    const kvd_namespace_t *shard_ns;
    uint32_t num_shard_ns;
} kvd_leader_config_t;

#define KVD_LEADER_DEFAULT_LOOKUP_TIMEOUT_MS 2000u
/* The most shard namespaces a leader checks besides its own. */
#define KVD_LEADER_MAX_SHARD_NS 256u

/* An engine block id meaning "the engine holds no block at this position"
 * (vLLM's null block in a sliding-window KV-cache group, for tokens that
 * left the window). Block tables passed to the leader may hold it; nothing
 * is loaded into or saved from such a position. A load whose blocks are
 * all such positions is planned as asynchronous with nothing to copy, so
 * the worker reports it and its leases go back like any other. */
#define KVD_LEADER_NO_BLOCK UINT32_MAX

/*
 * Creates a leader over `store`, a store of either mode (kvd_store_open):
 * the leader looks prefixes up with kvd_store_lookup_from and gives leases
 * back with kvd_store_release. `cfg` is copied (cfg->node_id's string
 * too); `store` is borrowed and must stay open until the leader is
 * destroyed. A store lookup may answer KVD_AGAIN (not ready, ask again);
 * the leader then answers "not yet" to the engine; any other lookup error
 * is answered as a miss. On success *leader_out is the leader, valid until
 * kvd_leader_destroy. Errors (nothing created): KVD_ERR_INVALID (NULL,
 * block_size out of range, num_workers 0, shard_ns NULL with
 * num_shard_ns > 0, num_shard_ns over KVD_LEADER_MAX_SHARD_NS),
 * KVD_ERR_NOMEM.
 */
KVD_API kvd_status_t kvd_leader_create(const kvd_leader_config_t *cfg,
                                       kvd_store_t *store,
                                       kvd_leader_t **leader_out);

/* Releases every lease still held (through the store) and frees the
 * leader and everything it returned; NULL accepted. */
KVD_API void kvd_leader_destroy(kvd_leader_t *leader);

/*
 * Moves the leader to another namespace: a new namespace generation (the
 * engine reset its cache, vLLM reset_cache, or updated its weights in
 * place), so that nothing saved before is matched again. Later lookups,
 * saves and hand-offs use `ns`. Requests matched before keep their answer,
 * but their loads are planned under `ns`, where the workers (moved with
 * kvd_worker_set_namespace) miss them: load errors the engine recomputes,
 * never the old bytes. The shard namespaces (cfg.shard_ns) stay as they
 * are: a leader with shards moves them together with `ns` through
 * kvd_leader_set_namespaces. Errors: KVD_ERR_INVALID (NULL argument).
 * Thread: the leader's, like every other call.
 */
KVD_API kvd_status_t kvd_leader_set_namespace(kvd_leader_t *leader,
                                              const kvd_namespace_t *ns);

/*
 * kvd_leader_set_namespace for a leader with shards: moves `ns` and
 * replaces the shard namespaces with shard_ns[0..num_shard_ns) (copied;
 * 0 leaves `ns` alone, as cfg.shard_ns does), so later lookups ask every
 * shard's new namespace. Requests matched before keep the leases they
 * hold (on the old namespaces) until their loads end, as with
 * kvd_leader_set_namespace. Errors (nothing changed): KVD_ERR_INVALID
 * (NULL leader or ns, shard_ns NULL with num_shard_ns > 0, num_shard_ns
 * over KVD_LEADER_MAX_SHARD_NS). Thread: the leader's.
 */
KVD_API kvd_status_t kvd_leader_set_namespaces(kvd_leader_t *leader,
                                               const kvd_namespace_t *ns,
                                               const kvd_namespace_t *shard_ns,
                                               uint32_t num_shard_ns);

/* One multimodal input of a request (an image, an audio clip...): the
 * placeholder tokens [offset, offset + length) of the prompt stand for it,
 * and the same tokens stand for any other input of its kind, so the
 * input's identity must enter the keys of the blocks it overlaps. vLLM:
 * MultiModalFeatureSpec.identifier (its content hash, with the LoRA prefix
 * vLLM adds) and mm_position.offset / .length. */
typedef struct kvd_leader_mm_input {
    const char *identifier; /* NUL-terminated UTF-8, not NULL */
    uint64_t offset;        /* first placeholder token in the prompt */
    uint64_t length;        /* placeholder tokens */
} kvd_leader_mm_input_t;

/* A request as the engine first shows it. Either tokens (the leader hashes
 * every full block, vLLM's sha256_cbor recipe with lora_name on every block,
 * the multimodal inputs overlapping a block on that block and cache_salt on
 * the first: byte for byte vLLM's request_block_hasher) or the engine's own
 * block hashes (when the engine's hashing is deterministic and matches the
 * store's; mm_inputs is then ignored, the engine's hashes hold them). */
typedef struct kvd_leader_request {
    const char *request_id; /* 1..255 bytes, unique among live requests */
    const uint32_t *tokens; /* prompt tokens, or NULL */
    size_t num_tokens;      /* prompt length (also with hashes) */
    const kvd_block_hash_t *hashes; /* engine block hashes, or NULL */
    size_t num_hashes;
    const char *lora_name;  /* NULL: none */
    const char *cache_salt; /* NULL: none (tenant isolation) */
    /* The node that computed the blocks (a decode node taking over a
     * request: the prefill side's kvd_leader_transfer.node_id; copied at
     * the first call), asked first by the store. NULL: none. */
    const char *source_node;
    /* The request's multimodal inputs sorted by offset (vLLM's
     * request.mm_features order), or NULL with num_mm_inputs 0 for none.
     * Each full block's key then carries, as vLLM's
     * generate_block_hash_extra_keys does, (identifier, offset - block
     * start) for every input overlapping the block (a block completed
     * by generated tokens, as in vLLM, looks at the last input only);
     * blocks before the first input keep the keys of the same tokens
     * without inputs.
     * Borrowed for the call and copied at the first call, like the other
     * fields. */
    const kvd_leader_mm_input_t *mm_inputs;
    size_t num_mm_inputs;
    /* A prompt given as embeddings (vLLM prompt_embeds; its token ids are
     * placeholders, 0 where an embedding stands): the SHA-256 of the raw
     * bytes of each block's slice of the embeddings tensor, block 0 first,
     * KVD_SHA256_BYTES each, as vLLM's _gen_prompt_embeds_extra_hash_keys
     * computes them (the last slice may be shorter than a block). Every
     * block's key then carries its digest; blocks past the given digests
     * (completed by generated tokens) carry the SHA-256 of no bytes, as
     * vLLM's empty slice does. NULL with num_prompt_embeds 0: the prompt
     * is tokens. Token mode only; copied at the first call. */
    const uint8_t *prompt_embeds;
    size_t num_prompt_embeds;
} kvd_leader_request_t;

/*
 * vLLM get_num_new_matched_tokens. Looks the request's prefix up (once: a
 * repeated call returns the same answer and takes nothing more; with shard
 * namespaces, under `ns` and then under each shard, the answer being the
 * prefix all of them hold, leased in every one) and writes
 * the tokens the store can provide beyond `num_computed_tokens` (whole
 * blocks only, never the block holding the last prompt token) into
 * *matched_out and whether the load is asynchronous (some leased copy, in
 * any shard, is not in the HOST tier) into *async_out.
 * Returns KVD_OK, or KVD_AGAIN for "not yet" (vLLM's None): a block of the
 * prefix is being loaded for another request right now, or the store's
 * lookup answered KVD_AGAIN. A request is answered "not yet" for at most
 * lookup_timeout_ms from the first such answer; after that it is matched
 * against what is ready (up to the first block another request is loading;
 * a store still not ready counts as a miss; KVD_AGAIN under any shard
 * namespace counts as under `ns`). A store lookup that fails (under any
 * namespace: the daemon is unreachable, a deadline passed) is answered as
 * a miss and
 * counted in stats.lookup_errors: the engine computes, never waits on or
 * fails for the cache. `req` and what it points at are borrowed for the
 * call (the leader copies what it keeps at the first call). Errors:
 * KVD_ERR_INVALID (NULL, bad id, neither tokens nor hashes, mm_inputs NULL
 * with num_mm_inputs > 0, prompt_embeds NULL with num_prompt_embeds > 0, an
 * input without identifier, inputs not sorted by offset, offset + length past
 * INT64_MAX), KVD_ERR_EXISTS (the id is a finished request still kept for its
 * saves), KVD_ERR_STATE (asked again with another num_computed_tokens after
 * update_state_after_alloc acted on the answer), KVD_ERR_NOMEM.
 */
KVD_API kvd_status_t kvd_leader_get_num_new_matched_tokens(
    kvd_leader_t *leader, const kvd_leader_request_t *req,
    uint64_t num_computed_tokens, uint64_t *matched_out, bool *async_out);

/*
 * vLLM update_state_after_alloc: the engine allocated `block_ids` (the
 * request's whole block table so far) and decided to take
 * `num_external_tokens` of the matched tokens. Blocks the engine does not
 * take are released. Loads are planned in the next build_connector_meta.
 * `block_ids` is copied. Errors: KVD_ERR_INVALID (NULL leader or bad id,
 * NULL block_ids with num_block_ids > 0), KVD_ERR_NOT_FOUND for an unknown
 * request, KVD_ERR_STATE (a finished request kept for its saves, or
 * external tokens without a standing answer), KVD_ERR_RANGE for more
 * external tokens than matched or fewer block ids than the load needs,
 * KVD_ERR_NOMEM.
 */
KVD_API kvd_status_t kvd_leader_update_state_after_alloc(
    kvd_leader_t *leader, const char *request_id, const uint32_t *block_ids,
    size_t num_block_ids, uint64_t num_external_tokens);

/*
 * The engine scheduled `request_id` this step: `new_block_ids` were added to
 * its block table, `new_tokens` to its token sequence (decode output; NULL
 * when none), and after this step `num_computed_tokens` tokens will be in
 * its KV cache. Full blocks that become computed are planned for saving
 * (unless the store already has them). `new_hashes` adds engine block
 * hashes for requests created with hashes (NULL otherwise). The arrays are
 * copied. Errors: KVD_ERR_NOT_FOUND, KVD_ERR_INVALID, KVD_ERR_STATE (a
 * finished request kept for its saves), KVD_ERR_NOMEM.
 */
KVD_API kvd_status_t kvd_leader_request_scheduled(
    kvd_leader_t *leader, const char *request_id, const uint32_t *new_block_ids,
    size_t num_new_blocks, const uint32_t *new_tokens, size_t num_new_tokens,
    const kvd_block_hash_t *new_hashes, size_t num_new_hashes,
    uint64_t num_computed_tokens);

/*
 * vLLM build_connector_meta: packs this step's plan (every request touched
 * since the last call: loads, saves, preemptions) into a new buffer
 * (*plan_out, *len_out; free() it) and drains the per-step state. Errors:
 * KVD_ERR_INVALID, KVD_ERR_NOMEM, KVD_ERR_PROTO (a plan over the protocol's
 * limits; the step state is kept).
 */
KVD_API kvd_status_t kvd_leader_build_connector_meta(kvd_leader_t *leader,
                                                     uint8_t **plan_out,
                                                     size_t *len_out);

/*
 * vLLM update_connector_output: applies one worker's packed WorkerReport
 * (untrusted bytes, borrowed for the call). A request's saves (loads)
 * finish when num_workers reports named it; a failed load releases the
 * request's leases and queues its block id for
 * kvd_leader_take_failed_blocks. Errors (nothing applied): KVD_ERR_PROTO
 * (malformed report), KVD_ERR_INVALID, KVD_ERR_NOMEM. Unknown request ids
 * are ignored (already finished or aborted).
 */
KVD_API kvd_status_t kvd_leader_update_connector_output(kvd_leader_t *leader,
                                                        const void *report,
                                                        size_t len);

/* Moves up to `max` engine block ids whose load failed into `block_ids`
 * and returns how many (vLLM invalid_block_ids / kv_load_failure_policy);
 * 0 for NULL arguments. */
KVD_API size_t kvd_leader_take_failed_blocks(kvd_leader_t *leader,
                                             uint32_t *block_ids, size_t max);

/* Moves up to `max` ids of requests whose async loads finished into `out`
 * (pointers owned by the leader, valid until the next leader call) and
 * returns how many; 0 for NULL arguments or when memory for the copies
 * ran out (nothing is taken then). */
KVD_API size_t kvd_leader_take_finished_loads(kvd_leader_t *leader,
                                              const char **out, size_t max);

/*
 * The engine preempted the request: its leases are released, its pending
 * loads dropped, and it is listed in the next plan so workers finish its
 * in-flight saves before its blocks are reused. Its lookup is forgotten: a
 * resumed request asks get_num_new_matched_tokens again. Errors:
 * KVD_ERR_INVALID (NULL leader or bad id), KVD_ERR_NOT_FOUND,
 * KVD_ERR_STATE (a finished request).
 */
KVD_API kvd_status_t kvd_leader_request_preempted(kvd_leader_t *leader,
                                                  const char *request_id);

/*
 * vLLM request_finished (also for aborts): releases the request's leases
 * and writes into *delay_free_out whether the engine must keep its blocks
 * until the workers report its saves finished (they then stay tracked
 * until that report). KVD_ERR_INVALID for NULL arguments or a bad id,
 * KVD_ERR_NOT_FOUND for an unknown request. While a
 * finished request is kept, its id is taken: get_num_new_matched_tokens
 * with it answers KVD_ERR_EXISTS, and update_state_after_alloc,
 * request_scheduled and request_preempted KVD_ERR_STATE.
 */
KVD_API kvd_status_t kvd_leader_request_finished(kvd_leader_t *leader,
                                                 const char *request_id,
                                                 bool *delay_free_out);

/* What a decode node needs to take over a request whose prefill ran here
 * (prefill -> decode hand-off; vLLM kv_transfer_params). */
typedef struct kvd_leader_transfer {
    const char *node_id;            /* config node_id: where the blocks are */
    kvd_namespace_t ns;             /* their namespace */
    const kvd_block_hash_t *hashes; /* the request's full blocks, in order */
    size_t num_hashes;
    uint64_t num_tokens; /* tokens those blocks hold */
} kvd_leader_transfer_t;

/*
 * kvd_leader_request_finished for a request whose KV a decode node will
 * load (vLLM do_remote_decode): as well as releasing its leases, writes the
 * hand-off into *transfer_out (pointers valid until the next call on the
 * leader) and keeps *delay_free_out true while the request's saves are in
 * flight, since the decode node can only load what is stored. The blocks
 * handed off are the full blocks computed so far. Errors: as
 * kvd_leader_request_finished, and KVD_ERR_NOMEM (nothing changed).
 */
KVD_API kvd_status_t kvd_leader_request_finished_transfer(
    kvd_leader_t *leader, const char *request_id, bool *delay_free_out,
    kvd_leader_transfer_t *transfer_out);

/* A block whose save every worker reported finished
 * (kvd_leader_take_saved_blocks). */
typedef struct kvd_leader_saved_block {
    kvd_block_hash_t hash;   /* its key's hash, under the config's ns */
    kvd_block_hash_t parent; /* the previous block's, when has_parent */
    bool has_parent;         /* false for a request's first block */
    /* Its block_size tokens; NULL when the engine gave block hashes
     * instead of tokens. */
    const uint32_t *tokens;
    const char *lora_name; /* the request's, as given; NULL without */
} kvd_leader_saved_block_t;

/* The most blocks kvd_leader_set_saved_queue queues. */
#define KVD_LEADER_SAVED_MAX (1u << 20)

/*
 * Starts (capacity > 0) or stops (0) queueing saved blocks: from this call
 * on, when every worker's report has finished a request's saves (the
 * saves of its latest step that carried any, and every step before it),
 * each block those saves covered is queued for
 * kvd_leader_take_saved_blocks, in order; for an engine connector's KV
 * events (vLLM BlockStored). A block the store refused (full, or the
 * worker aborted the step) is queued as well: the report says the saves
 * ended, not that each one was stored; an embedded store's own events
 * (kvd_store_take_events) tell which were committed. When `capacity`
 * blocks are queued the oldest is dropped and counted. Calling it again
 * discards what was queued. Errors: KVD_ERR_INVALID (NULL leader,
 * capacity over KVD_LEADER_SAVED_MAX), KVD_ERR_NOMEM (nothing changed).
 */
KVD_API kvd_status_t kvd_leader_set_saved_queue(kvd_leader_t *leader,
                                                size_t capacity);

/*
 * Moves up to `max` queued saved blocks, oldest first, into `out` and
 * returns how many; their pointers are owned by the leader and valid until
 * the next kvd_leader_take_saved_blocks or kvd_leader_destroy.
 * *dropped_out (may be NULL) gets how many blocks were dropped for lack of
 * room since the previous take. 0 for a NULL leader or out, or when memory
 * ran out (nothing is taken then).
 */
KVD_API size_t kvd_leader_take_saved_blocks(kvd_leader_t *leader,
                                            kvd_leader_saved_block_t *out,
                                            size_t max, uint64_t *dropped_out);

/* ------------------------------------------------------------------------ */
/* Non-prefix reuse (docs/chunk-reuse.md)                                   */
/* ------------------------------------------------------------------------ */

/* How the engine repairs the seams of reused chunks (tokens whose stored
 * KV was computed behind another context). */
typedef enum kvd_repair {
    KVD_REPAIR_NONE = 0,      /* load reused blocks as they are */
    KVD_REPAIR_SELECTIVE = 1, /* recompute the first boundary_window tokens
                                 of every reused run, all layers */
    KVD_REPAIR_CACHEBLEND = 2 /* recompute the recompute_ratio of reused
                                 tokens whose KV deviates most, chosen by
                                 the engine from one layer's deviation */
} kvd_repair_t;

typedef struct kvd_leader_chunk_config {
    bool enabled; /* content keys on saves, kvd_leader_match_chunks */
    kvd_repair_t repair;
    uint32_t boundary_window; /* SELECTIVE: tokens per run, >= 1 */
    double recompute_ratio;   /* CACHEBLEND: (0, 1] of the reused tokens */
    /* Tokens before a block that enter its content key, so that a block
     * matches only behind the same overlap_k tokens (0: its own tokens
     * alone), at most 4096. */
    uint32_t overlap_k;
    /* The prompt's first sink_tokens tokens are never taken from a
     * content match (they are loaded by prefix or computed). */
    uint32_t sink_tokens;
} kvd_leader_chunk_config_t;

/*
 * Turns non-prefix reuse on (or off) for requests created from now on.
 * With it, every full block a request saves is stored under its prefix key
 * and also under its content key: SHA-256 of a domain tag, block_size,
 * overlap_k, the LoRA name, the cache salt and the block's tokens preceded
 * by overlap_k tokens (the namespace is the key's own). Blocks that
 * overlap a multimodal input, prompts given as embeddings and requests
 * created with the engine's hashes get no content key. Copied. Errors:
 * KVD_ERR_INVALID (NULL, a repair out of range, boundary_window 0 with
 * SELECTIVE, recompute_ratio outside (0, 1] with CACHEBLEND, overlap_k over
 * 4096), KVD_ERR_UNSUPPORTED (a leader with shard namespaces: chunk reuse
 * is for one rank for now).
 */
KVD_API kvd_status_t kvd_leader_set_chunk_reuse(
    kvd_leader_t *leader, const kvd_leader_chunk_config_t *cfg);

/* Where a prompt block's KV comes from (kvd_leader_match_chunks). */
typedef enum kvd_chunk_source {
    KVD_CHUNK_COMPUTE = 0, /* the engine computes it */
    KVD_CHUNK_PREFIX = 1,  /* loaded by the prefix match, exact */
    KVD_CHUNK_CONTENT = 2, /* loaded by content, rotated to its position */
    KVD_CHUNK_HELD = 3     /* the engine holds it already */
} kvd_chunk_source_t;

typedef struct kvd_leader_chunk_match {
    uint64_t prefix_tokens;    /* tokens of PREFIX and HELD blocks */
    uint64_t reused_tokens;    /* tokens of CONTENT blocks */
    uint64_t recompute_budget; /* CACHEBLEND: reused tokens to recompute */
    size_t num_blocks;         /* entries written to source_out */
    size_t num_recompute;      /* entries written to recompute_out */
    bool async;                /* the loads (prefix or content) are async */
} kvd_leader_chunk_match_t;

/*
 * For an engine that can compute any set of positions (not vLLM: its
 * scheduler computes a prefix's suffix): after get_num_new_matched_tokens
 * answered the request (KVD_OK) and before update_state_after_alloc, looks
 * up the content key of every full prompt block after the prefix match
 * (never the block of the last prompt token, nor one overlapping the first
 * sink_tokens tokens) and leases the hits. Writes the source of every
 * full prompt block, block 0 first, into source_out (max_blocks entries;
 * uint8_t kvd_chunk_source_t values), and the seam repair's plan: with
 * SELECTIVE, the positions to recompute (sorted, into recompute_out,
 * max_recompute entries); with CACHEBLEND, the budget in *out. The content
 * loads are planned with the prefix loads by update_state_after_alloc (to
 * the block table it is given); the worker rotates their keys to the new
 * positions (kvd_worker_set_rope). From the first CONTENT block on, the
 * request saves no block under its prefix key (its KV is not what the
 * prefix computes) and saves the blocks it computes under their content
 * keys only. A second call repeats the answer. Errors: KVD_ERR_INVALID
 * (NULL, bad id), KVD_ERR_NOT_FOUND, KVD_ERR_STATE (chunk reuse off, no
 * answer standing, or update_state_after_alloc already ran),
 * KVD_ERR_RANGE (max_blocks or max_recompute too small: nothing leased),
 * KVD_ERR_NOMEM. A store lookup that fails counts as a miss.
 */
KVD_API kvd_status_t kvd_leader_match_chunks(
    kvd_leader_t *leader, const char *request_id, uint8_t *source_out,
    size_t max_blocks, uint32_t *recompute_out, size_t max_recompute,
    kvd_leader_chunk_match_t *out);

/* ------------------------------------------------------------------------ */
/* Recompute-vs-fetch gate                                                  */
/* ------------------------------------------------------------------------ */

/*
 * The gate matches a stored prefix only where loading it is predicted to
 * be faster than computing it. Loading k blocks of a request is predicted
 * as the sum over its blocks of their tier's seconds per block, plus each
 * tier's latency once; computing them as k * block_size tokens at the
 * engine's prefill rate. Of the prefix the store holds, the gate keeps the
 * k (from 0 up to all of it) that saves the most, counting the load time
 * times (1 + margin), and gives the other leases back; nothing saved, no
 * match. Per-block times start at the values given here and follow the
 * workers' reports (WorkerReport.tier_loads: an exponential moving average
 * with weight `alpha`), the prefill rate follows kvd_leader_report_prefill.
 */
typedef struct kvd_leader_gate {
    bool enabled;
    double margin;               /* >= 0: load must win by this fraction */
    double prefill_tokens_per_s; /* > 0: the engine's prefill rate */
    /* Per tier (kvd_store_tier_t HOST, DISK; REMOTE blocks count as DISK):
     * seconds per block and per-load latency, > 0 and >= 0. */
    double host_s_per_block, disk_s_per_block;
    double host_latency_s, disk_latency_s;
    double alpha; /* (0, 1]: weight of a new report in the averages */
} kvd_leader_gate_t;

/*
 * Sets (or turns off) the gate for lookups from now on; `gate` is copied.
 * Errors: KVD_ERR_INVALID (NULL, a value out of the ranges above).
 */
KVD_API kvd_status_t kvd_leader_set_gate(kvd_leader_t *leader,
                                         const kvd_leader_gate_t *gate);

/* The gate's estimates now (the configured values as the reports moved
 * them). Errors: KVD_ERR_INVALID (NULL). */
KVD_API kvd_status_t kvd_leader_gate_estimates(kvd_leader_t *leader,
                                               kvd_leader_gate_t *out);

/*
 * The engine computed `tokens` prompt tokens in `seconds` (a prefill step
 * it timed): the gate's prefill rate moves toward tokens / seconds.
 * Errors: KVD_ERR_INVALID (NULL leader, tokens 0, seconds not > 0).
 */
KVD_API kvd_status_t kvd_leader_report_prefill(kvd_leader_t *leader,
                                               uint64_t tokens, double seconds);

typedef struct kvd_leader_stats {
    uint64_t requests;       /* tracked now */
    uint64_t leases;         /* held now, every namespace's: a block
                                leased with 3 shard namespaces counts 4 */
    uint64_t lookups;        /* store lookups made (one per namespace) */
    uint64_t matched_blocks; /* blocks promised to the engine */
    uint64_t planned_loads;
    uint64_t planned_saves;
    uint64_t failed_loads;
    uint64_t not_yet;  /* answers "not yet" */
    uint64_t timeouts; /* requests that stopped waiting (lookup_timeout_ms) */
    uint64_t lookup_errors;   /* store lookups that failed: answered as
                                 misses (the engine computes) */
    uint64_t content_lookups; /* content keys looked up */
    uint64_t content_blocks;  /* blocks matched by content */
    uint64_t gate_loaded;     /* blocks the gate let load */
    uint64_t gate_skipped;    /* stored blocks the gate had computed */
} kvd_leader_stats_t;

/* Copies the leader's counters into *out. Errors: KVD_ERR_INVALID (NULL
 * argument). Thread: the leader's, like every other call. */
KVD_API kvd_status_t kvd_leader_stats(kvd_leader_t *leader,
                                      kvd_leader_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif /* KVDEPOT_LEADER_H */
