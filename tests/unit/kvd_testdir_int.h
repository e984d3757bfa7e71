/*
 * Temporary directories for tests that need real files (NVMe tier, store,
 * index): made under $TMPDIR (default /tmp) with mkdtemp, removed with
 * everything in them. Header-only (static inline); the including test has
 * cmocka.h included first.
 */
#ifndef KVD_TESTS_TESTDIR_INT_H
#define KVD_TESTS_TESTDIR_INT_H

#include <stdio.h>
#include <stdlib.h>

typedef struct kvd_test_dir {
    char path[200];
} kvd_test_dir_t;

/* Makes a fresh directory named <TMPDIR>/kvd_test_<tag>_XXXXXX. */
static inline void kvd_test_dir_make(kvd_test_dir_t *d, const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    snprintf(d->path, sizeof d->path, "%s/kvd_test_%s_XXXXXX",
             tmp != NULL && tmp[0] != '\0' ? tmp : "/tmp", tag);
    assert_non_null(mkdtemp(d->path));
}

/* Removes the directory and everything in it. */
static inline void kvd_test_dir_remove(const kvd_test_dir_t *d)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d->path);
    assert_int_equal(system(cmd), 0);
}

#endif /* KVD_TESTS_TESTDIR_INT_H */
