/*
 * The leader's state, shared by its files (leader.c: the request table,
 * leases and the end of a request; match.c: lookups and the engine's
 * scheduling calls; plan.c: the step plan; report.c: worker reports).
 * Nothing outside leader/ includes it.
 *
 * Threading: the leader is single-threaded (include/kvdepot/leader.h);
 * none of these calls locks. Lifetimes: an lreq_t lives in the leader's
 * table from kvd_lreq_create until kvd_lreq_maybe_drop (or
 * kvd_leader_destroy) frees it; pointers to it are valid until then.
 */
#ifndef KVD_LEADER_LEADER_INT_H
#define KVD_LEADER_LEADER_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/grow_int.h"
#include "kvdepot/leader.h"
#include "proto/kvd_proto.h"

#define LEADER_BUCKETS 1024u
#define LEADER_HASH_BUCKETS 4096u
#define LEADER_ID_MAX 255u
#define LEADER_BLOCK_SIZE_MAX 4096u

/* lreq_t.has_content values. */
#define CHUNK_NO_KEY 0u
#define CHUNK_KEYED 1u
#define CHUNK_LOADED 2u

typedef struct lreq lreq_t;
struct lreq {
    lreq_t *next;         /* table chain */
    lreq_t *next_touched; /* plan list */
    bool touched;
    char id[LEADER_ID_MAX + 1];
    uint64_t not_yet_since_ns; /* first "not yet" answer, 0: none */

    /* Identity. */
    bool hashes_mode;
    uint32_t *tokens;
    size_t num_tokens, cap_tokens;
    kvd_block_hash_t *hashes;
    size_t num_hashes, cap_hashes;
    char *lora, *salt;
    char *source; /* the node that computed the blocks, or NULL */
    size_t prompt_tokens;
    /* Multimodal inputs (token mode only), sorted by offset; their
     * identifiers point into mm_text. mm_keys has room for one block's
     * keys (every input, at most). */
    kvd_leader_mm_input_t *mm;
    size_t num_mm;
    char *mm_text;
    kvd_mm_extra_t *mm_keys;
    /* Prompt embeddings: one digest per block (KVD_SHA256_BYTES each). */
    bool has_embeds;
    uint8_t *embeds;
    size_t num_embeds;

    /* Lookup: blocks [first_block, first_block + num_leases) are leased
     * under every namespace the lookup asked: `leases` holds lease_rows
     * rows of lease_stride leases, row 0 the plan's namespace (cfg.ns:
     * plan.c reads its tiers), row 1 + s shard namespace s of the time of
     * the lookup; the first num_leases of each row are held. The answer
     * holds for answered_computed tokens held by the engine. */
    bool looked_up;
    bool allocated; /* update_state_after_alloc took the answer */
    uint64_t answered_computed;
    size_t first_block;
    kvd_store_lease_t *leases;
    size_t num_leases;
    size_t lease_rows, lease_stride;
    bool async;
    uint64_t matched_tokens;

    /* Engine block table. */
    uint32_t *block_ids;
    size_t num_block_ids, cap_block_ids;

    /* Loads: `load_blocks` blocks from first_block, planned when
     * plan_loads is set; in flight until the reports finish them. */
    size_t load_blocks;
    size_t load_copies;   /* of those, blocks the engine holds (planned) */
    uint64_t load_tokens; /* num_external_tokens the engine took */
    bool plan_loads;
    bool loads_inflight;
    bool loading_marked; /* its async blocks are in `loading` */
    uint64_t load_step;
    uint32_t load_reports;

    /* Saves: blocks [0, saved_upto) are stored or planned; the next plan
     * carries [save_from, saved_upto). */
    size_t saved_upto, save_from;
    size_t save_copies; /* saves in the last plan (engine-held blocks) */
    bool saves_inflight;
    uint64_t save_step;
    uint32_t save_reports;
    /* Blocks [saved_event_from, saved_event_upto) are in the saves in
     * flight: queued as saved (saved.c) when the reports finish them. */
    size_t saved_event_from, saved_event_upto;

