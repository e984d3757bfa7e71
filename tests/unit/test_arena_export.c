/*
 * Host arena export and mapping (store/arena.h): the sealed memfd an
 * arena exports is mapped by a forked child that checks the parent's
 * bytes and writes its own; a mapping in this process outlives the arena;
 * bad exports (no fd, sizes beyond the file, an unsealed memfd) and bad
 * arguments are refused.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <cmocka.h>

#include "kvd_testarena_int.h"

/* ------------------------------------------------------------------------ */
/* Export and mapping                                                       */
/* ------------------------------------------------------------------------ */

/* Runs in the forked child: checks the parent's bytes and writes its own.
 * Returns the exit code (0 = fine). */
static int child_main(const kvd_arena_export_t *exp, uint64_t parent_off,
                      uint64_t child_off, uint64_t len)
{
    kvd_arena_mapping_t *m = NULL;
    if (kvd_arena_mapping_open(exp, &m) != KVD_OK) {
        return 1;
    }
    int rc = 0;
    uint8_t *in = kvd_arena_mapping_ptr(m, parent_off, len);
    uint8_t *out = kvd_arena_mapping_ptr(m, child_off, len);
    if (in == NULL || out == NULL) {
        rc = 2;
    } else if (!check_pattern(in, len, 1)) {
        rc = 3;
    } else {
        fill_pattern(out, len, 2);
    }
    kvd_arena_mapping_close(m);
    return rc;
}

static void test_export_fork(void **state)
{
    (void)state;
    kvd_arena_t *arena = test_arena(8 * MIB, MIB);
    uint32_t cls, ps, cs;
    const uint64_t len = 2 * MIB / 4;
    assert_int_equal(kvd_arena_class_register(arena, len, &cls), KVD_OK);
    assert_int_equal(kvd_arena_slot_alloc(arena, cls, &ps), KVD_OK);
    assert_int_equal(kvd_arena_slot_alloc(arena, cls, &cs), KVD_OK);
    fill_pattern(kvd_arena_slot_ptr(arena, ps), len, 1);
    memset(kvd_arena_slot_ptr(arena, cs), 0, len);

    kvd_arena_export_t exp;
    assert_int_equal(kvd_arena_export(arena, &exp), KVD_OK);
    assert_true(exp.fd >= 0);
    assert_int_equal(exp.size_bytes, 8 * MIB);
    assert_int_equal(exp.chunk_bytes, MIB);

    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        _exit(child_main(&exp, kvd_arena_slot_offset(arena, ps),
                         kvd_arena_slot_offset(arena, cs), len));
    }
    int wstatus = 0;
    assert_int_equal(waitpid(pid, &wstatus, 0), pid);
    assert_true(WIFEXITED(wstatus));
    assert_int_equal(WEXITSTATUS(wstatus), 0);
    assert_true(check_pattern(kvd_arena_slot_ptr(arena, cs), len, 2));

    /* A mapping in this process sees the same bytes, and outlives the
     * arena: the memory lives until its last mapping goes. */
    kvd_arena_mapping_t *m = NULL;
    assert_int_equal(kvd_arena_mapping_open(&exp, &m), KVD_OK);
    assert_int_equal(close(exp.fd), 0);
    assert_int_equal(kvd_arena_mapping_size(m), 8 * MIB);
    uint64_t off = kvd_arena_slot_offset(arena, cs);
    kvd_arena_destroy(arena);
    assert_true(check_pattern(kvd_arena_mapping_ptr(m, off, len), len, 2));
    assert_ptr_equal(kvd_arena_mapping_ptr(m, 0, 0), kvd_arena_mapping_base(m));
    assert_null(kvd_arena_mapping_ptr(m, 8 * MIB, 0));
    assert_null(kvd_arena_mapping_ptr(m, 8 * MIB - 4096, 4097));
    assert_null(kvd_arena_mapping_ptr(m, UINT64_MAX, 2));
    assert_null(kvd_arena_mapping_ptr(NULL, 0, 1));
    kvd_arena_mapping_close(m);
    kvd_arena_mapping_close(NULL);
}

static void test_mapping_invalid(void **state)
{
    (void)state;
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    kvd_arena_t *arena = test_arena(4 * MIB, MIB);
    kvd_arena_export_t exp, bad;
    kvd_arena_mapping_t *m = NULL;
    assert_int_equal(kvd_arena_export(arena, &exp), KVD_OK);
    assert_int_equal(kvd_arena_export(NULL, &exp), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_export(arena, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_mapping_open(NULL, &m), KVD_ERR_INVALID);
    assert_int_equal(kvd_arena_mapping_open(&exp, NULL), KVD_ERR_INVALID);

    bad = exp;
    bad.fd = -1;
    assert_int_equal(kvd_arena_mapping_open(&bad, &m), KVD_ERR_INVALID);
    bad = exp;
    bad.map_bytes = exp.map_bytes * 2; /* longer than the file */
    bad.size_bytes = bad.map_bytes;
    assert_int_equal(kvd_arena_mapping_open(&bad, &m), KVD_ERR_INVALID);
    bad = exp;
    bad.size_bytes = exp.size_bytes + 4096; /* beyond map_bytes */
    assert_int_equal(kvd_arena_mapping_open(&bad, &m), KVD_ERR_INVALID);

    /* An unsealed memfd could be truncated under the mapping: refused. */
    int loose = memfd_create("loose", MFD_CLOEXEC);
    assert_true(loose >= 0);
    assert_int_equal(ftruncate(loose, (off_t)exp.map_bytes), 0);
    bad = exp;
    bad.fd = loose;
    assert_int_equal(kvd_arena_mapping_open(&bad, &m), KVD_ERR_INVALID);
    close(loose);
    assert_null(m);
    close(exp.fd);
    kvd_arena_destroy(arena);
    kvd_log_set_level(saved);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_export_fork),
        cmocka_unit_test(test_mapping_invalid),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
