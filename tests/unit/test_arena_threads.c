/*
 * Host arena under concurrency (store/arena.h): four threads allocate and
 * free slots of two sizes, then of more sizes than there are class places,
 * tagging each slot they hold; no slot is handed to two owners, and no
 * slot, chunk or class place is left behind. Worker threads never call
 * cmocka asserts; they count failures that the test thread checks after
 * joining.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testarena_int.h"

#if defined(__SANITIZE_THREAD__)
#define TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_UNDER_TSAN 1
#endif
#endif
#ifdef TEST_UNDER_TSAN
#define THREAD_ITERATIONS 5000
#else
#define THREAD_ITERATIONS 50000
#endif
#define NUM_THREADS 4

/* ------------------------------------------------------------------------ */
/* Threads                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct thread_arg {
    kvd_arena_t *arena;
    const uint32_t *classes;
    uint32_t num_classes;
    uint32_t id;
    uint32_t failures; /* read by the test thread after join */
    uint32_t nospace;  /* NOSPACE answers: expected, not failures */
} thread_arg_t;

#define HELD_MAX 48

static void *thread_main(void *p)
{
    thread_arg_t *arg = p;
    uint32_t held[HELD_MAX];
    uint64_t tags[HELD_MAX];
    uint32_t n = 0;
    uint64_t rng = 0x9e3779b97f4a7c15ull * (arg->id + 1);
    for (uint32_t it = 0; it < THREAD_ITERATIONS; it++) {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        bool do_alloc = n == 0 || (n < HELD_MAX && (rng & 3) != 0 &&
                                   (rng >> 8) % HELD_MAX >= n / 2);
        if (do_alloc) {
            uint32_t slot;
            kvd_status_t st = kvd_arena_slot_alloc(
                arg->arena, arg->classes[(rng >> 4) % arg->num_classes], &slot);
            if (st == KVD_ERR_NOSPACE) {
                arg->nospace++;
                continue;
            }
            uint64_t *ptr = kvd_arena_slot_ptr(arg->arena, slot);
            if (st != KVD_OK || ptr == NULL) {
                arg->failures++;
                continue;
            }
            /* A slot handed to two owners would have its tag replaced. */
            tags[n] = (uint64_t)arg->id << 32 | it;
            *ptr = tags[n];
            held[n++] = slot;
        } else {
            uint32_t k = (uint32_t)((rng >> 16) % n);
            uint64_t *ptr = kvd_arena_slot_ptr(arg->arena, held[k]);
            if (ptr == NULL || *ptr != tags[k] ||
                kvd_arena_slot_free(arg->arena, held[k]) != KVD_OK) {
                arg->failures++;
            }
            held[k] = held[--n];
            tags[k] = tags[n];
        }
    }
    while (n > 0) {
        n--;
        uint64_t *ptr = kvd_arena_slot_ptr(arg->arena, held[n]);
        if (ptr == NULL || *ptr != tags[n] ||
            kvd_arena_slot_free(arg->arena, held[n]) != KVD_OK) {
            arg->failures++;
        }
    }
    return NULL;
}

/* Runs NUM_THREADS thread_main()s over `classes`, then checks that no
 * slot, chunk or class place leaked. */
static void run_threads(kvd_arena_t *arena, const uint32_t *classes,
                        uint32_t num_classes)
{
    pthread_t th[NUM_THREADS];
    thread_arg_t args[NUM_THREADS];
    for (uint32_t i = 0; i < NUM_THREADS; i++) {
        args[i] = (thread_arg_t){.arena = arena,
                                 .classes = classes,
                                 .num_classes = num_classes,
                                 .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, thread_main, &args[i]),
                         0);
    }
    for (uint32_t i = 0; i < NUM_THREADS; i++) {
        assert_int_equal(pthread_join(th[i], NULL), 0);
        assert_int_equal(args[i].failures, 0);
    }
    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_int_equal(st.bytes_used, 0);
    assert_int_equal(st.chunks_free, st.chunks_total);
    assert_int_equal(st.num_classes, 0);
}

static void test_threads(void **state)
{
    (void)state;
    /* Small enough that the four threads (up to 48 slots each) contend for
     * chunks and hit NOSPACE, so carve/release races are exercised. */
    kvd_arena_t *arena = test_arena(8 * MIB, MIB);
    uint32_t cls[2];
    assert_int_equal(kvd_arena_class_register(arena, 16 * 1024, &cls[0]),
                     KVD_OK);
    assert_int_equal(kvd_arena_class_register(arena, 200 * 1024, &cls[1]),
                     KVD_OK);
    run_threads(arena, cls, 2);
    kvd_arena_destroy(arena);
}

/* 96 sizes over 160 chunks: the four threads contend for class places as
 * well as chunks, so places are taken and handed back concurrently. */
static void test_threads_many_sizes(void **state)
{
    (void)state;
    const uint64_t chunk = 512 * 1024;
    kvd_arena_t *arena = test_arena(160 * chunk, chunk);
    uint32_t cls[96];
    for (uint32_t i = 0; i < 96; i++) {
        assert_int_equal(
            kvd_arena_class_register(arena, (i + 1) * 4096ull, &cls[i]),
            KVD_OK);
    }
    kvd_log_level_t saved = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_ERROR); /* the places-full warning */
    run_threads(arena, cls, 96);
    /* Whether the threads ran out of places depends on how the scheduler
     * interleaved them (on a loaded machine one thread at a time holds at
     * most 48 sizes); holding 64 sizes at once always does. */
    uint32_t held[KVD_ARENA_CLASSES_MAX + 1];
    for (uint32_t i = 0; i < KVD_ARENA_CLASSES_MAX; i++) {
        assert_int_equal(kvd_arena_slot_alloc(arena, cls[i], &held[i]), KVD_OK);
    }
    assert_int_equal(kvd_arena_slot_alloc(arena, cls[KVD_ARENA_CLASSES_MAX],
                                          &held[KVD_ARENA_CLASSES_MAX]),
                     KVD_ERR_NOSPACE);
    for (uint32_t i = 0; i < KVD_ARENA_CLASSES_MAX; i++) {
        assert_int_equal(kvd_arena_slot_free(arena, held[i]), KVD_OK);
    }
    kvd_log_set_level(saved);
    kvd_arena_stats_t st;
    assert_int_equal(kvd_arena_stats(arena, &st), KVD_OK);
    assert_true(st.class_places_full > 0);
    assert_int_equal(st.num_classes, 0);
    kvd_arena_destroy(arena);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_threads),
        cmocka_unit_test(test_threads_many_sizes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
