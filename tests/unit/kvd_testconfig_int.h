/*
 * Fixtures shared by the configuration tests (test_config_*.c): a sample
 * settings struct with a field for each parser, its table under the
 * prefix "tst", the environment names that table reads, a log sink that
 * keeps the last message, a setup that clears both, and config objects
 * made and loaded from YAML text. Header-only (static inline): each test
 * is one executable built from one source file; the including test has
 * cmocka.h included first.
 */
#ifndef KVD_TESTS_TESTCONFIG_INT_H
#define KVD_TESTS_TESTCONFIG_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/config_int.h"
#include "kvdepot/common.h"

typedef struct sample {
    bool flag;
    int64_t count;
    uint64_t arena_bytes;
    uint64_t timeout_ms;
    char name[KVD_CONFIG_STRING_MAX];
    int mode;
} sample_t;

static const char *const modes[] = {"fast", "safe", "paranoid", NULL};

static const kvd_config_field_t table[] = {
    {"tst.flag", "false", "a flag", kvd_config_parse_bool,
     offsetof(sample_t, flag), 0, 0, NULL},
    {"tst.count", "7", "a count", kvd_config_parse_int,
     offsetof(sample_t, count), -10, 100, NULL},
    {"tst.store.arena_size", "1g", "arena bytes", kvd_config_parse_size,
     offsetof(sample_t, arena_bytes), 0, 0, NULL},
    {"tst.timeout", "5s", "a timeout", kvd_config_parse_duration_ms,
     offsetof(sample_t, timeout_ms), 0, 0, NULL},
    {"tst.name", "kvd", "a name", kvd_config_parse_string,
     offsetof(sample_t, name), 0, 0, NULL},
    {"tst.mode", "safe", "a mode", kvd_config_parse_enum,
     offsetof(sample_t, mode), 0, 0, modes},
};
#define NUM_FIELDS (sizeof(table) / sizeof(table[0]))

static const char *const env_names[] = {
    "KVDEPOT_TST_FLAG",    "KVDEPOT_TST_COUNT", "KVDEPOT_TST_STORE_ARENA_SIZE",
    "KVDEPOT_TST_TIMEOUT", "KVDEPOT_TST_NAME",  "KVDEPOT_TST_MODE",
};

/* Log capture: keeps the last message so tests can check what was logged
 * (and keeps expected errors off stderr). */
static char last_log[2048];
static int num_logs;

static inline void capture_sink(void *arg, kvd_log_level_t level,
                                const char *file, int line, const char *msg)
{
    (void)arg;
    (void)level;
    (void)file;
    (void)line;
    snprintf(last_log, sizeof(last_log), "%s", msg);
    num_logs++;
}

static inline int setup(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(env_names) / sizeof(env_names[0]); i++) {
        unsetenv(env_names[i]);
    }
    last_log[0] = '\0';
    num_logs = 0;
    return 0;
}

static inline kvd_config_t *config_new(void)
{
    kvd_config_t *config = NULL;
    assert_int_equal(kvd_config_create(&config), KVD_OK);
    assert_non_null(config);
    return config;
}

static inline void load(kvd_config_t *config, const char *yaml)
{
    char err[256] = "";
    kvd_status_t st =
        kvd_config_load_yaml(config, yaml, strlen(yaml), err, sizeof(err));
    if (st != KVD_OK) {
        fail_msg("load failed: %s", err);
    }
}

static inline kvd_status_t apply(const kvd_config_t *config, sample_t *s,
                                 char *err, size_t err_len)
{
    memset(s, 0xA5, sizeof(*s));
    return kvd_config_apply(config, table, NUM_FIELDS, s, err, err_len);
}

#endif /* KVD_TESTS_TESTCONFIG_INT_H */
