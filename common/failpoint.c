/*
 * Failpoints: the armed set, its spec parser and the evaluation slow path
 * (contract and grammar in common/failpoint_int.h).
 *
 * The armed set is a small fixed array under one mutex: failpoints exist for
 * tests, where exact counts across threads matter more than speed, and the
 * fast path never reaches the mutex because KVD_FAILPOINT() first checks
 * kvd_failpoint_armed_g. That flag starts at 1 so the first evaluation in
 * the process comes here and reads KVDEPOT_FAILPOINTS (under pthread_once);
 * afterwards it holds the number of armed points. kvd_failpoint_set() also
 * runs the once-routine first, so an explicit spec is never overwritten by
 * a late read of the environment.
 *
 * This file is compiled in every build (it is tiny); with
 * KVD_FAILPOINTS_ENABLED undefined only the macro disappears, so no call
 * site ever reaches it.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/failpoint_int.h"
#include "common/log_int.h"

/* N in "@N" is capped so that counting to it can never wrap. */
#define KVD_FAILPOINT_NTH_MAX 1000000000000000000ull
#define KVD_FAILPOINT_ERRNO_MAX 4095
#define KVD_FAILPOINT_DELAY_MAX_MS 60000u
#define KVD_FAILPOINT_DELAY "delay:"

typedef struct kvd_failpoint {
    char name[KVD_FAILPOINT_NAME_MAX + 1];
    int err;           /* positive errno injected, or 0 with a delay */
    uint32_t delay_ms; /* "delay:MS": the evaluation sleeps, then passes */
    bool block;        /* "block": waits until the armed set changes */
    uint64_t nth;      /* 0: every evaluation; else the Nth (1-based) */
    bool and_later;    /* "@N+": the Nth and every later one */
    uint64_t count;    /* evaluations since armed */
} kvd_failpoint_t;

typedef struct kvd_failpoint_spec {
    kvd_failpoint_t points[KVD_FAILPOINT_MAX];
    size_t num_points;
} kvd_failpoint_spec_t;

int kvd_failpoint_armed_g = 1;

static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t armed_lock = PTHREAD_MUTEX_INITIALIZER;
static kvd_failpoint_spec_t armed; /* guarded by armed_lock */
/* Counts kvd_failpoint_set/clear calls; "block" evaluations wait on
 * armed_cv until it moves (both guarded by armed_lock). */
static uint64_t armed_gen;
static pthread_cond_t armed_cv = PTHREAD_COND_INITIALIZER;

static const struct {
    const char *name;
    int value;
} errno_names[] = {
    {"EIO", EIO},
    {"ENOSPC", ENOSPC},
    {"ENOMEM", ENOMEM},
    {"EAGAIN", EAGAIN},
    {"ETIMEDOUT", ETIMEDOUT},
    {"ECONNRESET", ECONNRESET},
    {"ECONNREFUSED", ECONNREFUSED},
    {"EINVAL", EINVAL},
    {"EPIPE", EPIPE},
    {"ENOENT", ENOENT},
    {"EACCES", EACCES},
    {"EDQUOT", EDQUOT},
    {"EBUSY", EBUSY},
    {"ECANCELED", ECANCELED},
    {"EPROTO", EPROTO},
    {"EEXIST", EEXIST},
    {"EINTR", EINTR},
    {"EFAULT", EFAULT},
    {"EBADF", EBADF},
    {"ENODEV", ENODEV},
    {"EPERM", EPERM},
    {"ENOTCONN", ENOTCONN},
    {"EMSGSIZE", EMSGSIZE},
};

#define FP_NUM_ERRNOS (sizeof(errno_names) / sizeof(errno_names[0]))

/* Error text goes to a caller buffer that may be absent. */
typedef struct kvd_fp_err {
    char *buf;
    size_t len;
} kvd_fp_err_t;

__attribute__((format(printf, 3, 4))) static kvd_status_t
fp_fail(const kvd_fp_err_t *err, kvd_status_t st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (err->buf != NULL && err->len > 0) {
        vsnprintf(err->buf, err->len, fmt, ap);
    }
    va_end(ap);
    return st;
}

static bool name_char_ok(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '.' || c == '-';
}

/* Decimal digits in [b, e) into *out; false if empty, not digits, or above
 * `max`. */
static bool digits_parse(const char *b, const char *e, uint64_t max,
                         uint64_t *out)
{
    uint64_t v = 0;
    if (b == e) {
        return false;
    }
    for (const char *p = b; p < e; p++) {
        if (*p < '0' || *p > '9') {
            return false;
        }
        v = v * 10 + (uint64_t)(*p - '0');
        if (v > max) {
            return false;
        }
    }
    *out = v;
    return true;
}

