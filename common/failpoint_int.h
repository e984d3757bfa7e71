/*
 * Failpoints: named places in the code where a test can inject an error.
 *
 * A component marks a fallible step with
 *
 *     int inject = KVD_FAILPOINT("nvme.write");
 *     if (inject != 0) { errno = inject; goto err_write; }
 *
 * and a test arms it, either with kvd_failpoint_set() or through the
 * environment before the process starts:
 *
 *     KVDEPOT_FAILPOINTS=nvme.write=EIO@3,arena.alloc=ENOMEM
 *
 * Spec grammar: comma-separated entries `name=ERR[@N[+]]`,
 * `name=delay:MS[@N[+]]` or `name=block[@N[+]]`, no spaces.
 *   name  [a-z0-9_.-]+, at most KVD_FAILPOINT_NAME_MAX bytes; each name at
 *         most once per spec; at most KVD_FAILPOINT_MAX entries.
 *   ERR   an errno name (EIO ENOSPC ENOMEM EAGAIN ETIMEDOUT ECONNRESET
 *         ECONNREFUSED EINVAL EPIPE ENOENT EACCES EDQUOT EBUSY ECANCELED
 *         EPROTO EEXIST EINTR EFAULT EBADF ENODEV EPERM ENOTCONN EMSGSIZE)
 *         or a decimal errno 1..4095.
 *   delay:MS  instead of failing, the evaluation sleeps MS milliseconds
 *         (1..60000) and passes (returns 0): a slow disk or network for
 *         benchmarks and timing tests (nvme.read=delay:20);
 *   block the evaluation waits until the armed set is replaced
 *         (kvd_failpoint_set or kvd_failpoint_clear), then passes: a test
 *         holds a background step at that point while it looks at the
 *         state, without timing;
 *   none  every evaluation fails;
 *   @N    only the Nth evaluation fails (1-based);
 *   @N+   the Nth and every later evaluation fail.
 *
 * Cost: with KVD_FAILPOINTS_ENABLED undefined (cmake -DKVD_FAILPOINTS=OFF)
 * KVD_FAILPOINT(name) is the constant 0 and `name` is not evaluated. When
 * enabled and nothing is armed, it is one relaxed atomic load and a branch.
 *
 * Threading: every function is thread-safe; evaluations from many threads
 * are counted exactly (the armed slow path takes a mutex). Internal: not
 * exported from libkvdepot.so; tests link the static library.
 */
#ifndef KVD_COMMON_FAILPOINT_INT_H
#define KVD_COMMON_FAILPOINT_INT_H

#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVD_FAILPOINT_NAME_MAX 63
#define KVD_FAILPOINT_MAX 32

/* Nonzero while some point may be armed (including "the environment has
 * not been read yet"); the macro's fast path reads only this. */
extern int kvd_failpoint_armed_g;

/*
 * Evaluates failpoint `name`: counts the evaluation if the point is armed
 * and returns the positive errno to inject, or 0 to proceed. On the first
 * call in the process, arms the points in KVDEPOT_FAILPOINTS (a malformed
 * value is logged with the reason and arms nothing). `name` is borrowed for
 * the call; NULL returns 0. Use KVD_FAILPOINT() rather than calling this.
 */
int kvd_failpoint_hit(const char *name);

/*
 * Replaces every armed point with those of `spec` (grammar above) and resets
 * their counts. NULL or "" disarms everything. KVD_ERR_INVALID (malformed
 * spec) or KVD_ERR_RANGE (too many entries, N too large) leave the armed
 * set unchanged and write the reason into `err` (at most `err_len` bytes,
 * NUL-terminated; `err` may be NULL when `err_len` is 0). A later
 * KVDEPOT_FAILPOINTS is never applied over it: the environment is consumed
 * first.
 */
kvd_status_t kvd_failpoint_set(const char *spec, char *err, size_t err_len);

/* Disarms every point (the environment is consumed, not re-read). */
void kvd_failpoint_clear(void);

/* Evaluations of `name` since it was armed, injected or not; 0 when `name`
 * is not armed or NULL. */
uint64_t kvd_failpoint_count(const char *name);

#ifdef __cplusplus
}
#endif

#ifdef KVD_FAILPOINTS_ENABLED
#define KVD_FAILPOINT(name)                                                    \
    (__builtin_expect(                                                         \
         __atomic_load_n(&kvd_failpoint_armed_g, __ATOMIC_RELAXED) != 0, 0)    \
         ? kvd_failpoint_hit(name)                                             \
         : 0)
#else
#define KVD_FAILPOINT(name) 0
#endif

#endif /* KVD_COMMON_FAILPOINT_INT_H */