    /* Non-prefix reuse (chunk.c). Content keys of full blocks
     * [0, num_content), valid where has_content[b] is not CHUNK_NO_KEY
     * (CHUNK_LOADED: the block was loaded by content). The chunk answer:
     * chunk_leases[b] for blocks [0, chunk_cap), tier NONE where block b
     * was not matched by content; chunk_hits leases held. chunk_from is
     * the first block loaded by content (SIZE_MAX: none): from there on
     * nothing is saved under prefix keys, for the rest of the request. */
    bool chunk_on;
    kvd_block_hash_t *content;
    size_t num_content, cap_content;
    uint8_t *has_content;
    size_t cap_has_content;
    bool chunk_answered;
    bool chunk_async;
    kvd_store_lease_t *chunk_leases;
    size_t chunk_cap, chunk_hits;
    size_t chunk_from;

    bool preempted; /* list in the next plan */
    bool finished;  /* engine is done; kept until its saves finish */
};

/* A saved block waiting for kvd_leader_take_saved_blocks; owns its
 * tokens and lora copies. */
typedef struct lsaved {
    kvd_block_hash_t hash, parent;
    bool has_parent;
    uint32_t *tokens; /* block_size of them, or NULL */
    char *lora;       /* or NULL */
} lsaved_t;

typedef struct lhash lhash_t;
struct lhash {
    lhash_t *next;
    kvd_block_hash_t hash;
    uint32_t count;
};

struct kvd_leader {
    kvd_leader_config_t cfg;
    kvd_store_t *store; /* borrowed: outlives the leader */
    lreq_t *table[LEADER_BUCKETS];
    lreq_t *touched;
    lhash_t *loading[LEADER_HASH_BUCKETS];
    uint64_t step;
    uint32_t *failed;
    size_t num_failed, cap_failed;
    /* Ids of requests whose async loads ended, and those handed out by the
     * last kvd_leader_take_finished_loads (valid until the next take). */
    char (*done_ids)[LEADER_ID_MAX + 1];
    size_t num_done, cap_done;
    char (*taken)[LEADER_ID_MAX + 1];
    size_t cap_taken;
    char node_id[LEADER_ID_MAX + 1];
    /* cfg.shard_ns points here (cfg.num_shard_ns of them). */
    kvd_namespace_t shard_ns[KVD_LEADER_MAX_SHARD_NS];
    kvd_block_hash_t *handoff; /* last hand-off's hashes */
    size_t cap_handoff;
    kvd_leader_stats_t st;
    kvd_leader_chunk_config_t chunk; /* kvd_leader_set_chunk_reuse */
    kvd_leader_gate_t gate;          /* kvd_leader_set_gate, as learned */
    /* Saved blocks for kvd_leader_take_saved_blocks (saved.c): a ring of
     * saved_cap from saved_head, saved_len queued; those handed out by
     * the last take (valid until the next take). */
    lsaved_t *saved;
    size_t saved_cap, saved_head, saved_len;
    uint64_t saved_dropped;
    lsaved_t *saved_taken;
    size_t num_saved_taken, cap_saved_taken;
};

/* ---- the request table (leader.c) --------------------------------------- */

/* The request with this id, or NULL. */
lreq_t *kvd_lreq_find(kvd_leader_t *ld, const char *id);
/* True for an id the leader accepts: non-empty, at most LEADER_ID_MAX. */
bool kvd_leader_id_ok(const char *id);
/* Puts the request on the list the next plan walks (once). */
void kvd_lreq_touch(kvd_leader_t *ld, lreq_t *r);
/* A new request from the engine's description, in the table; its hash
 * chain covers every full block. KVD_ERR_NOMEM, or kvd_block_hash's error;
 * nothing is left behind on error. */
kvd_status_t kvd_lreq_create(kvd_leader_t *ld, const kvd_leader_request_t *q,
                             lreq_t **out);
/* True when the request's multimodal inputs are well formed: an array
 * when num_mm_inputs > 0, every identifier set, sorted by offset, and
 * offset + length within int64_t. */
bool kvd_leader_mm_ok(const kvd_leader_request_t *q);
/* Hashes every full block of the token sequence not hashed yet (token
 * mode; a no-op with the engine's hashes), with vLLM's per-block extra
 * keys (LoRA name, multimodal inputs, cache salt on block 0). KVD_ERR_NOMEM
 * or kvd_block_hash's error; blocks hashed before it stay. */
kvd_status_t kvd_lreq_extend_hashes(kvd_leader_t *ld, lreq_t *r);

