/*
 * Internal logging macros. KVD_LOG_<LEVEL>(fmt, ...) tests the level with one
 * relaxed atomic load before any argument is evaluated, so a DEBUG line on a
 * hot path costs a load and a branch when DEBUG is off. Usable from C and
 * from CUDA C++ (kernels/cuda).
 *
 * KVD_LOG_RATELIMITED(level, interval_ms, fmt, ...) emits at most one line
 * per call site per interval and reports how many were suppressed since.
 */
#ifndef KVD_COMMON_LOG_INT_H
#define KVD_COMMON_LOG_INT_H

#include <stdint.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Current level, or KVD_LOG_LEVEL_UNSET before the first use (the level is
 * then read from KVDEPOT_LOG_LEVEL by kvd_log_level_init). */
#define KVD_LOG_LEVEL_UNSET (-2)
extern int kvd_log_level_g;
int kvd_log_level_init(void);

static inline int kvd_log_enabled(kvd_log_level_t level)
{
    int cur = __atomic_load_n(&kvd_log_level_g, __ATOMIC_RELAXED);
    if (cur == KVD_LOG_LEVEL_UNSET) {
        cur = kvd_log_level_init();
    }
    return (int)level <= cur;
}

/*
 * Decides whether a rate-limited call site may log now. `state` points at
 * the call site's static storage. Returns 1 (and writes into *suppressed_out
 * how many messages were dropped since the last one) or 0. Thread-safe.
 */
typedef struct kvd_log_ratelimit {
    uint64_t last_ms;
    uint64_t suppressed;
} kvd_log_ratelimit_t;
int kvd_log_ratelimit_allow(kvd_log_ratelimit_t *state, uint64_t interval_ms,
                            uint64_t *suppressed_out);

/*
 * Syslog priority prefixes (sd-daemon(3)): when on, the default sink starts
 * each line with "<N>", N the syslog priority of its level (error 3, warn
 * 4, info 6, debug and trace 7), which journald strips and stores as the
 * line's priority. Off until kvd_log_set_syslog_prefix(1). Thread: any.
 */
void kvd_log_set_syslog_prefix(int on);

/* "<N>" for `level` while the prefix is on, else "" (for a program's own
 * lines to stderr, so they carry a priority too). Static storage. */
const char *kvd_log_syslog_prefix(kvd_log_level_t level);

/* 1 when stderr is the journal: $JOURNAL_STREAM ("DEV:INODE", set by
 * systemd, systemd.exec(5)) names the device and inode of descriptor 2;
 * else 0 (stderr redirected elsewhere by a child inheriting the variable). */
int kvd_log_stderr_is_journal(void);

#ifdef __cplusplus
}
#endif

#define KVD_LOG(level, ...)                                                    \
    do {                                                                       \
        if (kvd_log_enabled(level)) {                                          \
            kvd_log_write((level), __FILE__, __LINE__, __VA_ARGS__);           \
        }                                                                      \
    } while (0)

#define KVD_LOG_ERROR(...) KVD_LOG(KVD_LOG_LEVEL_ERROR, __VA_ARGS__)
#define KVD_LOG_WARN(...) KVD_LOG(KVD_LOG_LEVEL_WARN, __VA_ARGS__)
#define KVD_LOG_INFO(...) KVD_LOG(KVD_LOG_LEVEL_INFO, __VA_ARGS__)
#define KVD_LOG_DEBUG(...) KVD_LOG(KVD_LOG_LEVEL_DEBUG, __VA_ARGS__)
#define KVD_LOG_TRACE(...) KVD_LOG(KVD_LOG_LEVEL_TRACE, __VA_ARGS__)

#define KVD_LOG_RATELIMITED(level, interval_ms, fmt, ...)                      \
    do {                                                                       \
        static kvd_log_ratelimit_t kvd_rl_state_;                              \
        uint64_t kvd_rl_dropped_ = 0;                                          \
        if (kvd_log_enabled(level) &&                                          \
            kvd_log_ratelimit_allow(&kvd_rl_state_, (interval_ms),             \
                                    &kvd_rl_dropped_)) {                       \
            kvd_log_write((level), __FILE__, __LINE__,                         \
                          fmt " (%llu similar suppressed)", ##__VA_ARGS__,     \
                          (unsigned long long)kvd_rl_dropped_);                \
        }                                                                      \
    } while (0)

#endif /* KVD_COMMON_LOG_INT_H */
