/*
 * The retrieval scenario of non-prefix reuse (demo/rag_int.h,
 * docs/chunk-reuse.md).
 *
 * A retrieval system puts the same documents into many prompts, in the
 * order its ranking gives, behind the question of the day. Prompt A is a
 * system line, documents 1-4 and question 1; prompt B the same system line,
 * documents 3, 1, 4, 2 and question 2. Every document is padded to whole
 * blocks, as the prompt builder of a chunk-reusing application does, so
 * that its blocks (and their content keys) are the same wherever it
 * stands.
 *
 * Process 1 serves A on an empty store (its saves carry content keys). B
 * is then served, each time in a new process on a copy of that store: cold
 * in an empty store (the reference: its tokens and log-probabilities),
 * then with prefix matching only, and with content matches and each seam
 * repair. The runs after the reference are teacher-forced on its tokens,
 * so each generated step compares with the reference's step: greedy
 * agreement (the share of steps whose argmax is the reference's token) and
 * the mean KL divergence of the next-token distributions.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "demo/rag_int.h"

static const char rag_system[] =
    "Answer the question from the documents below. ";

static const char *const rag_docs[KVD_DEMO_RAG_DOCS] = {
    "Document: the host arena. kvdepot keeps evicted KV blocks in a shared "
    "memory arena cut into slots; a slot is leased while a worker copies "
    "it, so eviction never takes bytes from under a reader. ",
    "Document: the NVMe tier. Blocks that leave the arena are written with "
    "io_uring into large files, each extent checksummed, and an LMDB index "
    "finds them again after a restart of the process or the machine. ",
    "Document: the cluster. Several daemons register in etcd, place each "
    "block on a home node by its hash, and move bytes between nodes over "
    "UCX, so one engine can load what another engine computed. ",
    "Document: the codecs. Keys and values may be stored as fp8, int8, "
    "KIVI or TurboQuant, which cut the bytes two to eight times; each codec "
    "has a plain C reference and a CUDA kernel that agree bit for bit. ",
};

static const char *const rag_questions[2] = {
    " Question: which tier survives a restart, and how is it found?",
    " Question: how do two engines share the blocks they computed?",
};

/* Appends `text` cycled to `len` byte tokens. */
static void put_text(uint32_t *out, uint32_t *n, const char *text, uint32_t len)
{
    size_t tl = strlen(text);
    for (uint32_t i = 0; i < len; i++) {
        out[(*n)++] = (unsigned char)text[i % tl];
    }
}

uint32_t kvd_demo_rag_prompt(uint32_t doc_tokens, const int *order, int q,
                             uint32_t *tokens)
{
    uint32_t bs = KVD_DEMO_BLOCK_SIZE, n = 0;
    uint32_t sys = (uint32_t)(sizeof rag_system - 1);
    put_text(tokens, &n, rag_system, (sys + bs - 1) / bs * bs);
    for (int d = 0; d < KVD_DEMO_RAG_DOCS; d++) {
        put_text(tokens, &n, rag_docs[order[d]], doc_tokens);
    }
    const char *qt = rag_questions[q];
    put_text(tokens, &n, qt, (uint32_t)strlen(qt));
    return n;
}

uint32_t kvd_demo_rag_max_tokens(uint32_t doc_tokens)
{
    return 64 + KVD_DEMO_RAG_DOCS * doc_tokens + 128;
}

/* Serves prompt B in a copy of `populated` named after the mode; round 0
 * keeps the outcome, later rounds their TTFT. */
static int rag_run_mode(const kvd_demo_opts_t *base, const char *dir,
                        kvd_demo_reuse_t mode, uint32_t round,
                        kvd_demo_rag_t *out)
{
    static const char *const names[] = {"prefix", "chunks", "selective",
                                        "cacheblend"};
    char path[700], cmd[1500];
    snprintf(path, sizeof path, "%s/%s", dir, names[mode]);
    /* Synced before the run: the store reads its files with O_DIRECT,
     * which would first write back the copy's dirty pages, inside the
     * timed load. */
    snprintf(cmd, sizeof cmd,
             "rm -rf '%s' && cp -a '%s/populated' '%s' && sync", path, dir,
             path);
    if (system(cmd) != 0) {
        fprintf(stderr, "kvdepot-demo: copying the store failed\n");
        return -1;
    }
    kvd_demo_opts_t o = *base;
    o.store_dir = path;
    o.reuse = mode;
    o.force = out->cold.r.tokens;
    o.ref_logp = &out->cold.r.logp[0][0];
    kvd_demo_rag_row_t *row = &out->rows[mode];
    static kvd_demo_outcome_t later; /* large: not on the stack */
    kvd_demo_outcome_t *oc = round == 0 ? &row->run : &later;
    row->mode = mode;
    if (kvd_demo_run_child(&o, oc) != 0) {
        return -1;
    }
    row->ttft_ms[round] = oc->r.ttft_ms;
    if (round > 0) {
        return 0;
    }
    const kvd_demo_result_t *r = &row->run.r, *ref = &out->cold.r;
    row->agree = 0;
    for (uint32_t i = 0; i < r->num_tokens && i < ref->num_tokens; i++) {
        row->agree += r->tokens[i] == ref->tokens[i];
    }
    return 0;
}

