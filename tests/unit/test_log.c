/*
 * Logging: level parsing and clamping, sink capture with source location,
 * lazy argument evaluation, truncation, rate limiting, the default stderr
 * line format, KVDEPOT_LOG_LEVEL (read once per process, so checked in a
 * re-executed child) and sink swaps under concurrent logging.
 */
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log_int.h"

typedef struct captured {
    int count;
    kvd_log_level_t level;
    const char *file;
    int line;
    char msg[4096];
} captured_t;

static void capture_sink(void *arg, kvd_log_level_t level, const char *file,
                         int line, const char *msg)
{
    captured_t *c = arg;
    c->count++;
    c->level = level;
    c->file = file;
    c->line = line;
    snprintf(c->msg, sizeof(c->msg), "%s", msg);
}

static captured_t cap;

static int setup(void **state)
{
    (void)state;
    memset(&cap, 0, sizeof(cap));
    kvd_log_set_sink(capture_sink, &cap);
    kvd_log_set_level(KVD_LOG_LEVEL_WARN);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    kvd_log_set_sink(NULL, NULL);
    kvd_log_set_level(KVD_LOG_LEVEL_WARN);
    return 0;
}

static void test_level_parse(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        kvd_log_level_t level;
    } ok[] = {
        {"error", KVD_LOG_LEVEL_ERROR}, {"WARN", KVD_LOG_LEVEL_WARN},
        {"Info", KVD_LOG_LEVEL_INFO},   {"debug", KVD_LOG_LEVEL_DEBUG},
        {"trace", KVD_LOG_LEVEL_TRACE}, {"off", KVD_LOG_LEVEL_OFF},
        {"OFF", KVD_LOG_LEVEL_OFF},
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        kvd_log_level_t level = KVD_LOG_LEVEL_INFO;
        assert_int_equal(kvd_log_level_parse(ok[i].text, &level), KVD_OK);
        assert_int_equal(level, ok[i].level);
    }
    static const char *const bad[] = {"", "warning", "err", " warn", "5"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kvd_log_level_t level = KVD_LOG_LEVEL_INFO;
        assert_int_equal(kvd_log_level_parse(bad[i], &level), KVD_ERR_INVALID);
        assert_int_equal(level, KVD_LOG_LEVEL_INFO);
    }
    kvd_log_level_t level;
    assert_int_equal(kvd_log_level_parse(NULL, &level), KVD_ERR_INVALID);
    assert_int_equal(kvd_log_level_parse("warn", NULL), KVD_ERR_INVALID);
}

static void test_set_get_level(void **state)
{
    (void)state;
    kvd_log_set_level(KVD_LOG_LEVEL_DEBUG);
    assert_int_equal(kvd_log_get_level(), KVD_LOG_LEVEL_DEBUG);
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    assert_int_equal(kvd_log_get_level(), KVD_LOG_LEVEL_OFF);
    /* Out-of-range levels clamp. */
    kvd_log_set_level((kvd_log_level_t)99);
    assert_int_equal(kvd_log_get_level(), KVD_LOG_LEVEL_TRACE);
    kvd_log_set_level((kvd_log_level_t)-7);
    assert_int_equal(kvd_log_get_level(), KVD_LOG_LEVEL_OFF);
}

static void test_sink_capture(void **state)
{
    (void)state;
    KVD_LOG_WARN("block %d of %s", 7, "req-1");
    int line = __LINE__ - 1;
    assert_int_equal(cap.count, 1);
    assert_int_equal(cap.level, KVD_LOG_LEVEL_WARN);
    assert_string_equal(cap.file, __FILE__);
    assert_int_equal(cap.line, line);
    assert_string_equal(cap.msg, "block 7 of req-1");

    KVD_LOG_ERROR("boom");
    assert_int_equal(cap.count, 2);
    assert_int_equal(cap.level, KVD_LOG_LEVEL_ERROR);
    KVD_LOG_INFO("not at warn");
    KVD_LOG_DEBUG("not at warn");
    KVD_LOG_TRACE("not at warn");
    assert_int_equal(cap.count, 2);
    kvd_log_set_level(KVD_LOG_LEVEL_TRACE);
    KVD_LOG_TRACE("t");
    assert_int_equal(cap.count, 3);
    assert_int_equal(cap.level, KVD_LOG_LEVEL_TRACE);
    /* OFF is a threshold, never a message level. */
    kvd_log_write(KVD_LOG_LEVEL_OFF, __FILE__, __LINE__, "never");
    assert_int_equal(cap.count, 3);
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);
    KVD_LOG_ERROR("off");
    assert_int_equal(cap.count, 3);
}

