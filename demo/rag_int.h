/*
 * The retrieval scenario of non-prefix reuse (demo/rag.c,
 * docs/chunk-reuse.md): the same documents in another order behind another
 * question, served cold, with prefix matching only, and with content
 * matches and each seam repair, every run in a new process, compared step
 * by step with the cold run.
 */
#ifndef KVD_DEMO_RAG_INT_H
#define KVD_DEMO_RAG_INT_H

#include <stdint.h>

#include "demo/engine_int.h"

#define KVD_DEMO_RAG_DOCS 4
#define KVD_DEMO_RAG_MAX_ROUNDS 9

typedef struct kvd_demo_rag_row {
    kvd_demo_reuse_t mode;
    kvd_demo_outcome_t run; /* the first round's */
    uint32_t agree;         /* steps whose token is the reference's */
    double ttft_ms[KVD_DEMO_RAG_MAX_ROUNDS]; /* every round's */
} kvd_demo_rag_row_t;

typedef struct kvd_demo_rag {
    uint32_t rounds;
    kvd_demo_outcome_t populate; /* prompt A, on an empty store */
    kvd_demo_outcome_t cold;     /* prompt B, on an empty store */
    double cold_ttft_ms[KVD_DEMO_RAG_MAX_ROUNDS];
    kvd_demo_rag_row_t rows[KVD_DEMO_REUSE_CACHEBLEND + 1];
} kvd_demo_rag_t;

/* Writes the prompt (system line, the documents in `order`, question q of
 * 2) into `tokens` (kvd_demo_rag_max_tokens entries) and returns its
 * length. Every document is doc_tokens long (a multiple of the block
 * size) and starts on a block boundary. */
uint32_t kvd_demo_rag_prompt(uint32_t doc_tokens, const int *order, int q,
                             uint32_t *tokens);
uint32_t kvd_demo_rag_max_tokens(uint32_t doc_tokens);

/* Runs the scenario in `dir` (removed first) with `base`'s model, codec,
 * generation length and device: `rounds` (1..KVD_DEMO_RAG_MAX_ROUNDS)
 * rounds of the cold run and every mode, interleaved, for the TTFT's
 * median and range (tokens and distributions are the first round's; every
 * round computes the same). 0, or -1 with the reason on stderr. */
int kvd_demo_rag_run(const kvd_demo_opts_t *base, const char *dir,
                     uint32_t doc_tokens, uint32_t rounds, kvd_demo_rag_t *out);

/* Median, min and max of the first n of v. */
void kvd_demo_rag_stats(const double *v, uint32_t n, double *median,
                        double *min, double *max);

/* The share of the prompt whose KV came from the store and was kept:
 * prefix matches and content matches, less what the repair computed
 * again. */
double kvd_demo_rag_kept(const kvd_demo_result_t *r);

/* The table of the runs, markdown. */
void kvd_demo_rag_print(const kvd_demo_rag_t *x);

#endif /* KVD_DEMO_RAG_INT_H */