/* Prompt B cold, in an empty store of its own (removed first). */
static int rag_run_cold(kvd_demo_opts_t *o, const char *dir, uint32_t round,
                        kvd_demo_rag_t *out)
{
    char path[700], cmd[800];
    snprintf(path, sizeof path, "%s/cold", dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    if (system(cmd) != 0) {
        return -1;
    }
    static kvd_demo_outcome_t later;
    kvd_demo_outcome_t *oc = round == 0 ? &out->cold : &later;
    o->reuse = KVD_DEMO_REUSE_PREFIX;
    o->store_dir = path;
    int rc = kvd_demo_run_child(o, oc);
    out->cold_ttft_ms[round] = oc->r.ttft_ms;
    return rc;
}

int kvd_demo_rag_run(const kvd_demo_opts_t *base, const char *dir,
                     uint32_t doc_tokens, uint32_t rounds, kvd_demo_rag_t *out)
{
    if (rounds == 0 || rounds > KVD_DEMO_RAG_MAX_ROUNDS) {
        fprintf(stderr, "kvdepot-demo: rounds 1..%u\n",
                KVD_DEMO_RAG_MAX_ROUNDS);
        return -1;
    }
    static const int order_a[KVD_DEMO_RAG_DOCS] = {0, 1, 2, 3};
    static const int order_b[KVD_DEMO_RAG_DOCS] = {2, 0, 3, 1};
    memset(out, 0, sizeof *out);
    out->rounds = rounds;
    uint32_t max = kvd_demo_rag_max_tokens(doc_tokens);
    uint32_t *a = calloc(max, sizeof *a), *b = calloc(max, sizeof *b);
    char cmd[700], path[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    int rc = a == NULL || b == NULL || system(cmd) != 0 ||
                     (mkdir(dir, 0755) != 0 && errno != EEXIST)
                 ? -1
                 : 0;
    kvd_demo_opts_t o = *base;
    o.chunks = true;
    if (rc == 0) {
        o.prompt_tokens = kvd_demo_rag_prompt(doc_tokens, order_a, 0, a);
        o.prompt = a;
        o.reuse = KVD_DEMO_REUSE_CHUNKS;
        snprintf(path, sizeof path, "%s/populated", dir);
        o.store_dir = path;
        rc = kvd_demo_run_child(&o, &out->populate);
    }
    o.prompt_tokens = kvd_demo_rag_prompt(doc_tokens, order_b, 1, b);
    o.prompt = b;
    /* Interleaved: every round runs cold and each mode in turn, so a
     * machine that slows down slows every row alike. */
    for (uint32_t round = 0; rc == 0 && round < rounds; round++) {
        rc = rag_run_cold(&o, dir, round, out);
        for (int m = 0; rc == 0 && m <= KVD_DEMO_REUSE_CACHEBLEND; m++) {
            rc = rag_run_mode(&o, dir, (kvd_demo_reuse_t)m, round, out);
        }
    }
    free(a);
    free(b);
    return rc;
}

double kvd_demo_rag_kept(const kvd_demo_result_t *r)
{
    uint32_t kept = r->matched_tokens + r->reused_tokens - r->recomputed_tokens;
    return r->prompt_tokens > 0 ? (double)kept / r->prompt_tokens : 0;
}

void kvd_demo_rag_stats(const double *v, uint32_t n, double *median,
                        double *min, double *max)
{
    double s[KVD_DEMO_RAG_MAX_ROUNDS];
    n = n < KVD_DEMO_RAG_MAX_ROUNDS ? n : KVD_DEMO_RAG_MAX_ROUNDS;
    memcpy(s, v, n * sizeof *s);
    for (uint32_t i = 1; i < n; i++) { /* insertion sort: n <= 9 */
        for (uint32_t j = i; j > 0 && s[j] < s[j - 1]; j--) {
            double t = s[j];
            s[j] = s[j - 1];
            s[j - 1] = t;
        }
    }
    *median = n == 0 ? 0 : n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
    *min = n == 0 ? 0 : s[0];
    *max = n == 0 ? 0 : s[n - 1];
}

/* "median (min-max)" of a row's TTFT. */
static void ttft_text(const double *v, uint32_t n, char *out, size_t len,
                      double *median)
{
    double lo = 0, hi = 0;
    kvd_demo_rag_stats(v, n, median, &lo, &hi);
    if (n > 1) {
        snprintf(out, len, "%.1f (%.1f-%.1f)", *median, lo, hi);
    } else {
        snprintf(out, len, "%.1f", *median);
    }
}

void kvd_demo_rag_print(const kvd_demo_rag_t *x)
{
    static const char *const names[] = {"prefix only", "chunks, no repair",
                                        "chunks, selective",
                                        "chunks, cacheblend"};
    char t[64];
    double cold_med = 0, med = 0;
    ttft_text(x->cold_ttft_ms, x->rounds, t, sizeof t, &cold_med);
    printf("| B served with       | reused | recomputed | computed | kept KV | "
           "TTFT ms, median (range) | vs cold | agreement |   mean KL |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    printf("| cold (reference)    | %6u | %10u | %8u | %7s | %23s | %7.2f | "
           "%9s | %9s |\n",
           0u, 0u, x->cold.r.computed_tokens, "0 %", t, 1.0, "-", "-");
    for (int m = 0; m <= KVD_DEMO_REUSE_CACHEBLEND; m++) {
        const kvd_demo_rag_row_t *row = &x->rows[m];
        const kvd_demo_result_t *r = &row->run.r;
        uint32_t reused = r->reused_tokens + r->matched_tokens;
        ttft_text(row->ttft_ms, x->rounds, t, sizeof t, &med);
        printf("| %-19s | %6u | %10u | %8u | %5.1f %% | %23s | %7.2f | "
               "%5u/%-3u | %9.2e |\n",
               names[m], reused, r->recomputed_tokens, r->computed_tokens,
               100.0 * kvd_demo_rag_kept(r), t,
               cold_med > 0 ? med / cold_med : 0, row->agree, r->num_tokens,
               r->kl_mean);
    }
}
