/*
 * A copy into memory that will not be read soon (an arena slot filled
 * from the network), with non-temporal stores: the destination's cache
 * lines are neither read first nor left in the cache. memcpy reads every
 * destination line before writing it (its own non-temporal path starts
 * only at sizes near the last-level cache), which for 2 MiB objects
 * landing in cold arena memory costs as much as the copy itself:
 * bench_cluster's fetch went from 3.0-3.6 to 3.4-4.6 GiB/s with it
 * (docs/performance.md). Baseline x86-64 (SSE2) stores; memcpy elsewhere.
 *
 * The bytes are in memory in order with every later store once the call
 * returns (it ends with a store fence), so publishing the destination
 * afterwards (a commit under a lock) is safe as with memcpy.
 */
#ifndef KVD_COMMON_COPY_INT_H
#define KVD_COMMON_COPY_INT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

static inline void kvd_copy_nt(void *dst, const void *src, size_t len)
{
#if defined(__x86_64__)
    uint8_t *d = dst;
    const uint8_t *s = src;
    size_t head = (16u - ((uintptr_t)d & 15u)) & 15u;
    if (head > len) {
        head = len;
    }
    memcpy(d, s, head);
    size_t i = head;
    for (; i + 64 <= len; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)(s + i));
        __m128i b =
            _mm_loadu_si128((const __m128i *)(const void *)(s + i + 16));
        __m128i c =
            _mm_loadu_si128((const __m128i *)(const void *)(s + i + 32));
        __m128i e =
            _mm_loadu_si128((const __m128i *)(const void *)(s + i + 48));
        _mm_stream_si128((__m128i *)(void *)(d + i), a);
        _mm_stream_si128((__m128i *)(void *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + i + 48), e);
    }
    memcpy(d + i, s + i, len - i);
    _mm_sfence();
#else
    memcpy(dst, src, len);
#endif
}

#endif /* KVD_COMMON_COPY_INT_H */
