/*
 * Internal helpers shared by the configuration files: config_parse.c (value
 * parsers) and config.c (storage, YAML, resolution).
 */
#ifndef KVD_COMMON_CONFIG_INT_H
#define KVD_COMMON_CONFIG_INT_H

#include <stddef.h>

#include "kvdepot/common.h"

/* Longest joined key ("server.tenants"). */
#define KVD_CONFIG_KEY_MAX 256

/* Longest value quoted back in an error message. */
#define KVD_CONFIG_QUOTE_MAX 96

/* snprintf into a caller's error buffer; err may be NULL with err_len 0. */
__attribute__((format(printf, 3, 4))) void
kvd_config_err(char *err, size_t err_len, const char *fmt, ...);

/* For a program that knows every component its configuration may hold
 * (kvdepotd): fails with KVD_ERR_NOT_FOUND, naming the key, when a key set
 * by a file or a call parameter has a first dot-part outside `sections`
 * (NULL-terminated), e.g. a misspelt "clustr:" that every component's
 * table would let pass as another component's. */
kvd_status_t kvd_config_check_sections(const kvd_config_t *config,
                                       const char *const *sections, char *err,
                                       size_t err_len);

/* The name of `names` (n of them) closest to `key` by edit distance
 * (Levenshtein: insertions, deletions, substitutions), for "did you mean"
 * after an unknown setting; NULL when none is within a third of the
 * longer of the two (at least 2 edits), so an unrelated key suggests
 * nothing. Returns one of `names`. Thread: any. */
const char *kvd_config_closest(const char *key, const char *const *names,
                               size_t n);

#endif /* KVD_COMMON_CONFIG_INT_H */
