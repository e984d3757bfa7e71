/*
 * Embedded stores for the integration tests of the store's tiers (flush,
 * tiers, power cuts): one base of small settings (an 8 MiB arena of 2 MiB
 * chunks without huge pages or prefaulting, a 32 MiB write-back disk tier
 * admitting everything, a 1 s sync interval, 2 s reserve timeout) that each
 * test adjusts before opening. Header-only (static inline); the including
 * test has its standard headers included first.
 */
#ifndef KVD_TESTS_TESTSTORE_INT_H
#define KVD_TESTS_TESTSTORE_INT_H

#include <stdio.h>

#include "kvdepot/store.h"

/* A configuration with the base settings and store.disk_path = `disk`;
 * NULL when it cannot be made. The caller sets more and hands it to
 * kvd_test_store_open_config(). */
static inline kvd_config_t *kvd_test_store_config(const char *disk)
{
    kvd_config_t *cfg = NULL;
    if (kvd_config_create(&cfg) != KVD_OK) {
        return NULL;
    }
    static const char *const base[] = {
        "store.arena_size",      "8m",  "store.arena_chunk",     "2m",
        "store.arena_hugepages", "off", "store.arena_prefault",  "false",
        "store.disk_size",       "32m", "store.disk_write",      "back",
        "store.sync_interval",   "1s",  "store.reserve_timeout", "2s",
        "store.disk_admission",  "all"};
    for (size_t i = 0; i < sizeof base / sizeof base[0]; i += 2) {
        (void)kvd_config_set(cfg, base[i], base[i + 1]);
    }
    (void)kvd_config_set(cfg, "store.disk_path", disk);
    return cfg;
}

/* Opens a store with `cfg` (which it destroys; NULL gives KVD_ERR_NOMEM),
 * printing why when it cannot. */
static inline kvd_status_t kvd_test_store_open_config(kvd_config_t *cfg,
                                                      kvd_store_t **st)
{
    if (cfg == NULL) {
        return KVD_ERR_NOMEM;
    }
    char err[256] = "";
    kvd_status_t s = kvd_store_open(cfg, st, err, sizeof err);
    if (s != KVD_OK) {
        fprintf(stderr, "kvd_store_open: %s (%s)\n", kvd_status_str(s), err);
    }
    kvd_config_destroy(cfg);
    return s;
}

#endif /* KVD_TESTS_TESTSTORE_INT_H */
