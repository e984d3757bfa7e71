/*
 * Monotonic time helpers (common/time_int.h): the clock used, deadlines,
 * remaining time as poll() wants it, timespec conversion.
 *
 * The helpers are static inline functions around clock_gettime(). To test
 * rounding and saturation exactly, this file routes their clock_gettime()
 * through a stub: <time.h> is included first, then clock_gettime is
 * #defined to the stub before time_int.h is read. The stub records which
 * clock was asked for and returns either the real time or a frozen value.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <cmocka.h>

static bool clock_frozen;
static uint64_t clock_frozen_ns;
static clockid_t clock_last_id = (clockid_t)-1;

static int test_clock_gettime(clockid_t id, struct timespec *ts)
{
    clock_last_id = id;
    if (!clock_frozen) {
        return clock_gettime(id, ts);
    }
    ts->tv_sec = (time_t)(clock_frozen_ns / 1000000000ull);
    ts->tv_nsec = (long)(clock_frozen_ns % 1000000000ull);
    return 0;
}

/* Lower case on purpose: it replaces the libc name inside time_int.h. */
/* NOLINTNEXTLINE(readability-identifier-naming) */
#define clock_gettime test_clock_gettime
#include "common/time_int.h"
#undef clock_gettime

static void freeze_clock(uint64_t now_ns)
{
    clock_frozen = true;
    clock_frozen_ns = now_ns;
}

static int thaw_clock(void **state)
{
    (void)state;
    clock_frozen = false;
    return 0;
}

static void test_now_is_monotonic_and_non_decreasing(void **state)
{
    (void)state;
    uint64_t prev = kvd_time_now_ns();
    assert_int_equal(clock_last_id, CLOCK_MONOTONIC);
    for (int i = 0; i < 200000; i++) {
        uint64_t now = kvd_time_now_ns();
        assert_true(now >= prev);
        prev = now;
    }
    uint64_t ms = kvd_time_now_ms();
    assert_int_equal(clock_last_id, CLOCK_MONOTONIC);
    assert_true(ms >= prev / KVD_NSEC_PER_MSEC);
    assert_true(ms <= kvd_time_now_ns() / KVD_NSEC_PER_MSEC);

    /* Sleeping 20 ms advances it by at least that. */
    struct timespec nap = {.tv_sec = 0, .tv_nsec = 20000000};
    uint64_t before = kvd_time_now_ns();
    while (nanosleep(&nap, &nap) != 0 && errno == EINTR) {
    }
    assert_true(kvd_time_now_ns() - before >= 20 * KVD_NSEC_PER_MSEC);
}

static void test_now_ns_and_ms_are_exact(void **state)
{
    (void)state;
    freeze_clock(123456789012345ull);
    assert_int_equal(kvd_time_now_ns(), 123456789012345ull);
    assert_int_equal(kvd_time_now_ms(), 123456789ull); /* truncated */
    freeze_clock(UINT64_MAX - 1);
    assert_int_equal(kvd_time_now_ns(), UINT64_MAX - 1);
}

static void test_deadline(void **state)
{
    (void)state;
    const uint64_t t = 5 * KVD_NSEC_PER_SEC + 7;
    freeze_clock(t);
    assert_int_equal(kvd_time_deadline_ns(-1), KVD_DEADLINE_NEVER);
    assert_int_equal(kvd_time_deadline_ns(INT64_MIN), KVD_DEADLINE_NEVER);
    assert_int_equal(kvd_time_deadline_ns(0), t);
    assert_int_equal(kvd_time_deadline_ns(1), t + KVD_NSEC_PER_MSEC);
    assert_int_equal(kvd_time_deadline_ns(1500), t + 1500 * KVD_NSEC_PER_MSEC);
    /* Too far to represent: saturates instead of wrapping. */
    assert_int_equal(kvd_time_deadline_ns(INT64_MAX), KVD_DEADLINE_NEVER);
    assert_int_equal(kvd_time_deadline_ns(INT64_MAX / 1000),
                     KVD_DEADLINE_NEVER);

    /* Near the top of the clock: 10 ms still fits, 11 ms saturates. */
    const uint64_t top = UINT64_MAX - 10 * KVD_NSEC_PER_MSEC - 1;
    freeze_clock(top);
    assert_int_equal(kvd_time_deadline_ns(10), UINT64_MAX - 1);
    assert_int_equal(kvd_time_deadline_ns(11), KVD_DEADLINE_NEVER);
}

static void test_deadline_on_real_clock(void **state)
{
    (void)state;
    uint64_t before = kvd_time_now_ns();
    uint64_t deadline = kvd_time_deadline_ns(250);
    uint64_t after = kvd_time_now_ns();
    assert_true(deadline >= before + 250 * KVD_NSEC_PER_MSEC);
    assert_true(deadline <= after + 250 * KVD_NSEC_PER_MSEC);
}

