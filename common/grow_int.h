/*
 * Growable arrays: the one realloc policy of the library's small
 * containers (request tables, report queues, backlogs). Header-only.
 */
#ifndef KVD_COMMON_GROW_INT_H
#define KVD_COMMON_GROW_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

/*
 * Reallocates *p to a capacity of exactly `c` elements of `elem` bytes.
 * Returns false, with *p and *cap untouched, when the size overflows or
 * realloc fails.
 */
static inline bool kvd_grow_to(void **p, size_t *cap, size_t c, size_t elem)
{
    if (elem != 0 && c > SIZE_MAX / elem) {
        return false;
    }
    void *q = realloc(*p, c * elem);
    if (q == NULL) {
        return false;
    }
    *p = q;
    *cap = c;
    return true;
}

/*
 * Makes room for `need` elements of `elem` bytes in *p (capacity *cap),
 * doubling from 16. Returns false, with *p and *cap untouched, when the
 * size overflows or realloc fails.
 */
static inline bool kvd_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap) {
        return true;
    }
    size_t c = *cap < 16 ? 16 : *cap;
    while (c < need) {
        if (c > SIZE_MAX / 2) {
            return false;
        }
        c *= 2;
    }
    return kvd_grow_to(p, cap, c, elem);
}

#endif /* KVD_COMMON_GROW_INT_H */
