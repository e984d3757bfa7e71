/*
 * The demo's Llama-architecture decoder (demo/model_int.h).
 *
 * Everything is computed per token in fp32 with the same code whatever the
 * number of tokens in the step, so a prefix computed in one process and a
 * prefix loaded from the store in another give bit-identical results for
 * the tokens after it: the only thing that differs is where the cache
 * bytes came from. Attention stages one layer's K and V for positions
 * 0..end from the paged fp16 cache into fp32 once per forward pass (after
 * the step's own tokens were written), then every query reads the staged
 * rows; nothing survives from one forward pass to the next except the
 * cache itself.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "demo/model_int.h"
#include "kernels/ref/ref.h"

/* ---- weights ------------------------------------------------------------ */

static size_t layer_floats(const kvd_demo_config_t *c)
{
    size_t dim = c->dim, kv = (size_t)c->dim / c->num_heads * c->num_kv_heads;
    return dim + dim * dim + 2 * kv * dim + dim * dim + dim +
           3 * (size_t)c->hidden_dim * dim;
}

static kvd_status_t config_check(const kvd_demo_config_t *c)
{
    if (c->dim == 0 || c->num_heads == 0 || c->num_kv_heads == 0 ||
        c->num_layers == 0 || c->hidden_dim == 0 || c->vocab_size == 0 ||
        c->max_seq == 0 || c->dim % c->num_heads != 0 ||
        c->num_heads % c->num_kv_heads != 0 ||
        (c->dim / c->num_heads) % 2 != 0 || c->dim > 8192 ||
        c->hidden_dim > 32768 || c->num_layers > 256 ||
        c->vocab_size > 1u << 20 || c->max_seq > 1u << 20) {
        return KVD_ERR_INVALID;
    }
    return KVD_OK;
}

/* Lays the tensors out in one allocation, llama2.c's order. */
static kvd_status_t model_alloc(const kvd_demo_config_t *cfg,
                                kvd_demo_model_t *m)
{
    memset(m, 0, sizeof *m);
    if (config_check(cfg) != KVD_OK) {
        return KVD_ERR_INVALID;
    }
    m->cfg = *cfg;
    m->head_dim = cfg->dim / cfg->num_heads;
    size_t dim = cfg->dim, vocab = cfg->vocab_size;
    size_t total = 2 * vocab * dim + dim + cfg->num_layers * layer_floats(cfg);
    m->mem = calloc(total, sizeof(float));
    m->layers = calloc(cfg->num_layers, sizeof *m->layers);
    if (m->mem == NULL || m->layers == NULL) {
        kvd_demo_model_free(m);
        return KVD_ERR_NOMEM;
    }
    size_t kv = (size_t)m->head_dim * cfg->num_kv_heads, L = cfg->num_layers;
    size_t hid = cfg->hidden_dim;
    float *p = m->mem;
    m->embed = p;
    p += vocab * dim;
    float *rms_att = p, *wq = rms_att + L * dim, *wk = wq + L * dim * dim;
    float *wv = wk + L * kv * dim, *wo = wv + L * kv * dim;
    float *rms_ffn = wo + L * dim * dim, *w1 = rms_ffn + L * dim;
    float *w2 = w1 + L * hid * dim, *w3 = w2 + L * dim * hid;
    for (size_t l = 0; l < L; l++) {
        kvd_demo_layer_t *ly = &m->layers[l];
        ly->rms_att = rms_att + l * dim;
        ly->wq = wq + l * dim * dim;
        ly->wk = wk + l * kv * dim;
        ly->wv = wv + l * kv * dim;
        ly->wo = wo + l * dim * dim;
        ly->rms_ffn = rms_ffn + l * dim;
        ly->w1 = w1 + l * hid * dim;
        ly->w2 = w2 + l * dim * hid;
        ly->w3 = w3 + l * hid * dim;
    }
    m->rms_final = w3 + L * hid * dim;
    m->wcls = m->rms_final + dim;
    return KVD_OK;
}

