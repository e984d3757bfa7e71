/*
 * Failpoints: the spec grammar (valid and malformed), every-time / @N / @N+
 * semantics, delays instead of errors, blocks until the armed set changes,
 * evaluation counts, exact counting under
 * concurrent hits, clear, and KVDEPOT_FAILPOINTS (read once per process, so
 * checked in a re-executed child).
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/failpoint_int.h"
#include "common/log_int.h"

static int setup(void **state)
{
    (void)state;
    kvd_failpoint_clear();
    return 0;
}

static void test_every_evaluation(void **state)
{
    (void)state;
    char err[128] = "";
    assert_int_equal(kvd_failpoint_set("arena.alloc=ENOMEM", err, 128), KVD_OK);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(kvd_failpoint_hit("arena.alloc"), ENOMEM);
    }
    assert_int_equal(kvd_failpoint_hit("arena.other"), 0);
    assert_int_equal(kvd_failpoint_hit(NULL), 0);
    assert_int_equal(kvd_failpoint_count("arena.alloc"), 5);
    assert_int_equal(kvd_failpoint_count("arena.other"), 0);
    assert_int_equal(kvd_failpoint_count(NULL), 0);
}

static void test_nth_only(void **state)
{
    (void)state;
    assert_int_equal(kvd_failpoint_set("nvme.write=EIO@3", NULL, 0), KVD_OK);
    int got[6];
    for (int i = 0; i < 6; i++) {
        got[i] = kvd_failpoint_hit("nvme.write");
    }
    int want[6] = {0, 0, EIO, 0, 0, 0};
    assert_memory_equal(got, want, sizeof(got));
    assert_int_equal(kvd_failpoint_count("nvme.write"), 6);
}

static void test_nth_and_later(void **state)
{
    (void)state;
    assert_int_equal(
        kvd_failpoint_set("net.send=ECONNRESET@2+,disk.sync=28@1", NULL, 0),
        KVD_OK);
    int got[5];
    for (int i = 0; i < 5; i++) {
        got[i] = kvd_failpoint_hit("net.send");
    }
    int want[5] = {0, ECONNRESET, ECONNRESET, ECONNRESET, ECONNRESET};
    assert_memory_equal(got, want, sizeof(got));
    /* A decimal errno works like a name. */
    assert_int_equal(kvd_failpoint_hit("disk.sync"), 28);
    assert_int_equal(kvd_failpoint_hit("disk.sync"), 0);
    assert_int_equal(kvd_failpoint_count("net.send"), 5);
    assert_int_equal(kvd_failpoint_count("disk.sync"), 2);
    /* "@1+" is the same as no "@". */
    assert_int_equal(kvd_failpoint_set("x=EAGAIN@1+", NULL, 0), KVD_OK);
    assert_int_equal(kvd_failpoint_hit("x"), EAGAIN);
    assert_int_equal(kvd_failpoint_hit("x"), EAGAIN);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* "delay:MS": the chosen evaluations sleep and pass (return 0); counted
 * like any other point. */
static void test_delay(void **state)
{
    (void)state;
    assert_int_equal(
        kvd_failpoint_set("slow=delay:40@2,every=delay:5", NULL, 0), KVD_OK);
    double took[3];
    for (int i = 0; i < 3; i++) {
        double t0 = now_ms();
        assert_int_equal(kvd_failpoint_hit("slow"), 0);
        took[i] = now_ms() - t0;
    }
    /* Only lower bounds: a sleep lasts at least its time (an upper bound
     * would be a timing assertion a loaded machine breaks). */
    assert_true(took[1] >= 40.0);
    double t0 = now_ms();
    assert_int_equal(kvd_failpoint_hit("every"), 0);
    assert_int_equal(kvd_failpoint_hit("every"), 0);
    assert_true(now_ms() - t0 >= 10.0);
    assert_int_equal(kvd_failpoint_count("slow"), 3);
    assert_int_equal(kvd_failpoint_count("every"), 2);
}