static kvd_status_t errno_parse(const char *b, const char *e, int *out,
                                const kvd_fp_err_t *err)
{
    uint64_t v;
    if (b < e && *b >= '0' && *b <= '9') {
        if (!digits_parse(b, e, KVD_FAILPOINT_ERRNO_MAX, &v) || v == 0) {
            return fp_fail(err, KVD_ERR_INVALID,
                           "errno '%.*s' is not a number in 1..%d",
                           (int)(e - b), b, KVD_FAILPOINT_ERRNO_MAX);
        }
        *out = (int)v;
        return KVD_OK;
    }
    for (size_t i = 0; i < FP_NUM_ERRNOS; i++) {
        size_t n = strlen(errno_names[i].name);
        if ((size_t)(e - b) == n && memcmp(b, errno_names[i].name, n) == 0) {
            *out = errno_names[i].value;
            return KVD_OK;
        }
    }
    return fp_fail(err, KVD_ERR_INVALID, "unknown errno name '%.*s'",
                   (int)(e - b), b);
}

/* One entry "name=ERR[@N[+]]" in [b, e). */
static kvd_status_t entry_parse(const char *b, const char *e,
                                kvd_failpoint_t *fp, const kvd_fp_err_t *err)
{
    const char *eq = memchr(b, '=', (size_t)(e - b));
    if (eq == NULL) {
        return fp_fail(err, KVD_ERR_INVALID, "'%.*s': expected name=ERR",
                       (int)(e - b), b);
    }
    size_t nlen = (size_t)(eq - b);
    if (nlen == 0 || nlen > KVD_FAILPOINT_NAME_MAX) {
        return fp_fail(err, KVD_ERR_INVALID,
                       "'%.*s': name must be 1..%d characters", (int)(e - b), b,
                       KVD_FAILPOINT_NAME_MAX);
    }
    for (const char *p = b; p < eq; p++) {
        if (!name_char_ok(*p)) {
            return fp_fail(err, KVD_ERR_INVALID,
                           "'%.*s': name may hold only a-z 0-9 _ . -",
                           (int)(e - b), b);
        }
    }
    memset(fp, 0, sizeof(*fp));
    memcpy(fp->name, b, nlen);
    const char *at = memchr(eq + 1, '@', (size_t)(e - eq - 1));
    const char *vend = at != NULL ? at : e;
    size_t dl = sizeof KVD_FAILPOINT_DELAY - 1;
    kvd_status_t st = KVD_OK;
    if ((size_t)(vend - eq - 1) >= dl &&
        memcmp(eq + 1, KVD_FAILPOINT_DELAY, dl) == 0) {
        uint64_t ms = 0;
        if (!digits_parse(eq + 1 + dl, vend, KVD_FAILPOINT_DELAY_MAX_MS, &ms) ||
            ms == 0) {
            return fp_fail(err, KVD_ERR_INVALID,
                           "'%.*s': expected delay:MS with MS in 1..%u",
                           (int)(e - b), b, KVD_FAILPOINT_DELAY_MAX_MS);
        }
        fp->delay_ms = (uint32_t)ms;
    } else if (vend - eq - 1 == 5 && memcmp(eq + 1, "block", 5) == 0) {
        fp->block = true;
    } else {
        st = errno_parse(eq + 1, vend, &fp->err, err);
    }
    if (st != KVD_OK || at == NULL) {
        return st;
    }
    const char *nend = e;
    if (nend > at + 1 && nend[-1] == '+') {
        fp->and_later = true;
        nend--;
    }
    if (!digits_parse(at + 1, nend, KVD_FAILPOINT_NTH_MAX, &fp->nth) ||
        fp->nth == 0) {
        return fp_fail(err, KVD_ERR_INVALID,
                       "'%.*s': expected @N or @N+ with N in 1..1e18",
                       (int)(e - b), b);
    }
    return KVD_OK;
}