void kvd_demo_model_free(kvd_demo_model_t *m)
{
    if (m != NULL) {
        free(m->mem);
        free(m->layers);
        memset(m, 0, sizeof *m);
    }
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void fill(float *w, size_t n, size_t fan_in, uint64_t *s)
{
    float scale = 1.0f / sqrtf((float)fan_in);
    for (size_t i = 0; i < n; i++) {
        double u = (double)(splitmix(s) >> 11) * 0x1.0p-53;
        w[i] = (float)(2.0 * u - 1.0) * scale;
    }
}

static void ones(float *w, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        w[i] = 1.0f;
    }
}

kvd_status_t kvd_demo_model_init(const kvd_demo_config_t *cfg, uint64_t seed,
                                 kvd_demo_model_t *m)
{
    kvd_status_t st = model_alloc(cfg, m);
    if (st != KVD_OK) {
        return st;
    }
    size_t dim = cfg->dim, kv = (size_t)m->head_dim * cfg->num_kv_heads;
    size_t hid = cfg->hidden_dim;
    fill(m->embed, (size_t)cfg->vocab_size * dim, 1, &seed);
    for (uint32_t l = 0; l < cfg->num_layers; l++) {
        kvd_demo_layer_t *ly = &m->layers[l];
        ones(ly->rms_att, dim);
        fill(ly->wq, dim * dim, dim, &seed);
        fill(ly->wk, kv * dim, dim, &seed);
        fill(ly->wv, kv * dim, dim, &seed);
        fill(ly->wo, dim * dim, dim, &seed);
        ones(ly->rms_ffn, dim);
        fill(ly->w1, hid * dim, dim, &seed);
        fill(ly->w2, dim * hid, hid, &seed);
        fill(ly->w3, hid * dim, dim, &seed);
    }
    ones(m->rms_final, dim);
    fill(m->wcls, (size_t)cfg->vocab_size * dim, dim, &seed);
    return KVD_OK;
}

/* The blocks of one llama2.c file between the header and wcls, in order,
 * as (pointer, floats) over the model's memory; the two RoPE tables
 * llama2.c stores after rms_final are skipped on load and written on save
 * (as zeros: this model computes them). */
static size_t body_floats(const kvd_demo_model_t *m)
{
    return (size_t)m->cfg.vocab_size * m->cfg.dim +
           m->cfg.num_layers * layer_floats(&m->cfg) + m->cfg.dim;
}

kvd_status_t kvd_demo_model_save(const kvd_demo_model_t *m, const char *path)
{
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        return kvd_status_from_errno(errno);
    }
    const kvd_demo_config_t *c = &m->cfg;
    int32_t hdr[7] = {(int32_t)c->dim,          (int32_t)c->hidden_dim,
                      (int32_t)c->num_layers,   (int32_t)c->num_heads,
                      (int32_t)c->num_kv_heads, -(int32_t)c->vocab_size,
                      (int32_t)c->max_seq};
    size_t rope = (size_t)c->max_seq * m->head_dim / 2;
    float *zeros = calloc(rope + 1, sizeof(float));
    bool ok =
        zeros != NULL && fwrite(hdr, sizeof hdr, 1, f) == 1 &&
        fwrite(m->mem, sizeof(float), body_floats(m), f) == body_floats(m) &&
        fwrite(zeros, sizeof(float), rope, f) == rope &&
        fwrite(zeros, sizeof(float), rope, f) == rope &&
        fwrite(m->wcls, sizeof(float), (size_t)c->vocab_size * c->dim, f) ==
            (size_t)c->vocab_size * c->dim;
    free(zeros);
    if (fclose(f) != 0) {
        ok = false;
    }
    return ok ? KVD_OK : KVD_ERR_IO;
}

