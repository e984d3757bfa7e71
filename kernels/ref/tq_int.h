/*
 * TurboQuant internals shared by tables.c (sign vector, Lloyd-Max
 * codebooks), tq.c (the codec) and the unit tests, which check each piece
 * on its own: the Walsh-Hadamard transform, the BP32 bit-plane packing, the
 * fixed-order norm and the codebook solver. Everything here is part of the
 * CPU/GPU parity contract of docs/codecs.md: the CUDA kernels must perform
 * the same float operations in the same order.
 */
#ifndef KVD_KERNELS_REF_TQ_INT_H
#define KVD_KERNELS_REF_TQ_INT_H

#include <stdint.h>

#include "kernels/ref/ref.h"

/* Lane count of the norm reduction tree and of a BP32 group: one CUDA warp
 * holds one group of 32 coordinates, lane l holding coordinate g*32 + l. */
#define KVD_TQ_LANES 32u

/* Next output of splitmix64 (Steele, Lea, Flood 2014) advancing *state. */
uint64_t kvd_ref_splitmix64(uint64_t *state);

/*
 * Lloyd-Max codebook for one coordinate of a uniformly random unit vector
 * in R^dim (density proportional to (1 - x^2)^((dim - 3) / 2) on [-1, 1]),
 * with 2^bits levels, solved in double precision. Writes the 2^bits
 * centroids in ascending order; the codebook is exactly symmetric. dim in
 * 4..4096 and even, bits in 1..4. Returns the number of Lloyd iterations
 * used (deterministic for given arguments).
 */
unsigned kvd_ref_lloyd_max_solve(unsigned dim, unsigned bits, double *centroid);

/* Squared norm of x[0..dim) summed in the fixed tree: per-lane partial sums
 * over e in increasing order for i = e*32 + lane, then a xor butterfly over
 * lanes with offsets 16, 8, 4, 2, 1. dim is a multiple of 32. */
float kvd_ref_tq_norm_sq(const float *x, unsigned dim);

/* 1/sqrt(dim) as the float both implementations use: exact for even powers
 * of two, fp32(M_SQRT1_2) * 2^-((log2 dim - 1) / 2) for odd ones. dim is a
 * power of two. */
float kvd_ref_tq_inv_sqrt_dim(unsigned dim);

/* Unnormalized fast Walsh-Hadamard transform in place, stages h = 1, 2, 4,
 * ..., dim/2, butterfly (a, b) -> (a + b, a - b). Applying it twice
 * multiplies by dim. dim is a power of two. */
void kvd_ref_fwht(float *v, unsigned dim);

/* BP32 bit planes (docs/codecs.md): dim codes of `bits` bits <->
 * dim*bits/8 bytes, word W[g*bits + k] (little-endian u32) having bit l =
 * bit k of code[g*32 + l]. dim is a multiple of 32; pack ignores code bits
 * above `bits`. */
void kvd_ref_bp32_pack(const uint8_t *code, unsigned dim, unsigned bits,
                       uint8_t *out);
void kvd_ref_bp32_unpack(const uint8_t *in, unsigned dim, unsigned bits,
                         uint8_t *code);

#endif /* KVD_KERNELS_REF_TQ_INT_H */
