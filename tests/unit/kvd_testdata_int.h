/*
 * Test data shared by the kernel tests: a seeded splitmix64 generator,
 * uniform and Gaussian draws, and the per-channel model of key-like KV data
 * (docs/codecs.md, "Expected quality": key-like). One definition, so every
 * quality gate runs on the same distribution. Header-only (static inline):
 * each test is one executable built from one source file.
 */
#ifndef KVD_TESTS_TESTDATA_INT_H
#define KVD_TESTS_TESTDATA_INT_H

#include <math.h>
#include <stdint.h>

static inline uint64_t kvd_test_rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [0, 1) with 53 random bits. */
static inline double kvd_test_uniform01(uint64_t *s)
{
    return (double)(kvd_test_rng(s) >> 11) * 0x1.0p-53;
}

/* N(0, 1) by Box-Muller. */
static inline double kvd_test_gauss(uint64_t *s)
{
    double u1 = kvd_test_uniform01(s), u2 = kvd_test_uniform01(s);
    if (u1 < 1e-300) {
        u1 = 1e-300;
    }
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

/*
 * Per-channel standard deviation and offset of `dim` channels: element c of
 * a vector is off[c] + std[c] * N(0, 1). Plain (key_like == 0): std 1,
 * offset 0. Key-like: std e^{0.5 N(0,1)}, offsets N(0, 2^2), and four
 * distinct outlier channels (dim >= 4) scaled by x8..15 — distinct, since
 * drawing one twice would square its factor into a channel the model does
 * not have.
 */
static inline void kvd_test_channel_model(int key_like, unsigned dim,
                                          uint64_t *s, double *std, double *off)
{
    for (unsigned c = 0; c < dim; c++) {
        std[c] = key_like ? exp(0.5 * kvd_test_gauss(s)) : 1.0;
        off[c] = key_like ? 2.0 * kvd_test_gauss(s) : 0.0;
    }
    /* A negative std marks a channel already picked. */
    for (unsigned k = 0; key_like && k < 4 && k < dim;) {
        unsigned c = (unsigned)(kvd_test_rng(s) % dim);
        if (std[c] <= 0) {
            continue;
        }
        std[c] *= -(8.0 + 7.0 * kvd_test_uniform01(s));
        k++;
    }
    for (unsigned c = 0; c < dim; c++) {
        std[c] = fabs(std[c]);
    }
}

#endif /* KVD_TESTS_TESTDATA_INT_H */
