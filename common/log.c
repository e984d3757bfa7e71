/*
 * Logging: a process-wide level and a pluggable sink.
 *
 * The level is one int read with a relaxed atomic load by the KVD_LOG_*
 * macros, so disabled levels cost no formatting and no argument evaluation.
 * It starts as "unset" and is read from KVDEPOT_LOG_LEVEL on first use, so
 * no constructor has to run before logging works.
 *
 * The sink is swapped under a read-write lock: every message holds the read
 * side while it calls the sink, so kvd_log_set_sink() returning means no
 * thread is still inside the old sink, and the caller may free its `arg`.
 * Messages are formatted into a bounded stack buffer (long ones are cut and
 * marked) and the default sink emits each line with one write(2), so lines
 * from concurrent threads do not interleave. Under systemd the line can
 * start with a syslog priority ("<3>"), so the journal records each line's
 * level (kvd_log_set_syslog_prefix; kvdepotd turns it on when stderr is
 * the journal).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log_int.h"
#include "common/time_int.h"

#define KVD_LOG_LINE_MAX 2048

int kvd_log_level_g = KVD_LOG_LEVEL_UNSET;

static pthread_rwlock_t sink_lock = PTHREAD_RWLOCK_INITIALIZER;
static kvd_log_sink_fn sink_fn; /* NULL: the default stderr sink */
static void *sink_arg;

static const char *const level_names[] = {"error", "warn", "info", "debug",
                                          "trace"};

static int syslog_prefix; /* atomic: kvd_log_set_syslog_prefix */

/* sd-daemon(3): SD_ERR, SD_WARNING, SD_INFO, SD_DEBUG (twice). */
static const char *const syslog_prefixes[] = {"<3>", "<4>", "<6>", "<7>",
                                              "<7>"};

void kvd_log_set_syslog_prefix(int on)
{
    __atomic_store_n(&syslog_prefix, on != 0, __ATOMIC_RELAXED);
}

const char *kvd_log_syslog_prefix(kvd_log_level_t level)
{
    if (!__atomic_load_n(&syslog_prefix, __ATOMIC_RELAXED)) {
        return "";
    }
    if (level < KVD_LOG_LEVEL_ERROR) {
        level = KVD_LOG_LEVEL_ERROR;
    } else if (level > KVD_LOG_LEVEL_TRACE) {
        level = KVD_LOG_LEVEL_TRACE;
    }
    return syslog_prefixes[level];
}

int kvd_log_stderr_is_journal(void)
{
    const char *env = getenv("JOURNAL_STREAM");
    unsigned long long dev = 0, ino = 0;
    char extra;
    struct stat st;
    if (env == NULL || sscanf(env, "%llu:%llu%c", &dev, &ino, &extra) != 2 ||
        fstat(STDERR_FILENO, &st) != 0) {
        return 0;
    }
    return (unsigned long long)st.st_dev == dev &&
           (unsigned long long)st.st_ino == ino;
}

KVD_API kvd_status_t kvd_log_level_parse(const char *text,
                                         kvd_log_level_t *level_out)
{
    if (text == NULL || level_out == NULL) {
        return KVD_ERR_INVALID;
    }
    if (strcasecmp(text, "off") == 0) {
        *level_out = KVD_LOG_LEVEL_OFF;
        return KVD_OK;
    }
    for (int i = 0; i < (int)(sizeof(level_names) / sizeof(level_names[0]));
         i++) {
        if (strcasecmp(text, level_names[i]) == 0) {
            *level_out = (kvd_log_level_t)i;
            return KVD_OK;
        }
    }
    return KVD_ERR_INVALID;
}