static kvd_status_t spec_parse(const char *spec, kvd_failpoint_spec_t *out,
                               const kvd_fp_err_t *err)
{
    out->num_points = 0;
    if (spec == NULL || spec[0] == '\0') {
        return KVD_OK;
    }
    const char *b = spec;
    for (;;) {
        const char *e = strchr(b, ',');
        if (e == NULL) {
            e = b + strlen(b);
        }
        if (e == b) {
            return fp_fail(err, KVD_ERR_INVALID, "empty entry at offset %zu",
                           (size_t)(b - spec));
        }
        if (out->num_points == KVD_FAILPOINT_MAX) {
            return fp_fail(err, KVD_ERR_RANGE, "more than %d failpoints",
                           KVD_FAILPOINT_MAX);
        }
        kvd_failpoint_t *fp = &out->points[out->num_points];
        kvd_status_t st = entry_parse(b, e, fp, err);
        if (st != KVD_OK) {
            return st;
        }
        for (size_t i = 0; i < out->num_points; i++) {
            if (strcmp(out->points[i].name, fp->name) == 0) {
                return fp_fail(err, KVD_ERR_INVALID,
                               "failpoint '%s' given twice", fp->name);
            }
        }
        out->num_points++;
        if (*e == '\0') {
            return KVD_OK;
        }
        b = e + 1;
    }
}

static void armed_install(const kvd_failpoint_spec_t *spec)
{
    pthread_mutex_lock(&armed_lock);
    armed = *spec;
    armed_gen++;
    pthread_cond_broadcast(&armed_cv);
    __atomic_store_n(&kvd_failpoint_armed_g, (int)spec->num_points,
                     __ATOMIC_RELAXED);
    pthread_mutex_unlock(&armed_lock);
}

static void env_init(void)
{
    kvd_failpoint_spec_t spec;
    char reason[256] = "";
    kvd_fp_err_t err = {reason, sizeof(reason)};
    const char *env = getenv("KVDEPOT_FAILPOINTS");
    spec.num_points = 0;
    if (env != NULL && spec_parse(env, &spec, &err) != KVD_OK) {
        KVD_LOG_ERROR("KVDEPOT_FAILPOINTS='%s': %s; no failpoint armed", env,
                      reason);
        spec.num_points = 0;
    } else if (spec.num_points > 0) {
        KVD_LOG_WARN("failure injection armed from KVDEPOT_FAILPOINTS='%s'",
                     env);
    }
    armed_install(&spec);
}

int kvd_failpoint_hit(const char *name)
{
    pthread_once(&env_once, env_init);
    if (name == NULL ||
        __atomic_load_n(&kvd_failpoint_armed_g, __ATOMIC_RELAXED) == 0) {
        return 0;
    }
    int inject = 0;
    uint32_t delay_ms = 0;
    uint64_t count = 0;
    pthread_mutex_lock(&armed_lock);
    for (size_t i = 0; i < armed.num_points; i++) {
        kvd_failpoint_t *fp = &armed.points[i];
        if (strcmp(fp->name, name) != 0) {
            continue;
        }
        count = ++fp->count;
        if (fp->nth == 0 || count == fp->nth ||
            (fp->and_later && count > fp->nth)) {
            inject = fp->err;
            delay_ms = fp->delay_ms;
            /* The armed set is replaced by a set or clear: fp is gone. */
            for (uint64_t gen = armed_gen; fp->block && gen == armed_gen;) {
                pthread_cond_wait(&armed_cv, &armed_lock);
            }
        }
        break;
    }
    pthread_mutex_unlock(&armed_lock);
    if (delay_ms > 0) {
        /* Outside the lock: other threads' evaluations go on. */
        struct timespec ts = {(time_t)(delay_ms / 1000u),
                              (long)(delay_ms % 1000u) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    if (inject != 0) {
        KVD_LOG_DEBUG("failpoint %s: injecting errno %d (evaluation %llu)",
                      name, inject, (unsigned long long)count);
    }
    return inject;
}

kvd_status_t kvd_failpoint_set(const char *spec, char *err, size_t err_len)
{
    kvd_failpoint_spec_t parsed;
    kvd_fp_err_t e = {err, err_len};
    pthread_once(&env_once, env_init);
    kvd_status_t st = spec_parse(spec, &parsed, &e);
    if (st == KVD_OK) {
        armed_install(&parsed);
    }
    return st;
}

void kvd_failpoint_clear(void)
{
    pthread_once(&env_once, env_init);
    pthread_mutex_lock(&armed_lock);
    armed.num_points = 0;
    armed_gen++;
    pthread_cond_broadcast(&armed_cv);
    __atomic_store_n(&kvd_failpoint_armed_g, 0, __ATOMIC_RELAXED);
    pthread_mutex_unlock(&armed_lock);
}

uint64_t kvd_failpoint_count(const char *name)
{
    pthread_once(&env_once, env_init);
    uint64_t count = 0;
    if (name == NULL) {
        return 0;
    }
    pthread_mutex_lock(&armed_lock);
    for (size_t i = 0; i < armed.num_points; i++) {
        if (strcmp(armed.points[i].name, name) == 0) {
            count = armed.points[i].count;
            break;
        }
    }
    pthread_mutex_unlock(&armed_lock);
    return count;
}
