/*
 * Fuzz target for configuration text: the bytes go through the YAML loader,
 * then a table with one field of every type is applied and printed, and a
 * NUL-terminated copy goes through the size/duration parsers, every field
 * parser and the failpoint spec parser. Config files and KVDEPOT_* values
 * are operator input, but a daemon reads them before anything else, so a
 * crash, leak or hang here is a denial of service.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/failpoint_int.h"
#include "kvdepot/common.h"

/* libFuzzer's fixed entry point name. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); // NOLINT

typedef struct fuzz_settings {
    bool flag;
    int64_t count;
    uint64_t size_bytes;
    uint64_t timeout_ms;
    char name[KVD_CONFIG_STRING_MAX];
    int mode;
    char pairs[KVD_CONFIG_STRING_MAX];
    char list[KVD_CONFIG_STRING_MAX];
} fuzz_settings_t;

static const char *const modes[] = {"fast", "safe", NULL};

static const kvd_config_field_t fields[] = {
    {"fz.flag", "false", "flag", kvd_config_parse_bool,
     offsetof(fuzz_settings_t, flag), 0, 0, NULL},
    {"fz.count", "1", "count", kvd_config_parse_int,
     offsetof(fuzz_settings_t, count), -100, 100, NULL},
    {"fz.size", "1m", "size", kvd_config_parse_size,
     offsetof(fuzz_settings_t, size_bytes), 0, 0, NULL},
    {"fz.timeout", "1s", "timeout", kvd_config_parse_duration_ms,
     offsetof(fuzz_settings_t, timeout_ms), 1, 3600000, NULL},
    {"fz.name", "x", "name", kvd_config_parse_string,
     offsetof(fuzz_settings_t, name), 0, 0, NULL},
    {"fz.mode", "safe", "mode", kvd_config_parse_enum,
     offsetof(fuzz_settings_t, mode), 0, 0, modes},
    {"fz.pairs", "", "pairs", kvd_config_parse_pairs,
     offsetof(fuzz_settings_t, pairs), 0, 0, NULL},
    {"fz.list", "", "list", kvd_config_parse_list,
     offsetof(fuzz_settings_t, list), 0, 0, NULL},
};
#define NUM_FIELDS (sizeof(fields) / sizeof(fields[0]))

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static FILE *devnull;
    if (devnull == NULL) {
        /* Rejected input is logged; that is noise at fuzzing speed. */
        kvd_log_set_level(KVD_LOG_LEVEL_OFF);
        devnull = fopen("/dev/null", "w");
    }
    char err[256];
    fuzz_settings_t settings;

    kvd_config_t *config = NULL;
    if (kvd_config_create(&config) != KVD_OK) {
        return 0;
    }
    if (kvd_config_load_yaml(config, (const char *)data, size, err,
                             sizeof(err)) == KVD_OK) {
        (void)kvd_config_apply(config, fields, NUM_FIELDS, &settings, err,
                               sizeof(err));
        if (devnull != NULL) {
            (void)kvd_config_print(config, fields, NUM_FIELDS, devnull);
        }
    }

    char *text = malloc(size + 1);
    if (text == NULL) {
        kvd_config_destroy(config);
        return 0;
    }
    memcpy(text, data, size);
    text[size] = '\0';
    uint64_t v;
    (void)kvd_parse_size(text, &v);
    (void)kvd_parse_duration_ms(text, &v);
    for (size_t i = 0; i < NUM_FIELDS; i++) {
        (void)fields[i].parse(&fields[i], text,
                              (char *)&settings + fields[i].offset, err,
                              sizeof(err));
    }
    /* The same text as a call parameter, so apply sees it from the top. */
    if (kvd_config_set(config, "fz.size", text) == KVD_OK) {
        (void)kvd_config_apply(config, fields, NUM_FIELDS, &settings, err,
                               sizeof(err));
    }
    if (kvd_failpoint_set(text, err, sizeof(err)) == KVD_OK) {
        (void)kvd_failpoint_hit("nvme.write");
        kvd_failpoint_clear();
    }
    free(text);
    kvd_config_destroy(config);
    return 0;
}