kvd_status_t kvd_demo_model_load(const char *path, kvd_demo_model_t *m,
                                 char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, err_len, "%s: %s", path, strerror(errno));
        return kvd_status_from_errno(errno);
    }
    int32_t hdr[7];
    kvd_status_t st = KVD_ERR_CORRUPT;
    if (fread(hdr, sizeof hdr, 1, f) != 1) {
        snprintf(err, err_len, "%s: no llama2.c header", path);
        goto out;
    }
    kvd_demo_config_t c = {0};
    bool shared = hdr[5] > 0;
    for (int i = 0; i < 7; i++) {
        if (hdr[i] == 0 || (i != 5 && hdr[i] < 0) || hdr[i] == INT32_MIN) {
            snprintf(err, err_len, "%s: header field %d is %d", path, i,
                     hdr[i]);
            goto out;
        }
    }
    c.dim = (uint32_t)hdr[0];
    c.hidden_dim = (uint32_t)hdr[1];
    c.num_layers = (uint32_t)hdr[2];
    c.num_heads = (uint32_t)hdr[3];
    c.num_kv_heads = (uint32_t)hdr[4];
    c.vocab_size = (uint32_t)(shared ? hdr[5] : -hdr[5]);
    c.max_seq = (uint32_t)hdr[6];
    c.rope_theta = 10000.0f;
    st = model_alloc(&c, m);
    if (st != KVD_OK) {
        snprintf(err, err_len, "%s: sizes out of range", path);
        goto out;
    }
    size_t rope = (size_t)c.max_seq * m->head_dim / 2;
    size_t body = body_floats(m), cls = (size_t)c.vocab_size * c.dim;
    bool ok = fread(m->mem, sizeof(float), body, f) == body &&
              fseek(f, (long)(2 * rope * sizeof(float)), SEEK_CUR) == 0;
    if (ok && shared) {
        memcpy(m->wcls, m->embed, cls * sizeof(float));
    } else if (ok) {
        ok = fread(m->wcls, sizeof(float), cls, f) == cls;
    }
    if (!ok) {
        snprintf(err, err_len, "%s: shorter than its header says", path);
        kvd_demo_model_free(m);
        st = KVD_ERR_CORRUPT;
    }
out:
    fclose(f);
    return st;
}

/* ---- cache -------------------------------------------------------------- */

kvd_status_t kvd_demo_cache_init(const kvd_demo_model_t *m, uint32_t num_blocks,
                                 uint32_t block_size, kvd_demo_cache_t *c)
{
    memset(c, 0, sizeof *c);
    c->num_layers = m->cfg.num_layers;
    c->num_blocks = num_blocks;
    c->block_size = block_size;
    c->layer_bytes = (size_t)2 * num_blocks * block_size * m->cfg.num_kv_heads *
                     m->head_dim * sizeof(uint16_t);
    c->layer = calloc(m->cfg.num_layers, sizeof *c->layer);
    if (c->layer == NULL) {
        return KVD_ERR_NOMEM;
    }
    for (uint32_t l = 0; l < m->cfg.num_layers; l++) {
        c->layer[l] = aligned_alloc(64, (c->layer_bytes + 63) / 64 * 64);
        if (c->layer[l] == NULL) {
            kvd_demo_cache_free(c);
            return KVD_ERR_NOMEM;
        }
        memset(c->layer[l], 0, c->layer_bytes);
    }
    return KVD_OK;
}

void kvd_demo_cache_free(kvd_demo_cache_t *c)
{
    if (c != NULL && c->layer != NULL) {
        for (uint32_t l = 0; l < c->num_layers; l++) {
            free(c->layer[l]);
        }
        free(c->layer);
        c->layer = NULL;
    }
}

/* ---- forward ------------------------------------------------------------ */

static void rmsnorm(float *out, const float *x, const float *w, size_t n)
{
    float ss = 0.0f;
    for (size_t i = 0; i < n; i++) {
        ss += x[i] * x[i];
    }
    ss = 1.0f / sqrtf(ss / (float)n + 1e-5f);
    for (size_t i = 0; i < n; i++) {
        out[i] = w[i] * (ss * x[i]);
    }
}