int kvd_log_level_init(void)
{
    kvd_log_level_t level = KVD_LOG_LEVEL_WARN;
    const char *env = getenv("KVDEPOT_LOG_LEVEL");
    int bad_env = env != NULL && env[0] != '\0' &&
                  kvd_log_level_parse(env, &level) != KVD_OK;
    int expected = KVD_LOG_LEVEL_UNSET;
    /* Lose gracefully to a concurrent kvd_log_set_level(). */
    __atomic_compare_exchange_n(&kvd_log_level_g, &expected, (int)level, 0,
                                __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    if (bad_env) {
        kvd_log_write(KVD_LOG_LEVEL_WARN, __FILE__, __LINE__,
                      "KVDEPOT_LOG_LEVEL='%s' is not one of "
                      "error|warn|info|debug|trace|off; using warn",
                      env);
    }
    return __atomic_load_n(&kvd_log_level_g, __ATOMIC_RELAXED);
}

KVD_API void kvd_log_set_level(kvd_log_level_t level)
{
    if (level < KVD_LOG_LEVEL_OFF) {
        level = KVD_LOG_LEVEL_OFF;
    } else if (level > KVD_LOG_LEVEL_TRACE) {
        level = KVD_LOG_LEVEL_TRACE;
    }
    __atomic_store_n(&kvd_log_level_g, (int)level, __ATOMIC_RELAXED);
}

KVD_API kvd_log_level_t kvd_log_get_level(void)
{
    int cur = __atomic_load_n(&kvd_log_level_g, __ATOMIC_RELAXED);
    if (cur == KVD_LOG_LEVEL_UNSET) {
        cur = kvd_log_level_init();
    }
    return (kvd_log_level_t)cur;
}

KVD_API void kvd_log_set_sink(kvd_log_sink_fn sink, void *arg)
{
    pthread_rwlock_wrlock(&sink_lock);
    sink_fn = sink;
    sink_arg = arg;
    pthread_rwlock_unlock(&sink_lock);
}

static void default_sink(kvd_log_level_t level, const char *file, int line,
                         const char *msg)
{
    char out[KVD_LOG_LINE_MAX + 128];
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    const char *name =
        level >= KVD_LOG_LEVEL_ERROR && level <= KVD_LOG_LEVEL_TRACE
            ? level_names[level]
            : "?";
    int n = snprintf(out, sizeof(out),
                     "%s%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ kvdepot %-5s "
                     "%s:%d %s\n",
                     kvd_log_syslog_prefix(level), tm.tm_year + 1900,
                     tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000L, name, base, line, msg);
    if (n < 0) {
        return;
    }
    size_t len = (size_t)n < sizeof(out) ? (size_t)n : sizeof(out) - 1;
    if ((size_t)n >= sizeof(out)) {
        out[len - 1] = '\n';
    }
    /* Best effort: a log line that cannot be written is dropped. */
    ssize_t w = write(STDERR_FILENO, out, len);
    (void)w;
}

KVD_API void kvd_log_vwrite(kvd_log_level_t level, const char *file, int line,
                            const char *fmt, va_list ap)
{
    if (!kvd_log_enabled(level) || level == KVD_LOG_LEVEL_OFF) {
        return;
    }
    char msg[KVD_LOG_LINE_MAX];
    int n = vsnprintf(msg, sizeof(msg), fmt, ap);
    if (n < 0) {
        snprintf(msg, sizeof(msg), "(unformattable log message: %s)", fmt);
    } else if ((size_t)n >= sizeof(msg)) {
        memcpy(msg + sizeof(msg) - 5, "[..]", 5); /* mark the cut */
    }
    pthread_rwlock_rdlock(&sink_lock);
    if (sink_fn != NULL) {
        sink_fn(sink_arg, level, file, line, msg);
    } else {
        default_sink(level, file, line, msg);
    }
    pthread_rwlock_unlock(&sink_lock);
}

KVD_API void kvd_log_write(kvd_log_level_t level, const char *file, int line,
                           const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    kvd_log_vwrite(level, file, line, fmt, ap);
    va_end(ap);
}

int kvd_log_ratelimit_allow(kvd_log_ratelimit_t *state, uint64_t interval_ms,
                            uint64_t *suppressed_out)
{
    uint64_t now = kvd_time_now_ms();
    uint64_t last = __atomic_load_n(&state->last_ms, __ATOMIC_RELAXED);
    /* last == 0 means "never logged"; the monotonic clock is never 0 here
     * in practice, and if it were the first message would simply pass. */
    if (last != 0 && now - last < interval_ms) {
        __atomic_fetch_add(&state->suppressed, 1, __ATOMIC_RELAXED);
        return 0;
    }
    if (!__atomic_compare_exchange_n(&state->last_ms, &last, now, 0,
                                     __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
        /* Another thread won this interval. */
        __atomic_fetch_add(&state->suppressed, 1, __ATOMIC_RELAXED);
        return 0;
    }
    *suppressed_out =
        __atomic_exchange_n(&state->suppressed, 0, __ATOMIC_RELAXED);
    return 1;
}
