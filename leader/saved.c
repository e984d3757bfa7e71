/*
 * Saved blocks for the engine's KV events: when the workers' reports
 * finish a request's saves, the blocks those saves covered are queued here
 * with what an event consumer needs to name them as the engine does (hash,
 * parent hash, tokens, LoRA name), and kvd_leader_take_saved_blocks hands
 * them out. The queue is off until kvd_leader_set_saved_queue turns it on,
 * and bounded: the oldest block is dropped (and counted) when it is full,
 * so an engine that never drains it loses events, not memory.
 */
#include <stdlib.h>
#include <string.h>

#include "common/grow_int.h"
#include "leader/leader_int.h"

static void saved_clear(lsaved_t *e)
{
    free(e->tokens);
    free(e->lora);
    memset(e, 0, sizeof *e);
}

static void saved_free_taken(kvd_leader_t *ld)
{
    for (size_t i = 0; i < ld->num_saved_taken; i++) {
        saved_clear(&ld->saved_taken[i]);
    }
    ld->num_saved_taken = 0;
}

static void saved_free_queue(kvd_leader_t *ld)
{
    for (size_t i = 0; i < ld->saved_len; i++) {
        saved_clear(&ld->saved[(ld->saved_head + i) % ld->saved_cap]);
    }
    free(ld->saved);
    ld->saved = NULL;
    ld->saved_cap = ld->saved_head = ld->saved_len = 0;
}

void kvd_leader_saved_free(kvd_leader_t *ld)
{
    saved_free_queue(ld);
    saved_free_taken(ld);
    free(ld->saved_taken);
    ld->saved_taken = NULL;
    ld->cap_saved_taken = 0;
}

KVD_API kvd_status_t kvd_leader_set_saved_queue(kvd_leader_t *leader,
                                                size_t capacity)
{
    if (leader == NULL || capacity > KVD_LEADER_SAVED_MAX) {
        return KVD_ERR_INVALID;
    }
    lsaved_t *q = NULL;
    if (capacity > 0 && (q = calloc(capacity, sizeof *q)) == NULL) {
        return KVD_ERR_NOMEM;
    }
    saved_free_queue(leader);
    leader->saved = q;
    leader->saved_cap = capacity;
    leader->saved_dropped = 0;
    return KVD_OK;
}

/* Queues block `blk` of `r`; false when out of memory (the block is then
 * counted as dropped). */
static bool saved_push_one(kvd_leader_t *ld, const lreq_t *r, size_t blk)
{
    size_t bs = ld->cfg.block_size;
    lsaved_t e = {.hash = r->hashes[blk], .has_parent = blk > 0};
    if (blk > 0) {
        e.parent = r->hashes[blk - 1];
    }
    if (!r->hashes_mode && (blk + 1) * bs <= r->num_tokens) {
        e.tokens = malloc(bs * sizeof *e.tokens);
        if (e.tokens == NULL) {
            return false;
        }
        memcpy(e.tokens, r->tokens + blk * bs, bs * sizeof *e.tokens);
    }
    if (r->lora != NULL && (e.lora = strdup(r->lora)) == NULL) {
        free(e.tokens);
        return false;
    }
    if (ld->saved_len == ld->saved_cap) { /* drop the oldest */
        saved_clear(&ld->saved[ld->saved_head]);
        ld->saved_head = (ld->saved_head + 1) % ld->saved_cap;
        ld->saved_len--;
        ld->saved_dropped++;
    }
    ld->saved[(ld->saved_head + ld->saved_len++) % ld->saved_cap] = e;
    return true;
}

void kvd_leader_saved_push(kvd_leader_t *ld, lreq_t *r)
{
    size_t from = r->saved_event_from, upto = r->saved_event_upto;
    r->saved_event_from = upto;
    if (ld->saved_cap == 0) {
        return;
    }
    if (upto > r->num_hashes) {
        upto = r->num_hashes;
    }
    if (upto > r->chunk_from) {
        upto = r->chunk_from; /* stored under content keys only */
    }
    for (size_t blk = from; blk < upto; blk++) {
        if (blk < r->num_block_ids &&
            r->block_ids[blk] == KVD_LEADER_NO_BLOCK) {
            continue; /* nothing was saved from this position */
        }
        if (!saved_push_one(ld, r, blk)) {
            ld->saved_dropped++;
        }
    }
}

KVD_API size_t kvd_leader_take_saved_blocks(kvd_leader_t *leader,
                                            kvd_leader_saved_block_t *out,
                                            size_t max, uint64_t *dropped_out)
{
    if (leader == NULL || out == NULL) {
        return 0;
    }
    kvd_leader_t *ld = leader;
    saved_free_taken(ld);
    size_t n = ld->saved_len < max ? ld->saved_len : max;
    if (n > 0 && !kvd_grow((void **)&ld->saved_taken, &ld->cap_saved_taken, n,
                           sizeof *ld->saved_taken)) {
        return 0;
    }
    for (size_t i = 0; i < n; i++) {
        lsaved_t *e = &ld->saved[ld->saved_head];
        ld->saved_taken[i] = *e;
        memset(e, 0, sizeof *e);
        ld->saved_head = (ld->saved_head + 1) % ld->saved_cap;
        ld->saved_len--;
        lsaved_t *t = &ld->saved_taken[i];
        out[i] = (kvd_leader_saved_block_t){.hash = t->hash,
                                            .parent = t->parent,
                                            .has_parent = t->has_parent,
                                            .tokens = t->tokens,
                                            .lora_name = t->lora};
    }
    ld->num_saved_taken = n;
    if (dropped_out != NULL) {
        *dropped_out = ld->saved_dropped;
    }
    ld->saved_dropped = 0;
    return n;
}