static int evaluations;

static int count_evaluation(void)
{
    return ++evaluations;
}

static void test_args_not_evaluated(void **state)
{
    (void)state;
    evaluations = 0;
    kvd_log_set_level(KVD_LOG_LEVEL_ERROR);
    KVD_LOG_DEBUG("%d", count_evaluation());
    KVD_LOG_WARN("%d", count_evaluation());
    KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_INFO, 1000, "%d", count_evaluation());
    assert_int_equal(evaluations, 0);
    assert_int_equal(cap.count, 0);
    KVD_LOG_ERROR("%d", count_evaluation());
    assert_int_equal(evaluations, 1);
    assert_string_equal(cap.msg, "1");
}

static void test_long_message_truncated(void **state)
{
    (void)state;
    char big[5000];
    memset(big, 'a', sizeof(big) - 1);
    big[sizeof(big) - 1] = '\0';
    KVD_LOG_WARN("%s", big);
    assert_int_equal(cap.count, 1);
    size_t len = strlen(cap.msg);
    assert_int_equal(len, 2047);
    assert_string_equal(cap.msg + len - 4, "[..]");
    assert_int_equal(cap.msg[len - 5], 'a');
    /* Exactly at the limit: not cut. */
    big[2047] = '\0';
    KVD_LOG_WARN("%s", big);
    assert_int_equal(cap.count, 2);
    assert_int_equal(strlen(cap.msg), 2047);
    assert_int_equal(cap.msg[2046], 'a');
}

/* One call site, so every call shares its rate-limit state. */
static void log_limited(int i, uint64_t interval_ms)
{
    KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, interval_ms, "disk slow %d", i);
}

static void test_ratelimited(void **state)
{
    (void)state;
    for (int i = 0; i < 5; i++) {
        log_limited(i, 300);
    }
    assert_int_equal(cap.count, 1);
    assert_string_equal(cap.msg, "disk slow 0 (0 similar suppressed)");
    usleep(400 * 1000);
    log_limited(5, 300);
    assert_int_equal(cap.count, 2);
    assert_string_equal(cap.msg, "disk slow 5 (4 similar suppressed)");
    log_limited(6, 300);
    assert_int_equal(cap.count, 2);
}

/* Runs `fn` with fd 2 pointing at a temporary file; returns its text. */
static void stderr_capture(void (*fn)(void), char *out, size_t out_len)
{
    char path[] = "/tmp/kvd_test_log_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    unlink(path);
    int saved = dup(STDERR_FILENO);
    assert_true(saved >= 0);
    assert_true(dup2(fd, STDERR_FILENO) >= 0);
    fn();
    assert_true(dup2(saved, STDERR_FILENO) >= 0);
    close(saved);
    ssize_t n = pread(fd, out, out_len - 1, 0);
    assert_true(n >= 0);
    out[n] = '\0';
    close(fd);
}

static int default_line;

static void log_to_default(void)
{
    KVD_LOG_WARN("hello %s", "stderr");
    default_line = __LINE__ - 1;
    KVD_LOG_ERROR("second");
}

static void test_default_sink_format(void **state)
{
    (void)state;
    kvd_log_set_sink(NULL, NULL);
    char text[1024];
    stderr_capture(log_to_default, text, sizeof(text));
    assert_int_equal(cap.count, 0);

    /* "2024-05-01T12:34:56.789Z kvdepot warn  test_log.c:123 hello\n" */
    char *second = strchr(text, '\n');
    assert_non_null(second);
    *second++ = '\0';
    int y, mo, d, h, mi, s, ms, consumed = 0;
    assert_int_equal(sscanf(text, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ %n", &y, &mo,
                            &d, &h, &mi, &s, &ms, &consumed),
                     7);
    assert_int_equal(consumed, 25);
    assert_true(y >= 2024 && mo >= 1 && mo <= 12 && d >= 1 && d <= 31);
    char want[128];
    snprintf(want, sizeof(want), "kvdepot warn  test_log.c:%d hello stderr",
             default_line);
    assert_string_equal(text + consumed, want);
    snprintf(want, sizeof(want), "kvdepot error test_log.c:%d second\n",
             default_line + 2);
    assert_string_equal(second + 25, want);
}