/* out[d] = W[d][n] . x[n] */
static void matmul(float *out, const float *w, const float *x, size_t d,
                   size_t n)
{
    for (size_t i = 0; i < d; i++) {
        const float *row = w + i * n;
        float s = 0.0f;
        for (size_t j = 0; j < n; j++) {
            s += row[j] * x[j];
        }
        out[i] = s;
    }
}

static void rope(float *v, size_t n, uint32_t head_dim, uint32_t pos,
                 float theta)
{
    for (size_t i = 0; i < n; i += 2) {
        uint32_t hi = (uint32_t)(i % head_dim);
        float freq = 1.0f / powf(theta, (float)hi / (float)head_dim);
        float a = (float)pos * freq, cr = cosf(a), ci = sinf(a);
        float v0 = v[i], v1 = v[i + 1];
        v[i] = v0 * cr - v1 * ci;
        v[i + 1] = v0 * ci + v1 * cr;
    }
}

/* Cache row of (plane, position) in layer `l`: kv_heads * head_dim fp16. */
static uint16_t *cache_row(const kvd_demo_cache_t *c, uint32_t l,
                           uint32_t plane, const uint32_t *block_table,
                           uint32_t pos, size_t kv_dim)
{
    size_t blk = block_table[pos / c->block_size];
    size_t slot = ((size_t)plane * c->num_blocks + blk) * c->block_size +
                  pos % c->block_size;
    return c->layer[l] + slot * kv_dim;
}

uint64_t kvd_demo_cache_digest(const kvd_demo_cache_t *c,
                               const uint32_t *block_table, uint32_t num_pos,
                               size_t kv_dim)
{
    uint64_t acc = 0x6b76646570ull;
    for (uint32_t l = 0; l < c->num_layers; l++) {
        for (uint32_t plane = 0; plane < 2; plane++) {
            for (uint32_t p = 0; p < num_pos; p++) {
                const uint16_t *row =
                    cache_row(c, l, plane, block_table, p, kv_dim);
                uint64_t h = kvd_xxh3_64(row, kv_dim * sizeof *row);
                acc = (acc ^ h) * 0x100000001b3ull;
            }
        }
    }
    return acc;
}

typedef struct scratch {
    float *x, *q, *xb, *xb2, *hb, *hb2, *kv, *att, *kst, *vst, *logits;
} scratch_t;

static kvd_status_t scratch_init(scratch_t *s, const kvd_demo_model_t *m,
                                 size_t n, size_t npos)
{
    size_t dim = m->cfg.dim, kv = (size_t)m->head_dim * m->cfg.num_kv_heads;
    s->x = malloc(n * dim * sizeof(float));
    s->q = malloc(n * dim * sizeof(float));
    s->xb = malloc(dim * sizeof(float));
    s->xb2 = malloc(dim * sizeof(float));
    s->hb = malloc(m->cfg.hidden_dim * sizeof(float));
    s->hb2 = malloc(m->cfg.hidden_dim * sizeof(float));
    s->kv = malloc(2 * kv * sizeof(float));
    s->att = malloc(npos * sizeof(float));
    s->kst = malloc(npos * kv * sizeof(float));
    s->vst = malloc(npos * kv * sizeof(float));
    s->logits = malloc(m->cfg.vocab_size * sizeof(float));
    bool ok = s->x && s->q && s->xb && s->xb2 && s->hb && s->hb2 && s->kv &&
              s->att && s->kst && s->vst && s->logits;
    return ok ? KVD_OK : KVD_ERR_NOMEM;
}

static void scratch_free(scratch_t *s)
{
    free(s->x);
    free(s->q);
    free(s->xb);
    free(s->xb2);
    free(s->hb);
    free(s->hb2);
    free(s->kv);
    free(s->att);
    free(s->kst);
    free(s->vst);
    free(s->logits);
}

/* Attention of the active tokens act[0..na) (indexes into the step's
 * arrays, at positions pos[]) in layer `l` over the staged K/V. */