static void test_macro(void **state)
{
    (void)state;
    assert_int_equal(kvd_failpoint_set("m.point=EPIPE@2", NULL, 0), KVD_OK);
#ifdef KVD_FAILPOINTS_ENABLED
    assert_int_equal(KVD_FAILPOINT("m.point"), 0);
    assert_int_equal(KVD_FAILPOINT("m.point"), EPIPE);
    assert_int_equal(kvd_failpoint_count("m.point"), 2);
    kvd_failpoint_clear();
    assert_int_equal(__atomic_load_n(&kvd_failpoint_armed_g, __ATOMIC_RELAXED),
                     0);
    assert_int_equal(KVD_FAILPOINT("m.point"), 0);
#else
    /* Compiled out: a constant, never evaluated, even when armed. */
    _Static_assert(KVD_FAILPOINT("m.point") == 0, "constant when disabled");
    assert_int_equal(KVD_FAILPOINT("m.point"), 0);
    assert_int_equal(kvd_failpoint_count("m.point"), 0);
#endif
}

static int block_returned = -1; /* __atomic */

static void *block_hit(void *arg)
{
    (void)arg;
    __atomic_store_n(&block_returned, kvd_failpoint_hit("held"),
                     __ATOMIC_SEQ_CST);
    return NULL;
}

/* "block": the evaluation waits until the armed set is replaced, then
 * passes; evaluations before @N do not wait. */
static void test_block(void **state)
{
    (void)state;
    assert_int_equal(kvd_failpoint_set("held=block@2", NULL, 0), KVD_OK);
    assert_int_equal(kvd_failpoint_hit("held"), 0); /* the first: no wait */
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, block_hit, NULL), 0);
    while (kvd_failpoint_count("held") < 2) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    /* Counted, and held until the set changes. */
    assert_int_equal(__atomic_load_n(&block_returned, __ATOMIC_SEQ_CST), -1);
    assert_int_equal(kvd_failpoint_set("other=EIO", NULL, 0), KVD_OK);
    pthread_join(t, NULL);
    assert_int_equal(__atomic_load_n(&block_returned, __ATOMIC_SEQ_CST), 0);
    __atomic_store_n(&block_returned, -1, __ATOMIC_SEQ_CST);
    assert_int_equal(kvd_failpoint_set("held=block", NULL, 0), KVD_OK);
    assert_int_equal(pthread_create(&t, NULL, block_hit, NULL), 0);
    while (kvd_failpoint_count("held") < 1) {
        struct timespec ts = {0, 1000000L};
        nanosleep(&ts, NULL);
    }
    kvd_failpoint_clear(); /* clearing releases it too */
    pthread_join(t, NULL);
    assert_int_equal(__atomic_load_n(&block_returned, __ATOMIC_SEQ_CST), 0);
}

static void test_every_errno_name(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        int value;
    } names[] = {
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
        {"EPERM", EPERM},
        {"4095", 4095},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        char spec[64];
        snprintf(spec, sizeof(spec), "p=%s", names[i].name);
        assert_int_equal(kvd_failpoint_set(spec, NULL, 0), KVD_OK);
        assert_int_equal(kvd_failpoint_hit("p"), names[i].value);
    }
}

