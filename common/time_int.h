/*
 * Monotonic time helpers. Everything that measures an interval or a
 * deadline uses CLOCK_MONOTONIC (never the wall clock, which can jump).
 * Deadlines are absolute monotonic nanoseconds; UINT64_MAX means "never".
 */
#ifndef KVD_COMMON_TIME_INT_H
#define KVD_COMMON_TIME_INT_H

#include <stdint.h>
#include <time.h>

#define KVD_NSEC_PER_USEC 1000ull
#define KVD_NSEC_PER_MSEC 1000000ull
#define KVD_NSEC_PER_SEC 1000000000ull
#define KVD_DEADLINE_NEVER UINT64_MAX

static inline uint64_t kvd_time_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * KVD_NSEC_PER_SEC + (uint64_t)ts.tv_nsec;
}

static inline uint64_t kvd_time_now_ms(void)
{
    return kvd_time_now_ns() / KVD_NSEC_PER_MSEC;
}

/* Absolute deadline `timeout_ms` from now; a negative timeout never expires,
 * and one too far in the future saturates to KVD_DEADLINE_NEVER. */
static inline uint64_t kvd_time_deadline_ns(int64_t timeout_ms)
{
    if (timeout_ms < 0) {
        return KVD_DEADLINE_NEVER;
    }
    uint64_t now = kvd_time_now_ns();
    uint64_t delta = (uint64_t)timeout_ms;
    if (delta > (KVD_DEADLINE_NEVER - now) / KVD_NSEC_PER_MSEC) {
        return KVD_DEADLINE_NEVER;
    }
    return now + delta * KVD_NSEC_PER_MSEC;
}

/* Milliseconds left until `deadline_ns` (rounded up, 0 if passed, -1 for
 * KVD_DEADLINE_NEVER), clamped to INT32_MAX so it fits poll()/epoll. */
static inline int kvd_time_remaining_ms(uint64_t deadline_ns)
{
    if (deadline_ns == KVD_DEADLINE_NEVER) {
        return -1;
    }
    uint64_t now = kvd_time_now_ns();
    if (now >= deadline_ns) {
        return 0;
    }
    uint64_t ms =
        (deadline_ns - now + KVD_NSEC_PER_MSEC - 1) / KVD_NSEC_PER_MSEC;
    return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

/* Converts a timespec interval to nanoseconds, saturating at 0 and
 * UINT64_MAX. A timespec that is not normalised (tv_nsec outside
 * [0, 1e9)) is handled by its true value, never wrapped. */
static inline uint64_t kvd_timespec_to_ns(const struct timespec *ts)
{
    int64_t sec = (int64_t)ts->tv_sec + (int64_t)(ts->tv_nsec / 1000000000L);
    int64_t nsec = ts->tv_nsec % 1000000000L;
    if (nsec < 0) {
        sec -= 1;
        nsec += 1000000000L;
    }
    if (sec < 0) {
        return 0;
    }
    if ((uint64_t)sec > (UINT64_MAX - (uint64_t)nsec) / KVD_NSEC_PER_SEC) {
        return UINT64_MAX;
    }
    return (uint64_t)sec * KVD_NSEC_PER_SEC + (uint64_t)nsec;
}

#endif /* KVD_COMMON_TIME_INT_H */
