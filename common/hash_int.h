/*
 * XXH3-64 over bytes that arrive in pieces (implemented in common/hash.c,
 * with kvd_xxh3_64's AVX2/AVX-512 dispatch): the digest of the pieces fed
 * in order equals kvd_xxh3_64 of their concatenation. The cluster data
 * plane hashes each part of an object while it is still in the cache.
 *
 * Threading: one stream per thread at a time.
 */
#ifndef KVD_COMMON_HASH_INT_H
#define KVD_COMMON_HASH_INT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_xxh3_stream kvd_xxh3_stream_t;

/* A stream over no bytes yet; NULL when out of memory. */
kvd_xxh3_stream_t *kvd_xxh3_stream_new(void);

void kvd_xxh3_stream_update(kvd_xxh3_stream_t *s, const void *data, size_t len);

/* XXH3-64 of every byte fed so far (the stream can go on). */
uint64_t kvd_xxh3_stream_digest(const kvd_xxh3_stream_t *s);

/* NULL is accepted. */
void kvd_xxh3_stream_free(kvd_xxh3_stream_t *s);

#ifdef __cplusplus
}
#endif

#endif /* KVD_COMMON_HASH_INT_H */