static void test_malformed(void **state)
{
    (void)state;
    static const struct {
        const char *spec;
        kvd_status_t st;
        const char *reason;
    } bad[] = {
        {"nvme.write", KVD_ERR_INVALID, "expected name=ERR"},
        {"=EIO", KVD_ERR_INVALID, "name must be 1..63"},
        {"Nvme=EIO", KVD_ERR_INVALID, "name may hold only"},
        {"a b=EIO", KVD_ERR_INVALID, "name may hold only"},
        {"a=EFOO", KVD_ERR_INVALID, "unknown errno name 'EFOO'"},
        {"a=eio", KVD_ERR_INVALID, "unknown errno name 'eio'"},
        {"a=", KVD_ERR_INVALID, "unknown errno name ''"},
        {"a=0", KVD_ERR_INVALID, "not a number in 1..4095"},
        {"a=4096", KVD_ERR_INVALID, "not a number in 1..4095"},
        {"a=5x", KVD_ERR_INVALID, "not a number in 1..4095"},
        {"a=EIO@", KVD_ERR_INVALID, "expected @N or @N+"},
        {"a=EIO@0", KVD_ERR_INVALID, "expected @N or @N+"},
        {"a=EIO@+", KVD_ERR_INVALID, "expected @N or @N+"},
        {"a=EIO@3++", KVD_ERR_INVALID, "expected @N or @N+"},
        {"a=EIO@3x", KVD_ERR_INVALID, "expected @N or @N+"},
        {"a=EIO@-1", KVD_ERR_INVALID, "expected @N or @N+"},
        {"a=EIO@99999999999999999999", KVD_ERR_INVALID, "expected @N"},
        {"a=EIO@1@2", KVD_ERR_INVALID, "expected @N or @N+"},
        {"a=EIO,", KVD_ERR_INVALID, "empty entry at offset 6"},
        {",a=EIO", KVD_ERR_INVALID, "empty entry at offset 0"},
        {"a=EIO,,b=EIO", KVD_ERR_INVALID, "empty entry at offset 6"},
        {"a=EIO,a=ENOSPC", KVD_ERR_INVALID, "failpoint 'a' given twice"},
        {" a=EIO", KVD_ERR_INVALID, "name may hold only"},
        {"a=EIO ", KVD_ERR_INVALID, "unknown errno name 'EIO '"},
        {"a=delay:", KVD_ERR_INVALID, "expected delay:MS with MS in 1..60000"},
        {"a=delay:0", KVD_ERR_INVALID, "expected delay:MS"},
        {"a=delay:60001", KVD_ERR_INVALID, "expected delay:MS"},
        {"a=delay:5x", KVD_ERR_INVALID, "expected delay:MS"},
        {"a=delay:5@0", KVD_ERR_INVALID, "expected @N or @N+"},
        {"a=blocked", KVD_ERR_INVALID, "unknown errno name 'blocked'"},
        {"a=block@", KVD_ERR_INVALID, "expected @N or @N+"},
    };
    /* A bad spec leaves the armed set as it was. */
    assert_int_equal(kvd_failpoint_set("keep=EIO", NULL, 0), KVD_OK);
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char err[128] = "";
        kvd_status_t st = kvd_failpoint_set(bad[i].spec, err, sizeof(err));
        if (st != bad[i].st || strstr(err, bad[i].reason) == NULL) {
            fail_msg("'%s' -> %d '%s'", bad[i].spec, st, err);
        }
        assert_int_equal(kvd_failpoint_set(bad[i].spec, NULL, 0), bad[i].st);
    }
    assert_int_equal(kvd_failpoint_hit("keep"), EIO);

    /* Bounds: name length and number of entries. */
    char spec[2048];
    memset(spec, 'n', 63);
    snprintf(spec + 63, sizeof(spec) - 63, "=EIO");
    assert_int_equal(kvd_failpoint_set(spec, NULL, 0), KVD_OK);
    memset(spec, 'n', 64);
    snprintf(spec + 64, sizeof(spec) - 64, "=EIO");
    assert_int_equal(kvd_failpoint_set(spec, NULL, 0), KVD_ERR_INVALID);
    size_t n = 0;
    for (int i = 0; i < KVD_FAILPOINT_MAX; i++) {
        n += (size_t)snprintf(spec + n, sizeof(spec) - n, "%sp%d=EIO",
                              i ? "," : "", i);
    }
    assert_int_equal(kvd_failpoint_set(spec, NULL, 0), KVD_OK);
    assert_int_equal(kvd_failpoint_hit("p31"), EIO);
    snprintf(spec + n, sizeof(spec) - n, ",p99=EIO");
    char err[64];
    assert_int_equal(kvd_failpoint_set(spec, err, sizeof(err)), KVD_ERR_RANGE);
    assert_string_equal(err, "more than 32 failpoints");
    /* A short error buffer is cut, never overrun. */
    char small[8];
    memset(small, 'Z', sizeof(small));
    assert_int_equal(kvd_failpoint_set("a=EFOO", small, 6), KVD_ERR_INVALID);
    assert_string_equal(small, "unkno");
    assert_int_equal(small[6], 'Z');
}