/* Room for `need` elements in one of request r's arrays. When it must
 * grow, it gets 25% to 50% more plus `unit` (16 blocks' worth), the share
 * fixed per request (from a hash of its id): requests admitted together
 * with prompts of one length (a benchmark's fixed input length) then
 * outgrow their tokens, hashes and block ids in different steps, not all
 * in one (256 requests growing at 16,384 tokens cost one step 10 ms when
 * capacities doubled in step). Amortized O(1) appends, as doubling. */
static inline bool kvd_lreq_grow(const lreq_t *r, void **p, size_t *cap,
                                 size_t need, size_t unit, size_t elem)
{
    if (need <= *cap) {
        return true;
    }
    size_t quarter = need / 4;
    uint64_t spread = kvd_xxh3_64(r->id, strlen(r->id)) >> 32;
    size_t c = need + quarter + unit + (size_t)(spread % (quarter + 1));
    return c >= need && kvd_grow_to(p, cap, c, elem);
}

/* ---- blocks being loaded (leader.c) ------------------------------------- */

/* True while some request's asynchronous load of this block is planned and
 * not finished. */
bool kvd_leader_loading_has(kvd_leader_t *ld, const kvd_block_hash_t *h);
/* Counts one more load of the block; false when out of memory. */
bool kvd_leader_loading_add(kvd_leader_t *ld, const kvd_block_hash_t *h);

/* ---- leases, loads and the end of a request (leader.c) ------------------ */

/* Gives the request's leases back to the store (every row). */
void kvd_lreq_release_leases(kvd_leader_t *ld, lreq_t *r);
/* Gives back the leases of blocks from `keep` on (first_block + keep on),
 * in every row, keeping the first `keep` (<= num_leases) of each. */
void kvd_lreq_release_tail(kvd_leader_t *ld, lreq_t *r, size_t keep);
/* Ends the request's loads (finished, failed or dropped). */
void kvd_lreq_end_loads(kvd_leader_t *ld, lreq_t *r);
/* Ends the request's loads and forgets its answer. */
void kvd_lreq_forget_answer(kvd_leader_t *ld, lreq_t *r);
/* Frees a finished request once nothing of it is in flight; r is invalid
 * after it when it was dropped. */
void kvd_lreq_maybe_drop(kvd_leader_t *ld, lreq_t *r);

/* ---- non-prefix reuse (chunk.c) ---------------------------------------- */

/* Computes the content keys of full blocks not keyed yet (a request created
 * with chunk reuse on, in token mode). KVD_ERR_NOMEM or kvd_sha256's
 * error; the keys computed before stay. */
kvd_status_t kvd_lreq_extend_content(kvd_leader_t *ld, lreq_t *r);
/* Gives the chunk answer's leases back and forgets the answer (chunk_from
 * stays: what was loaded by content stays in the engine's cache). */
void kvd_chunk_release(kvd_leader_t *ld, lreq_t *r);
/* Blocks the engine's table must hold for the content loads. */
size_t kvd_chunk_blocks_needed(const lreq_t *r);
/* update_state_after_alloc took the answer: the content loads will be
 * planned with the prefix's (or, without hits, the answer is dropped). */
void kvd_chunk_after_alloc(kvd_leader_t *ld, lreq_t *r);

/* ---- the recompute-vs-fetch gate (gate.c) -------------------------------- */

/* How many of the blocks [first, m) leased in `leases` (row 0: their
 * tiers) the gate keeps loading: first + k for the k that saves the most,
 * or `first` when none saves. m when the gate is off. Counts its
 * decision. */
size_t kvd_gate_cut(kvd_leader_t *ld, const kvd_store_lease_t *leases,
                    size_t first, size_t m);
/* A worker's tier timings move the per-block estimates. */
void kvd_gate_observe(kvd_leader_t *ld, const kvd_pb_worker_report_t *rep);

/* ---- saved blocks (saved.c) --------------------------------------------- */

/* The request's saves in flight are finished: queues their blocks when
 * kvd_leader_set_saved_queue turned the queue on. */
void kvd_leader_saved_push(kvd_leader_t *ld, lreq_t *r);
/* Frees the queue and what the last take handed out. */
void kvd_leader_saved_free(kvd_leader_t *ld);

#endif /* KVD_LEADER_LEADER_INT_H */