static void attend(const kvd_demo_model_t *m, scratch_t *s, const uint32_t *act,
                   size_t na, const uint32_t *pos, const kvd_demo_layer_t *ly)
{
    uint32_t hd = m->head_dim, nh = m->cfg.num_heads;
    uint32_t group = nh / m->cfg.num_kv_heads;
    size_t dim = m->cfg.dim, kv = (size_t)hd * m->cfg.num_kv_heads;
    float inv = 1.0f / sqrtf((float)hd);
    for (size_t a = 0; a < na; a++) {
        size_t t = act[a];
        uint32_t end = pos[t];
        for (uint32_t h = 0; h < nh; h++) {
            const float *q = s->q + t * dim + (size_t)h * hd;
            size_t koff = (size_t)(h / group) * hd;
            float mx = -INFINITY;
            for (uint32_t p = 0; p <= end; p++) {
                const float *k = s->kst + p * kv + koff;
                float d = 0.0f;
                for (uint32_t i = 0; i < hd; i++) {
                    d += q[i] * k[i];
                }
                s->att[p] = d * inv;
                mx = s->att[p] > mx ? s->att[p] : mx;
            }
            float sum = 0.0f;
            for (uint32_t p = 0; p <= end; p++) {
                s->att[p] = expf(s->att[p] - mx);
                sum += s->att[p];
            }
            float *o = s->xb2 + (size_t)h * hd;
            memset(o, 0, hd * sizeof(float));
            for (uint32_t p = 0; p <= end; p++) {
                const float *v = s->vst + p * kv + koff;
                float w = s->att[p] / sum;
                for (uint32_t i = 0; i < hd; i++) {
                    o[i] += w * v[i];
                }
            }
        }
        matmul(s->xb, ly->wo, s->xb2, dim, dim);
        for (size_t i = 0; i < dim; i++) {
            s->x[t * dim + i] += s->xb[i];
        }
    }
}

static void mlp(const kvd_demo_model_t *m, scratch_t *s, const uint32_t *act,
                size_t na, const kvd_demo_layer_t *ly)
{
    size_t dim = m->cfg.dim, hid = m->cfg.hidden_dim;
    for (size_t a = 0; a < na; a++) {
        float *x = s->x + (size_t)act[a] * dim;
        rmsnorm(s->xb, x, ly->rms_ffn, dim);
        matmul(s->hb, ly->w1, s->xb, hid, dim);
        matmul(s->hb2, ly->w3, s->xb, hid, dim);
        for (size_t i = 0; i < hid; i++) {
            float v = s->hb[i];
            s->hb[i] = v / (1.0f + expf(-v)) * s->hb2[i];
        }
        matmul(s->xb, ly->w2, s->hb, dim, hid);
        for (size_t i = 0; i < dim; i++) {
            x[i] += s->xb[i];
        }
    }
}

/* Squared distance between a fresh K/V pair and what the cache holds. */
static float kv_deviation(const float *fresh, const uint16_t *k,
                          const uint16_t *v, size_t kv, float *tmp)
{
    float d = 0.0f;
    for (uint32_t p = 0; p < 2; p++) {
        kvd_ref_load_f32(KVD_DTYPE_FP16, p == 0 ? k : v, tmp, kv);
        for (size_t i = 0; i < kv; i++) {
            float e = fresh[p * kv + i] - tmp[i];
            d += e * e;
        }
    }
    return d;
}

/* Q, K and V of the active tokens in layer `l`, K and V written to the
 * cache; with `dev`, first the deviation of each from the cached rows. */
