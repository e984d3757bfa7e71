/*
 * Internal helpers shared by the configuration files: config_parse.c (value
 * parsers) and config.c (storage, YAML, resolution).
 */
#ifndef KVD_COMMON_CONFIG_INT_H
#define KVD_COMMON_CONFIG_INT_H

#include <stddef.h>

/* Longest value quoted back in an error message. */
#define KVD_CONFIG_QUOTE_MAX 96

/* snprintf into a caller's error buffer; err may be NULL with err_len 0. */
__attribute__((format(printf, 3, 4))) void
kvd_config_err(char *err, size_t err_len, const char *fmt, ...);

#endif /* KVD_COMMON_CONFIG_INT_H */
