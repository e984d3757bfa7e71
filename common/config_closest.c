/*
 * "Did you mean": the known setting nearest an unknown one by edit
 * distance (kvd_config_closest, common/config_int.h), so a misspelt key
 * in a file or a --set is answered with the key that was meant. Kept
 * apart from config.c, which stores and resolves settings.
 */
#include <stdint.h>
#include <string.h>

#include "common/config_int.h"

/* Edit distance of a and b, or SIZE_MAX when either is longer than a key
 * may be (two rows of the classic dynamic programme). */
static size_t config_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > KVD_CONFIG_KEY_MAX || lb > KVD_CONFIG_KEY_MAX) {
        return SIZE_MAX;
    }
    size_t prev[KVD_CONFIG_KEY_MAX + 1], cur[KVD_CONFIG_KEY_MAX + 1];
    for (size_t j = 0; j <= lb; j++) {
        prev[j] = j;
    }
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            size_t best = sub < del ? sub : del;
            cur[j] = best < ins ? best : ins;
        }
        memcpy(prev, cur, (lb + 1) * sizeof prev[0]);
    }
    return prev[lb];
}

const char *kvd_config_closest(const char *key, const char *const *names,
                               size_t n)
{
    const char *best = NULL;
    size_t best_d = SIZE_MAX;
    if (key == NULL || names == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (names[i] == NULL) {
            continue;
        }
        size_t d = config_distance(key, names[i]);
        size_t longer =
            strlen(key) > strlen(names[i]) ? strlen(key) : strlen(names[i]);
        size_t limit = longer / 3 > 2 ? longer / 3 : 2;
        if (d <= limit && d < best_d) {
            best = names[i];
            best_d = d;
        }
    }
    return best;
}