static void project(const kvd_demo_model_t *m, kvd_demo_cache_t *c,
                    const uint32_t *table, scratch_t *s, const uint32_t *act,
                    size_t na, const uint32_t *pos, uint32_t l, float *dev)
{
    const kvd_demo_layer_t *ly = &m->layers[l];
    size_t dim = m->cfg.dim, kv = (size_t)m->head_dim * m->cfg.num_kv_heads;
    for (size_t a = 0; a < na; a++) {
        size_t t = act[a];
        rmsnorm(s->xb, s->x + t * dim, ly->rms_att, dim);
        matmul(s->q + t * dim, ly->wq, s->xb, dim, dim);
        matmul(s->kv, ly->wk, s->xb, kv, dim);
        matmul(s->kv + kv, ly->wv, s->xb, kv, dim);
        rope(s->q + t * dim, dim, m->head_dim, pos[t], m->cfg.rope_theta);
        rope(s->kv, kv, m->head_dim, pos[t], m->cfg.rope_theta);
        if (dev != NULL) {
            dev[t] =
                kv_deviation(s->kv, cache_row(c, l, 0, table, pos[t], kv),
                             cache_row(c, l, 1, table, pos[t], kv), kv, s->kst);
        }
        for (uint32_t p = 0; p < 2; p++) {
            kvd_ref_store_f32(KVD_DTYPE_FP16, s->kv + p * kv,
                              cache_row(c, l, p, table, pos[t], kv), kv);
        }
    }
}

/* CacheBlend's choice after the check layer: the active set keeps every
 * token that is not reused and the `budget` reused ones whose K/V
 * deviated most. Returns the new count (act stays sorted). */
static size_t blend_select(const kvd_demo_blend_t *b, const uint32_t *pos,
                           uint32_t *act, size_t na, const float *dev)
{
    /* The budget-th largest deviation among reused tokens, by selection
     * on a copy (n is a prompt: a few thousand). */
    size_t nr = 0;
    float *d = malloc((na + 1) * sizeof *d);
    if (d == NULL) {
        return na; /* keep everything: exact, only slower */
    }
    for (size_t a = 0; a < na; a++) {
        if (b->reused[pos[act[a]]]) {
            d[nr++] = dev[act[a]];
        }
    }
    size_t keep = b->budget < nr ? b->budget : nr, out = 0, taken = 0;
    float cut = INFINITY;
    if (keep > 0 && keep < nr) {
        for (size_t i = 0; i < keep; i++) { /* partial selection sort */
            size_t best = i;
            for (size_t j = i + 1; j < nr; j++) {
                best = d[j] > d[best] ? j : best;
            }
            float tmp = d[i];
            d[i] = d[best];
            d[best] = tmp;
        }
        cut = d[keep - 1];
    } else if (keep == nr) {
        cut = -INFINITY;
    }
    for (size_t a = 0; a < na; a++) {
        bool reused = b->reused[pos[act[a]]];
        if (!reused ||
            (taken < keep && (dev[act[a]] >= cut || cut == -INFINITY))) {
            taken += reused;
            act[out++] = act[a];
        }
    }
    free(d);
    return out;
}

/*
 * The forward pass over tokens[t] at positions pos[t] (t < n, positions
 * increasing): K/V of every active token written into the cache before
 * any attention reads positions 0..pos[t] from it. With `blend`, layers up
 * to check_layer compute every token and the rest only those blend_select
 * keeps. The logits of the last token go to s->logits.
 */
static kvd_status_t forward_core(const kvd_demo_model_t *m, kvd_demo_cache_t *c,
                                 const uint32_t *table, const uint32_t *tokens,
                                 const uint32_t *pos, size_t n,
                                 const kvd_demo_blend_t *blend,
                                 const kvd_demo_hooks_t *hooks, scratch_t *s,
                                 uint32_t *act, float *dev)
{
    size_t dim = m->cfg.dim, kv = (size_t)m->head_dim * m->cfg.num_kv_heads;
    size_t npos = (size_t)pos[n - 1] + 1, na = n;
    for (size_t t = 0; t < n; t++) {
        memcpy(s->x + t * dim, m->embed + (size_t)tokens[t] * dim,
               dim * sizeof(float));
        act[t] = (uint32_t)t;
    }
    for (uint32_t l = 0; l < m->cfg.num_layers; l++) {
        const kvd_demo_layer_t *ly = &m->layers[l];
        if (hooks != NULL && hooks->before_layer != NULL) {
            hooks->before_layer(hooks->ctx, l);
        }
        bool check = blend != NULL && l == blend->check_layer;
        project(m, c, table, s, act, na, pos, l, check ? dev : NULL);
        /* K and V of every position so far, read back from the cache. */
        for (uint32_t p = 0; p < npos; p++) {
            kvd_ref_load_f32(KVD_DTYPE_FP16, cache_row(c, l, 0, table, p, kv),
                             s->kst + (size_t)p * kv, kv);
            kvd_ref_load_f32(KVD_DTYPE_FP16, cache_row(c, l, 1, table, p, kv),
                             s->vst + (size_t)p * kv, kv);
        }
        attend(m, s, act, na, pos, ly);
        mlp(m, s, act, na, ly);
        if (check) {
            na = blend_select(blend, pos, act, na, dev);
        }
        if (hooks != NULL && hooks->after_layer != NULL) {
            hooks->after_layer(hooks->ctx, l);
        }
    }
    rmsnorm(s->xb, s->x + (n - 1) * dim, m->rms_final, dim);
    matmul(s->logits, m->wcls, s->xb, m->cfg.vocab_size, dim);
    return KVD_OK;
}