/* Sink swaps while threads log: every message reaches exactly one sink. */
static int sink_a_count, sink_b_count;

static void counting_sink(void *arg, kvd_log_level_t level, const char *file,
                          int line, const char *msg)
{
    (void)level;
    (void)file;
    (void)line;
    (void)msg;
    __atomic_fetch_add((int *)arg, 1, __ATOMIC_RELAXED);
}

static void *log_thread(void *arg)
{
    (void)arg;
    for (int i = 0; i < 2000; i++) {
        KVD_LOG_WARN("m %d", i);
    }
    return NULL;
}

static void test_sink_swap_concurrent(void **state)
{
    (void)state;
    sink_a_count = sink_b_count = 0;
    kvd_log_set_sink(counting_sink, &sink_a_count);
    pthread_t threads[4];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_create(&threads[i], NULL, log_thread, NULL),
                         0);
    }
    for (int i = 0; i < 200; i++) {
        kvd_log_set_sink(counting_sink, i % 2 ? &sink_a_count : &sink_b_count);
    }
    for (int i = 0; i < 4; i++) {
        assert_int_equal(pthread_join(threads[i], NULL), 0);
    }
    kvd_log_set_sink(capture_sink, &cap);
    assert_int_equal(__atomic_load_n(&sink_a_count, __ATOMIC_RELAXED) +
                         __atomic_load_n(&sink_b_count, __ATOMIC_RELAXED),
                     8000);
}

/* --- KVDEPOT_LOG_LEVEL: the level is read once, so a fresh process ----- */

static const char *self_path = "/proc/self/exe";

/* Child side: argv = {prog, "--env-child", expected level, expect warning}. */
static int env_child(const char *expected, const char *expect_warning)
{
    captured_t c;
    memset(&c, 0, sizeof(c));
    kvd_log_set_sink(capture_sink, &c);
    kvd_log_level_t want;
    if (kvd_log_level_parse(expected, &want) != KVD_OK) {
        return 10;
    }
    if (kvd_log_get_level() != want) {
        return 11;
    }
    /* A second read must not consult the environment again. */
    setenv("KVDEPOT_LOG_LEVEL", "trace", 1);
    if (kvd_log_get_level() != want) {
        return 12;
    }
    if (strcmp(expect_warning, "1") == 0) {
        if (c.count != 1 || c.level != KVD_LOG_LEVEL_WARN ||
            strstr(c.msg, "KVDEPOT_LOG_LEVEL='") == NULL) {
            return 13;
        }
    } else if (c.count != 0) {
        return 14;
    }
    return 0;
}

static int run_env_child(const char *env_value, const char *expected,
                         const char *expect_warning)
{
    pid_t pid = fork();
    if (pid == 0) {
        if (env_value != NULL) {
            setenv("KVDEPOT_LOG_LEVEL", env_value, 1);
        } else {
            unsetenv("KVDEPOT_LOG_LEVEL");
        }
        char *args[] = {(char *)"test_log", (char *)"--env-child",
                        (char *)expected, (char *)expect_warning, NULL};
        execv(self_path, args);
        _exit(127);
    }
    assert_true(pid > 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

static void test_env_level(void **state)
{
    (void)state;
    assert_int_equal(run_env_child("debug", "debug", "0"), 0);
    assert_int_equal(run_env_child("ERROR", "error", "0"), 0);
    assert_int_equal(run_env_child("off", "off", "0"), 0);
    assert_int_equal(run_env_child(NULL, "warn", "0"), 0);
    assert_int_equal(run_env_child("", "warn", "0"), 0);
    assert_int_equal(run_env_child("loud", "warn", "1"), 0);
    /* The child really checks: a wrong expectation fails. */
    assert_int_equal(run_env_child("info", "debug", "0"), 11);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--env-child") == 0) {
        return env_child(argv[2], argv[3]);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_level_parse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_get_level, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sink_capture, setup, teardown),
        cmocka_unit_test_setup_teardown(test_args_not_evaluated, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_long_message_truncated, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_ratelimited, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_sink_format, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_sink_swap_concurrent, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_env_level, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