static void test_remaining_ms(void **state)
{
    (void)state;
    assert_int_equal(kvd_time_remaining_ms(KVD_DEADLINE_NEVER), -1);

    const uint64_t t = 1000 * KVD_NSEC_PER_SEC;
    freeze_clock(t);
    assert_int_equal(kvd_time_remaining_ms(KVD_DEADLINE_NEVER), -1);
    /* At or after the deadline. */
    assert_int_equal(kvd_time_remaining_ms(t), 0);
    assert_int_equal(kvd_time_remaining_ms(t - 1), 0);
    assert_int_equal(kvd_time_remaining_ms(0), 0);
    /* Rounded up, so a poll() with it never wakes before the deadline. */
    assert_int_equal(kvd_time_remaining_ms(t + 1), 1);
    assert_int_equal(kvd_time_remaining_ms(t + KVD_NSEC_PER_MSEC), 1);
    assert_int_equal(kvd_time_remaining_ms(t + KVD_NSEC_PER_MSEC + 1), 2);
    assert_int_equal(kvd_time_remaining_ms(t + 5 * KVD_NSEC_PER_SEC), 5000);
    /* Clamped to what poll()/epoll_wait() accept. */
    assert_int_equal(
        kvd_time_remaining_ms(t + (uint64_t)INT32_MAX * KVD_NSEC_PER_MSEC),
        INT32_MAX);
    assert_int_equal(kvd_time_remaining_ms(t + ((uint64_t)INT32_MAX + 1) *
                                                   KVD_NSEC_PER_MSEC),
                     INT32_MAX);
    assert_int_equal(kvd_time_remaining_ms(KVD_DEADLINE_NEVER - 1), INT32_MAX);

    /* Round trip: remaining time of a fresh deadline is the timeout. */
    assert_int_equal(kvd_time_remaining_ms(kvd_time_deadline_ns(1234)), 1234);
    assert_int_equal(kvd_time_remaining_ms(kvd_time_deadline_ns(0)), 0);
    assert_int_equal(kvd_time_remaining_ms(kvd_time_deadline_ns(-5)), -1);
}

static void test_remaining_is_zero_after_real_deadline(void **state)
{
    (void)state;
    uint64_t deadline = kvd_time_deadline_ns(2);
    int first = kvd_time_remaining_ms(deadline);
    assert_true(first >= 0 && first <= 2);
    struct timespec nap = {.tv_sec = 0, .tv_nsec = 10000000};
    while (nanosleep(&nap, &nap) != 0 && errno == EINTR) {
    }
    assert_int_equal(kvd_time_remaining_ms(deadline), 0);
}

static void test_timespec_to_ns(void **state)
{
    (void)state;
    struct timespec ts;

    ts = (struct timespec){.tv_sec = 0, .tv_nsec = 0};
    assert_int_equal(kvd_timespec_to_ns(&ts), 0);
    ts = (struct timespec){.tv_sec = 0, .tv_nsec = 999999999};
    assert_int_equal(kvd_timespec_to_ns(&ts), 999999999ull);
    ts = (struct timespec){.tv_sec = 1, .tv_nsec = 1};
    assert_int_equal(kvd_timespec_to_ns(&ts), 1000000001ull);
    ts = (struct timespec){.tv_sec = 3600, .tv_nsec = 500};
    assert_int_equal(kvd_timespec_to_ns(&ts), 3600000000500ull);

    /* Negative intervals (normalised: tv_nsec in [0, 1e9)) count as 0. */
    ts = (struct timespec){.tv_sec = -1, .tv_nsec = 0};
    assert_int_equal(kvd_timespec_to_ns(&ts), 0);
    ts = (struct timespec){.tv_sec = -1, .tv_nsec = 500000000}; /* -0.5 s */
    assert_int_equal(kvd_timespec_to_ns(&ts), 0);
    ts = (struct timespec){.tv_sec = (time_t)INT64_MIN, .tv_nsec = 0};
    assert_int_equal(kvd_timespec_to_ns(&ts), 0);

    /* Not normalised: the true value, never a wrapped one. */
    ts = (struct timespec){.tv_sec = 2, .tv_nsec = -1};
    assert_int_equal(kvd_timespec_to_ns(&ts), 1999999999ull);
    ts = (struct timespec){.tv_sec = 0, .tv_nsec = -5};
    assert_int_equal(kvd_timespec_to_ns(&ts), 0);
    ts = (struct timespec){.tv_sec = 1, .tv_nsec = 1500000000};
    assert_int_equal(kvd_timespec_to_ns(&ts), 2500000000ull);

    if (sizeof(time_t) < sizeof(uint64_t)) {
        return; /* 32-bit time_t cannot reach the saturation point */
    }
    /* The largest second count below the saturation bound is exact. */
    ts = (struct timespec){.tv_sec = (time_t)18446744072ll,
                           .tv_nsec = 999999999};
    assert_int_equal(kvd_timespec_to_ns(&ts), 18446744072999999999ull);
    /* Up to the true limit the value is exact; past it, it saturates
     * instead of wrapping. */
    ts = (struct timespec){.tv_sec = (time_t)18446744073ll, .tv_nsec = 0};
    assert_int_equal(kvd_timespec_to_ns(&ts), 18446744073000000000ull);
    ts = (struct timespec){.tv_sec = (time_t)18446744073ll,
                           .tv_nsec = 709551615};
    assert_int_equal(kvd_timespec_to_ns(&ts), UINT64_MAX);
    ts = (struct timespec){.tv_sec = (time_t)18446744073ll,
                           .tv_nsec = 709551616};
    assert_int_equal(kvd_timespec_to_ns(&ts), UINT64_MAX);
    ts = (struct timespec){.tv_sec = (time_t)18446744074ll, .tv_nsec = 0};
    assert_int_equal(kvd_timespec_to_ns(&ts), UINT64_MAX);
    ts = (struct timespec){.tv_sec = (time_t)INT64_MAX, .tv_nsec = 999999999};
    assert_int_equal(kvd_timespec_to_ns(&ts), UINT64_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_now_is_monotonic_and_non_decreasing,
                                  thaw_clock),
        cmocka_unit_test_teardown(test_now_ns_and_ms_are_exact, thaw_clock),
        cmocka_unit_test_teardown(test_deadline, thaw_clock),
        cmocka_unit_test_teardown(test_deadline_on_real_clock, thaw_clock),
        cmocka_unit_test_teardown(test_remaining_ms, thaw_clock),
        cmocka_unit_test_teardown(test_remaining_is_zero_after_real_deadline,
                                  thaw_clock),
        cmocka_unit_test_teardown(test_timespec_to_ns, thaw_clock),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