static uint32_t argmax(const float *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++) {
        best = v[i] > v[best] ? i : best;
    }
    return best;
}

kvd_status_t kvd_demo_forward_at(const kvd_demo_model_t *m, kvd_demo_cache_t *c,
                                 const uint32_t *block_table,
                                 const uint32_t *tokens, const uint32_t *pos,
                                 size_t n, const kvd_demo_blend_t *blend,
                                 const kvd_demo_hooks_t *hooks,
                                 uint32_t *next_out, float *logits_out)
{
    if (n == 0) {
        return KVD_ERR_RANGE;
    }
    for (size_t t = 0; t < n; t++) {
        if (tokens[t] >= m->cfg.vocab_size || pos[t] >= m->cfg.max_seq ||
            pos[t] >= (size_t)c->num_blocks * c->block_size ||
            (t > 0 && pos[t] <= pos[t - 1])) {
            return KVD_ERR_RANGE;
        }
    }
    if (blend != NULL && (blend->check_layer >= m->cfg.num_layers ||
                          blend->reused[pos[n - 1]])) {
        return KVD_ERR_INVALID; /* the last token is always computed */
    }
    size_t npos = (size_t)pos[n - 1] + 1;
    scratch_t s = {0};
    uint32_t *act = malloc(n * sizeof *act);
    float *dev = calloc(n, sizeof *dev);
    kvd_status_t st = scratch_init(&s, m, n, npos);
    if (st == KVD_OK && (act == NULL || dev == NULL)) {
        st = KVD_ERR_NOMEM;
    }
    if (st == KVD_OK) {
        st = forward_core(m, c, block_table, tokens, pos, n, blend, hooks, &s,
                          act, dev);
    }
    if (st == KVD_OK) {
        *next_out = argmax(s.logits, m->cfg.vocab_size);
        if (logits_out != NULL) {
            memcpy(logits_out, s.logits, m->cfg.vocab_size * sizeof(float));
        }
    }
    free(act);
    free(dev);
    scratch_free(&s);
    return st;
}

kvd_status_t kvd_demo_forward(const kvd_demo_model_t *m, kvd_demo_cache_t *c,
                              const uint32_t *block_table,
                              const uint32_t *tokens, size_t n, uint32_t pos0,
                              const kvd_demo_hooks_t *hooks, uint32_t *next_out)
{
    if (n == 0 || (size_t)pos0 + n > m->cfg.max_seq ||
        (size_t)pos0 + n > (size_t)c->num_blocks * c->block_size) {
        return KVD_ERR_RANGE;
    }
    uint32_t *pos = malloc(n * sizeof *pos);
    if (pos == NULL) {
        return KVD_ERR_NOMEM;
    }
    for (size_t t = 0; t < n; t++) {
        pos[t] = pos0 + (uint32_t)t;
    }
    kvd_status_t st = kvd_demo_forward_at(m, c, block_table, tokens, pos, n,
                                          NULL, hooks, next_out, NULL);
    free(pos);
    return st;
}
