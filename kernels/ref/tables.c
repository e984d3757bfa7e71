/*
 * Codec tables (kvdepot/kernels.h): the TurboQuant sign vector and the
 * Lloyd-Max codebooks for the rotated coordinate at the format's head_dim.
 *
 * Signs: s_i is the top bit of the i-th splitmix64 output from tq_seed
 * (1 -> -1.0f). A top bit, not the low bit of a multiplicative hash: the
 * latter alternates with i and turns the randomized Hadamard transform into
 * a plain permutation (docs/codecs.md, "Tables").
 *
 * Codebooks: after a random rotation one coordinate of a unit vector in R^d
 * has the density f(x) ~ (1 - x^2)^((d - 3) / 2) on [-1, 1]. The optimal
 * scalar quantizer for it is found here, at create time, by Lloyd
 * iterations in double precision. Numerical integration is not needed:
 * with x = sin(t), the mass of [0, x] is the integral of cos^(d-2) over
 * [0, asin x], which the reduction formula gives in d/2 steps, and the
 * first moment has the closed form (1 - cos^(d-1)(t)) / (d - 1). Solving
 * only the positive half and mirroring it keeps the codebook exactly
 * symmetric. The solve is a pure function of (d, bits), so every process
 * (and the CUDA upload of these tables) sees the same floats; the unit
 * test checks the result against an independent Simpson integration and
 * against the design study's codebook (docs/codecs.md, "Expected quality").
 */
#include <math.h>
#include <stdlib.h>

#include "common/log_int.h"
#include "kernels/ref/plane_int.h"
#include "kernels/ref/tq_int.h"

/* Lloyd stops when no centroid moves by more than this many standard
 * deviations (1/sqrt(d)), far below float resolution of the result. */
#define KVD_LLOYD_TOL 1e-13
#define KVD_LLOYD_MAX_ITER 20000u

uint64_t kvd_ref_splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* One edge of a Lloyd cell on the positive half-line, x = sin(theta):
 * mass = integral of cos^n over [0, theta] (n = d - 2) and
 * tail = cos^(n+1)(theta), from which the first moment follows. */
typedef struct kvd_lloyd_edge {
    double mass;
    double tail;
} kvd_lloyd_edge_t;

static kvd_lloyd_edge_t kvd_lloyd_edge(unsigned n, double x)
{
    double theta = asin(x);
    double c = cos(theta), s = sin(theta);
    double cpow; /* cos^(k-1) for the current k */
    double integral;
    unsigned k;

    /* Reduction formula: I_k = cos^(k-1) sin / k + (k-1)/k I_(k-2). Every
     * term is non-negative, so the forward recurrence is stable. */
    if (n % 2 == 0) {
        integral = theta;
        cpow = c;
        k = 2;
    } else {
        integral = s;
        cpow = c * c;
        k = 3;
    }
    for (; k <= n; k += 2) {
        integral = cpow * s / k + (double)(k - 1) / k * integral;
        cpow *= c * c;
    }
    /* After the loop cpow = cos^(n+1). */
    kvd_lloyd_edge_t e = {integral, x >= 1.0 ? 0.0 : cpow};
    return e;
}

unsigned kvd_ref_lloyd_max_solve(unsigned dim, unsigned bits, double *centroid)
{
    unsigned half = 1u << (bits - 1);
    unsigned n = dim - 2;
    double sigma = 1.0 / sqrt((double)dim);
    double pos[KVD_TQ_MAX_LEVELS / 2];
    kvd_lloyd_edge_t edge[KVD_TQ_MAX_LEVELS / 2 + 1];
    unsigned iter;

    /* Start from an even spread over +-2.5 sigma; Lloyd is a contraction
     * here (log-concave density), so the start only affects the count. */
    for (unsigned i = 0; i < half; i++) {
        pos[i] = sigma * 2.5 * (i + 0.5) / half;
    }
    edge[0] = kvd_lloyd_edge(n, 0.0);
    edge[half] = kvd_lloyd_edge(n, 1.0);
    for (iter = 1; iter <= KVD_LLOYD_MAX_ITER; iter++) {
        double moved = 0.0;
        for (unsigned i = 1; i < half; i++) {
            edge[i] = kvd_lloyd_edge(n, 0.5 * (pos[i - 1] + pos[i]));
        }
        for (unsigned i = 0; i < half; i++) {
            double next = (edge[i].tail - edge[i + 1].tail) / (n + 1) /
                          (edge[i + 1].mass - edge[i].mass);
            moved = fmax(moved, fabs(next - pos[i]));
            pos[i] = next;
        }
        if (moved <= KVD_LLOYD_TOL * sigma) {
            break;
        }
    }
    for (unsigned i = 0; i < half; i++) {
        centroid[half + i] = pos[i];
        centroid[half - 1 - i] = -pos[i];
    }
    return iter;
}

/* Fills the TurboQuant part of `t` for fmt->head_dim in {64, 128, 256}. */
static void kvd_tq_tables_fill(kvd_codec_tables_t *t)
{
    unsigned dim = t->fmt.head_dim;
    uint64_t state = t->fmt.tq_seed;

    for (unsigned i = 0; i < dim; i++) {
        t->tq_sign[i] = (kvd_ref_splitmix64(&state) >> 63) ? -1.0f : 1.0f;
    }
    for (unsigned bits = 2; bits <= 4; bits++) {
        unsigned levels = 1u << bits;
        double c[KVD_TQ_MAX_LEVELS];
        kvd_ref_lloyd_max_solve(dim, bits, c);
        for (unsigned k = 0; k < levels; k++) {
            t->tq_centroid[bits - 2][k] = (float)c[k];
        }
        /* Midpoints in double, rounded once: the decision boundaries of
         * the nearest-centroid rule for the double codebook. */
        for (unsigned k = 0; k + 1 < levels; k++) {
            t->tq_bound[bits - 2][k] = (float)(0.5 * (c[k] + c[k + 1]));
        }
    }
}

kvd_status_t kvd_codec_tables_create(const kvd_object_format_t *fmt,
                                     kvd_codec_tables_t **tables_out)
{
    char why[160];

    if (tables_out == NULL) {
        KVD_LOG_ERROR("NULL tables_out");
        return KVD_ERR_INVALID;
    }
    kvd_status_t st = kvd_object_format_check(fmt, why, sizeof(why));
    if (st != KVD_OK) {
        KVD_LOG_ERROR("codec tables for a bad format: %s", why);
        return st;
    }
    kvd_codec_tables_t *t = calloc(1, sizeof(*t));
    if (t == NULL) {
        KVD_LOG_ERROR("no memory for codec tables");
        return KVD_ERR_NOMEM;
    }
    t->fmt = *fmt;
    /* Only TurboQuant reads the tables; the format check guarantees its
     * head_dim is 64, 128 or 256. Other formats get zeroed tables, which
     * keeps create cheap for them. */
    for (unsigned p = 0; p < fmt->num_planes; p++) {
        if (kvd_codec_is_tq(fmt->codec[p])) {
            kvd_tq_tables_fill(t);
            break;
        }
    }
    *tables_out = t;
    return KVD_OK;
}

void kvd_codec_tables_destroy(kvd_codec_tables_t *tables)
{
    free(tables);
}