static void test_set_replaces_and_clears(void **state)
{
    (void)state;
    assert_int_equal(kvd_failpoint_set("a=EIO,b=ENOSPC", NULL, 0), KVD_OK);
    assert_int_equal(kvd_failpoint_hit("a"), EIO);
    assert_int_equal(kvd_failpoint_set("b=EBUSY@2", NULL, 0), KVD_OK);
    assert_int_equal(kvd_failpoint_hit("a"), 0);
    assert_int_equal(kvd_failpoint_count("a"), 0);
    /* Re-arming resets the count. */
    assert_int_equal(kvd_failpoint_hit("b"), 0);
    assert_int_equal(kvd_failpoint_hit("b"), EBUSY);
    assert_int_equal(kvd_failpoint_set("b=EBUSY@2", NULL, 0), KVD_OK);
    assert_int_equal(kvd_failpoint_count("b"), 0);
    assert_int_equal(kvd_failpoint_hit("b"), 0);

    assert_int_equal(kvd_failpoint_set("", NULL, 0), KVD_OK);
    assert_int_equal(kvd_failpoint_hit("b"), 0);
    assert_int_equal(kvd_failpoint_count("b"), 0);
    assert_int_equal(kvd_failpoint_set("b=EIO", NULL, 0), KVD_OK);
    assert_int_equal(kvd_failpoint_set(NULL, NULL, 0), KVD_OK);
    assert_int_equal(kvd_failpoint_hit("b"), 0);
    assert_int_equal(kvd_failpoint_set("b=EIO", NULL, 0), KVD_OK);
    kvd_failpoint_clear();
    assert_int_equal(kvd_failpoint_hit("b"), 0);
    assert_int_equal(kvd_failpoint_count("b"), 0);
}

#define NUM_THREADS 4
#define HITS_PER_THREAD 20000

static void *hit_thread(void *arg)
{
    uint64_t *failures = arg;
    for (int i = 0; i < HITS_PER_THREAD; i++) {
        if (kvd_failpoint_hit("mt.point") == ETIMEDOUT) {
            (*failures)++;
        }
        (void)kvd_failpoint_hit("mt.unarmed");
    }
    return NULL;
}

static void test_concurrent_hits(void **state)
{
    (void)state;
    assert_int_equal(kvd_failpoint_set("mt.point=ETIMEDOUT@1000+", NULL, 0),
                     KVD_OK);
    pthread_t threads[NUM_THREADS];
    uint64_t failures[NUM_THREADS] = {0};
    for (int i = 0; i < NUM_THREADS; i++) {
        assert_int_equal(
            pthread_create(&threads[i], NULL, hit_thread, &failures[i]), 0);
    }
    uint64_t total = 0;
    for (int i = 0; i < NUM_THREADS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        total += failures[i];
    }
    uint64_t hits = (uint64_t)NUM_THREADS * HITS_PER_THREAD;
    assert_int_equal(kvd_failpoint_count("mt.point"), hits);
    assert_int_equal(total, hits - 999);

    /* @N fires exactly once across all threads. */
    assert_int_equal(kvd_failpoint_set("mt.point=ETIMEDOUT@12345", NULL, 0),
                     KVD_OK);
    memset(failures, 0, sizeof(failures));
    for (int i = 0; i < NUM_THREADS; i++) {
        assert_int_equal(
            pthread_create(&threads[i], NULL, hit_thread, &failures[i]), 0);
    }
    total = 0;
    for (int i = 0; i < NUM_THREADS; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
        total += failures[i];
    }
    assert_int_equal(total, 1);
    assert_int_equal(kvd_failpoint_count("mt.point"), hits);
}

