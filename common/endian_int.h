/*
 * Little-endian loads and stores of fixed-size integers into byte buffers,
 * for the project's own binary formats (index records, the shared-memory
 * hand-off). Byte by byte, so alignment and host order never matter.
 */
#ifndef KVD_COMMON_ENDIAN_INT_H
#define KVD_COMMON_ENDIAN_INT_H

#include <stdint.h>

static inline void kvd_put_le16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void kvd_put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static inline void kvd_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        p[i] = (uint8_t)(v >> (8 * i));
    }
}

static inline uint16_t kvd_get_le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static inline uint32_t kvd_get_le32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

static inline uint64_t kvd_get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) {
        v = (v << 8) | p[i];
    }
    return v;
}

#endif /* KVD_COMMON_ENDIAN_INT_H */
