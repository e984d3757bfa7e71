/*
 * Host arena failure injection (store/arena.h): every failpoint of
 * creation, export and mapping returns its own error with nothing leaked
 * (ASan for memory, /proc/self/fd for descriptors); in auto mode a failing
 * hugetlb attempt falls back to ordinary memory, while "on" reports it to
 * the caller.
 */
#include <dirent.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>

#include <cmocka.h>

#include "kvd_testarena_int.h"

static int count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    while (readdir(d) != NULL) {
        n++;
    }
    closedir(d);
    return n;
}

/* Whether a hugetlb memfd can be created and sized here (a pool is not
 * needed for that; mmap is what reserves pages). Failpoints numbered @1
 * after memfd_create only hit the hugetlb attempt when this holds. */
static bool hugetlbfs_usable(void)
{
    int fd = memfd_create("probe", MFD_CLOEXEC | MFD_HUGETLB);
    if (fd < 0) {
        return false;
    }
    bool ok = ftruncate(fd, (off_t)(2 * MIB)) == 0;
    close(fd);
    return ok;
}

/* ------------------------------------------------------------------------ */
/* Failpoints                                                               */
/* ------------------------------------------------------------------------ */

static void test_failpoints(void **state)
{
    (void)state;
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    int fds_before = count_open_fds();
    static const struct {
        const char *spec;
        kvd_status_t want;
    } cases[] = {
        {"arena.alloc=ENOMEM", KVD_ERR_NOMEM},
        {"arena.alloc=ENOMEM@2", KVD_ERR_NOMEM}, /* metadata */
        {"arena.memfd=EIO", KVD_ERR_IO},
        {"arena.memfd=24", KVD_ERR_IO}, /* EMFILE: no mapping of its own */
        {"arena.ftruncate=ENOSPC", KVD_ERR_NOSPACE},
        {"arena.seal=EPERM", KVD_ERR_AUTH},
        {"arena.mmap=ENOMEM", KVD_ERR_NOMEM},
        {"arena.prefault=ENOMEM", KVD_ERR_NOMEM},
        {"arena.prefault=EFAULT", KVD_ERR_INVALID},
    };
    for (int mode = KVD_ARENA_HUGEPAGES_AUTO; mode <= KVD_ARENA_HUGEPAGES_OFF;
         mode++) {
        if (mode == KVD_ARENA_HUGEPAGES_ON) {
            continue;
        }
        for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
            kvd_arena_config_t cfg = test_config(8 * MIB, MIB, mode, true);
            kvd_arena_t *arena = NULL;
            arm(cases[i].spec);
            kvd_status_t st = kvd_arena_create(&cfg, &arena);
            kvd_failpoint_clear();
            if (st != cases[i].want) {
                print_error("mode %d spec %s: got %s\n", mode, cases[i].spec,
                            kvd_status_str(st));
            }
            assert_int_equal(st, cases[i].want);
            assert_null(arena);
        }
    }

    /* auto: a failing hugetlb attempt falls back to ordinary memory. */
    static const char *const fallbacks[] = {
        "arena.memfd=EINVAL@1", "arena.ftruncate=EINVAL@1",
        "arena.seal=EINVAL@1", "arena.mmap=ENOMEM@1"};
    bool hugetlbfs = hugetlbfs_usable();
    size_t num_fallbacks = hugetlbfs ? 4 : 1;
    for (size_t i = 0; i < num_fallbacks; i++) {
        kvd_arena_config_t cfg =
            test_config(8 * MIB, MIB, KVD_ARENA_HUGEPAGES_AUTO, false);
        kvd_arena_t *arena = NULL;
        arm(fallbacks[i]);
        assert_int_equal(kvd_arena_create(&cfg, &arena), KVD_OK);
        kvd_failpoint_clear();
        kvd_arena_info_t info;
        assert_int_equal(kvd_arena_query(arena, &info), KVD_OK);
        assert_int_not_equal(info.backing, KVD_ARENA_BACKING_HUGETLB);
        kvd_arena_destroy(arena);
    }
    /* on: the same failure is the caller's error, never a silent fallback;
     * EINVAL from memfd_create means no hugetlbfs at all. */
    kvd_arena_config_t on_cfg =
        test_config(8 * MIB, MIB, KVD_ARENA_HUGEPAGES_ON, false);
    kvd_arena_t *none = NULL;
    arm("arena.memfd=EINVAL");
    assert_int_equal(kvd_arena_create(&on_cfg, &none), KVD_ERR_UNSUPPORTED);
    if (hugetlbfs) {
        arm("arena.mmap=ENOMEM");
        assert_int_equal(kvd_arena_create(&on_cfg, &none), KVD_ERR_NOMEM);
    }
    kvd_failpoint_clear();
    assert_null(none);

    /* Export and mapping. */
    kvd_arena_t *arena = test_arena(4 * MIB, MIB);
    kvd_arena_export_t exp;
    kvd_arena_mapping_t *m = NULL;
    arm("arena.dup=24"); /* EMFILE */
    assert_int_equal(kvd_arena_export(arena, &exp), KVD_ERR_IO);
    kvd_failpoint_clear();
    assert_int_equal(kvd_arena_export(arena, &exp), KVD_OK);
    arm("arena.map=ENOMEM");
    assert_int_equal(kvd_arena_mapping_open(&exp, &m), KVD_ERR_NOMEM);
    arm("arena.alloc=ENOMEM");
    assert_int_equal(kvd_arena_mapping_open(&exp, &m), KVD_ERR_NOMEM);
    kvd_failpoint_clear();
    assert_null(m);
    close(exp.fd);
    kvd_arena_destroy(arena);

    assert_int_equal(count_open_fds(), fds_before);
    kvd_log_set_level(saved);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_failpoints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