/* --- KVDEPOT_FAILPOINTS: read once, on the first evaluation ------------- */

static int log_count;
static char log_msg[1024];

static void capture_sink(void *arg, kvd_log_level_t level, const char *file,
                         int line, const char *msg)
{
    (void)arg;
    (void)file;
    (void)line;
    if (level == KVD_LOG_LEVEL_ERROR) {
        log_count++;
        snprintf(log_msg, sizeof(log_msg), "%s", msg);
    }
}

/* Child side. mode "good": the env spec is armed; "bad": nothing is armed
 * and the reason is logged; "override": set() before the first evaluation
 * wins over the environment. */
static int env_child(const char *mode)
{
    kvd_log_set_sink(capture_sink, NULL);
    if (strcmp(mode, "good") == 0) {
        int r[4];
        for (int i = 0; i < 4; i++) {
            r[i] = KVD_FAILPOINT("nvme.write");
        }
        if (r[0] != 0 || r[1] != 0 || r[2] != EIO || r[3] != 0) {
            return 10;
        }
        if (kvd_failpoint_hit("arena.alloc") != ENOMEM ||
            kvd_failpoint_count("nvme.write") != 4) {
            return 11;
        }
        return log_count == 0 ? 0 : 12;
    }
    if (strcmp(mode, "bad") == 0) {
        if (kvd_failpoint_hit("nvme.write") != 0 ||
            kvd_failpoint_count("nvme.write") != 0) {
            return 20;
        }
        if (log_count != 1 || strstr(log_msg, "KVDEPOT_FAILPOINTS=") == NULL ||
            strstr(log_msg, "unknown errno name 'EWHAT'") == NULL) {
            return 21;
        }
        return 0;
    }
    if (strcmp(mode, "override") == 0) {
        if (kvd_failpoint_set("other=EPIPE", NULL, 0) != KVD_OK) {
            return 30;
        }
        if (kvd_failpoint_hit("nvme.write") != 0 ||
            kvd_failpoint_hit("other") != EPIPE) {
            return 31;
        }
        return 0;
    }
    return 99;
}

static int run_env_child(const char *env_value, const char *mode)
{
    pid_t pid = fork();
    if (pid == 0) {
        setenv("KVDEPOT_FAILPOINTS", env_value, 1);
        char *args[] = {(char *)"test_failpoint", (char *)"--env-child",
                        (char *)mode, NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    assert_true(pid > 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_env(void **state)
{
    (void)state;
#ifdef KVD_FAILPOINTS_ENABLED
    assert_int_equal(
        run_env_child("nvme.write=EIO@3,arena.alloc=ENOMEM", "good"), 0);
#endif
    assert_int_equal(run_env_child("nvme.write=EWHAT", "bad"), 0);
    assert_int_equal(run_env_child("nvme.write=EIO", "override"), 0);
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--env-child") == 0) {
        return env_child(argv[2]);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_every_evaluation, setup),
        cmocka_unit_test_setup(test_nth_only, setup),
        cmocka_unit_test_setup(test_nth_and_later, setup),
        cmocka_unit_test_setup(test_macro, setup),
        cmocka_unit_test_setup(test_delay, setup),
        cmocka_unit_test_setup(test_block, setup),
        cmocka_unit_test_setup(test_every_errno_name, setup),
        cmocka_unit_test_setup(test_malformed, setup),
        cmocka_unit_test_setup(test_set_replaces_and_clears, setup),
        cmocka_unit_test_setup(test_concurrent_hits, setup),
        cmocka_unit_test_setup(test_env, setup),
    };
    /* The test process must not inherit failpoints from its caller. */
    unsetenv("KVDEPOT_FAILPOINTS");
    return cmocka_run_group_tests(tests, NULL, NULL);
}
