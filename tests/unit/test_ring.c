/*
 * MPSC ring (common/ring_int.h): argument checks, exact capacity and FIFO
 * order, elements of any size copied intact, multi-producer stress through a
 * tiny and a large ring, wake-ups through kvd_ring_wait() and through a
 * consumer that sleeps in poll() on kvd_ring_fd(), timeouts that survive
 * signals, and destroy with elements left (no leak under ASan, fd closed).
 *
 * Worker threads never call cmocka asserts (they are not thread-safe); they
 * record failures that the test thread checks after joining.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/failpoint_int.h"
#include "common/ring_int.h"
#include "common/time_int.h"

/* ThreadSanitizer makes every atomic and syscall far slower; the stress
 * tests scale down so that they still finish in seconds on two cores. */
#if defined(__SANITIZE_THREAD__)
#define TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_UNDER_TSAN 1
#endif
#endif
#ifdef TEST_UNDER_TSAN
#define STRESS_PER_PRODUCER 20000u
#define POLL_PER_PRODUCER 5000u
#else
#define STRESS_PER_PRODUCER 200000u
#define POLL_PER_PRODUCER 50000u
#endif

#define NUM_PRODUCERS 4
/* Long enough that only a lost wake-up can reach it. */
#define HANG_TIMEOUT_MS 20000

typedef struct test_rec {
    uint32_t producer;
    uint32_t pad;
    uint64_t seq;
} test_rec_t;

typedef struct test_producer {
    pthread_t thread;
    kvd_ring_t *ring;
    uint64_t count;
    uint64_t busy_retries;
    uint32_t id;
    unsigned pause_every; /* 0: never; else sleep briefly every N pushes */
    kvd_status_t failure; /* first status other than OK or BUSY */
} test_producer_t;

static uint64_t elapsed_ms_since(uint64_t start_ns)
{
    return (kvd_time_now_ns() - start_ns) / KVD_NSEC_PER_MSEC;
}

static void sleep_us(long usec)
{
    struct timespec ts = {.tv_sec = usec / 1000000,
                          .tv_nsec = (usec % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Readiness of the ring's eventfd right now (poll with timeout 0). */
static int fd_readable(const kvd_ring_t *ring)
{
    struct pollfd pfd = {.fd = kvd_ring_fd(ring), .events = POLLIN};
    int rc = poll(&pfd, 1, 0);
    return rc == 1 && (pfd.revents & POLLIN) != 0;
}

static void test_create_rejects_bad_geometry(void **state)
{
    (void)state;
    static const size_t bad_capacity[] = {
        0, 1, 3, 6, 12, 1000, (size_t)KVD_RING_CAPACITY_MAX * 2, SIZE_MAX};
    static const size_t bad_elem_size[] = {0, KVD_RING_ELEM_SIZE_MAX + 1,
                                           SIZE_MAX};
    int sentinel;
    kvd_ring_t *ring = (kvd_ring_t *)&sentinel;

    for (size_t i = 0; i < sizeof(bad_capacity) / sizeof(*bad_capacity); i++) {
        assert_int_equal(kvd_ring_create(bad_capacity[i], 8, &ring),
                         KVD_ERR_INVALID);
        assert_ptr_equal(ring, (kvd_ring_t *)&sentinel);
    }
    for (size_t i = 0; i < sizeof(bad_elem_size) / sizeof(*bad_elem_size);
         i++) {
        assert_int_equal(kvd_ring_create(8, bad_elem_size[i], &ring),
                         KVD_ERR_INVALID);
        assert_ptr_equal(ring, (kvd_ring_t *)&sentinel);
    }
    /* Each factor is allowed, their product is not. */
    assert_int_equal(
        kvd_ring_create(KVD_RING_CAPACITY_MAX, KVD_RING_ELEM_SIZE_MAX, &ring),
        KVD_ERR_INVALID);
    assert_ptr_equal(ring, (kvd_ring_t *)&sentinel);
    assert_int_equal(kvd_ring_create(8, 8, NULL), KVD_ERR_INVALID);

    /* The smallest and largest valid shapes. */
    assert_int_equal(kvd_ring_create(2, 1, &ring), KVD_OK);
    kvd_ring_destroy(ring);
    assert_int_equal(kvd_ring_create(2, KVD_RING_ELEM_SIZE_MAX, &ring), KVD_OK);
    kvd_ring_destroy(ring);
    kvd_ring_destroy(NULL);
}

static void test_create_reports_resource_failures(void **state)
{
    (void)state;
#ifdef KVD_FAILPOINTS_ENABLED
    int sentinel;
    kvd_ring_t *ring = (kvd_ring_t *)&sentinel;

    assert_int_equal(kvd_failpoint_set("ring.alloc=ENOMEM", NULL, 0), KVD_OK);
    assert_int_equal(kvd_ring_create(8, 8, &ring), KVD_ERR_NOMEM);
    assert_ptr_equal(ring, (kvd_ring_t *)&sentinel);

    /* The allocation made before eventfd fails is freed (ASan checks). */
    assert_int_equal(kvd_failpoint_set("ring.eventfd=ENOMEM", NULL, 0), KVD_OK);
    assert_int_equal(kvd_ring_create(8, 8, &ring), KVD_ERR_NOMEM);
    assert_ptr_equal(ring, (kvd_ring_t *)&sentinel);
    assert_int_equal(kvd_failpoint_set("ring.eventfd=EIO", NULL, 0), KVD_OK);
    assert_int_equal(kvd_ring_create(8, 8, &ring), KVD_ERR_IO);
    assert_ptr_equal(ring, (kvd_ring_t *)&sentinel);

    kvd_failpoint_clear();
    assert_int_equal(kvd_ring_create(8, 8, &ring), KVD_OK);
    kvd_ring_destroy(ring);
#else
    skip();
#endif
}

static void test_calls_reject_null(void **state)
{
    (void)state;
    kvd_ring_t *ring = NULL;
    uint64_t value = 7, out = 0;

    assert_int_equal(kvd_ring_create(4, sizeof(value), &ring), KVD_OK);
    assert_int_equal(kvd_ring_push(NULL, &value), KVD_ERR_INVALID);
    assert_int_equal(kvd_ring_push(ring, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_ring_size_approx(ring), 0);
    assert_int_equal(kvd_ring_push(ring, &value), KVD_OK);

    assert_int_equal(kvd_ring_pop(NULL, &out, 1), 0);
    assert_int_equal(kvd_ring_pop(ring, NULL, 1), 0);
    assert_int_equal(kvd_ring_pop(ring, &out, 0), 0);
    assert_int_equal(kvd_ring_size_approx(ring), 1);
    assert_int_equal(kvd_ring_pop(ring, &out, 1), 1);
    assert_int_equal(out, 7);

    assert_int_equal(kvd_ring_fd(NULL), -1);
    assert_false(kvd_ring_arm(NULL));
    assert_int_equal(kvd_ring_wait(NULL, 0), KVD_ERR_INVALID);
    assert_int_equal(kvd_ring_size_approx(NULL), 0);
    kvd_ring_destroy(ring);
}

static void test_fd_is_nonblocking_cloexec_eventfd(void **state)
{
    (void)state;
    kvd_ring_t *ring = NULL;
    assert_int_equal(kvd_ring_create(4, 8, &ring), KVD_OK);
    int fd = kvd_ring_fd(ring);
    assert_true(fd >= 0);
    assert_true((fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0);
    assert_true((fcntl(fd, F_GETFL) & O_NONBLOCK) != 0);
    assert_false(fd_readable(ring));
    kvd_ring_destroy(ring);
}

static void test_full_at_capacity_then_fifo(void **state)
{
    (void)state;
    enum { CAP = 8 };
    kvd_ring_t *ring = NULL;
    uint64_t out[2 * CAP];

    assert_int_equal(kvd_ring_create(CAP, sizeof(uint64_t), &ring), KVD_OK);
    for (int round = 0; round < 3; round++) {
        for (uint64_t i = 0; i < CAP; i++) {
            uint64_t value = 100 * (uint64_t)round + i;
            assert_int_equal(kvd_ring_push(ring, &value), KVD_OK);
            assert_int_equal(kvd_ring_size_approx(ring), i + 1);
        }
        uint64_t rejected = 999;
        assert_int_equal(kvd_ring_push(ring, &rejected), KVD_ERR_BUSY);
        assert_int_equal(kvd_ring_push(ring, &rejected), KVD_ERR_BUSY);
        assert_int_equal(kvd_ring_size_approx(ring), CAP);

        /* A rejected push left nothing behind: exactly CAP elements, in
         * push order. */
        memset(out, 0xff, sizeof(out));
        assert_int_equal(kvd_ring_pop(ring, out, sizeof(out) / sizeof(*out)),
                         CAP);
        for (uint64_t i = 0; i < CAP; i++) {
            assert_int_equal(out[i], 100 * (uint64_t)round + i);
        }
        assert_int_equal(out[CAP], UINT64_MAX); /* nothing written beyond */
        assert_int_equal(kvd_ring_pop(ring, out, sizeof(out) / sizeof(*out)),
                         0);
        assert_int_equal(kvd_ring_size_approx(ring), 0);
    }
    kvd_ring_destroy(ring);
}

/* Pushes and pops in uneven batches through a 4-slot ring for tens of
 * thousands of laps, checking order and the exact size at every step. */
static void test_wraps_around_many_times(void **state)
{
    (void)state;
    kvd_ring_t *ring = NULL;
    uint64_t next_push = 0, next_pop = 0, out[8];
    uint32_t lcg = 12345;

    assert_int_equal(kvd_ring_create(4, sizeof(uint64_t), &ring), KVD_OK);
    while (next_pop < 200000) {
        lcg = lcg * 1103515245u + 12345u;
        unsigned to_push = (lcg >> 16) % 6;
        unsigned to_pop = (lcg >> 24) % 6;
        for (unsigned i = 0; i < to_push; i++) {
            kvd_status_t st = kvd_ring_push(ring, &next_push);
            if (next_push - next_pop == 4) {
                assert_int_equal(st, KVD_ERR_BUSY);
                break;
            }
            assert_int_equal(st, KVD_OK);
            next_push++;
        }
        assert_int_equal(kvd_ring_size_approx(ring), next_push - next_pop);
        size_t expect = next_push - next_pop < to_pop
                            ? (size_t)(next_push - next_pop)
                            : to_pop;
        assert_int_equal(kvd_ring_pop(ring, out, to_pop), expect);
        for (size_t i = 0; i < expect; i++) {
            assert_int_equal(out[i], next_pop++);
        }
    }
    kvd_ring_destroy(ring);
}

static void fill_pattern(unsigned char *buf, size_t size, uint32_t tag)
{
    for (size_t i = 0; i < size; i++) {
        buf[i] = (unsigned char)((size_t)tag * 131u + i * 7u + (i >> 8));
    }
}

static void test_odd_sizes_copied_intact(void **state)
{
    (void)state;
    static const size_t sizes[] = {
        1,  2,  3,   5,   7,    9,    13,
        63, 65, 127, 255, 1000, 4095, KVD_RING_ELEM_SIZE_MAX};
    enum { CAP = 8, BATCH = 3, GUARD = 64 };
    static unsigned char in[KVD_RING_ELEM_SIZE_MAX];
    static unsigned char want[KVD_RING_ELEM_SIZE_MAX];
    static unsigned char out[BATCH * KVD_RING_ELEM_SIZE_MAX + GUARD];

    for (size_t s = 0; s < sizeof(sizes) / sizeof(*sizes); s++) {
        size_t size = sizes[s];
        kvd_ring_t *ring = NULL;
        uint32_t pushed = 0, popped = 0;
        assert_int_equal(kvd_ring_create(CAP, size, &ring), KVD_OK);
        for (int lap = 0; lap < 3; lap++) {
            while (pushed - popped < CAP) {
                fill_pattern(in, size, pushed++);
                assert_int_equal(kvd_ring_push(ring, in), KVD_OK);
            }
            fill_pattern(in, size, 0xdead);
            assert_int_equal(kvd_ring_push(ring, in), KVD_ERR_BUSY);
            /* Pop in batches; bytes past the batch stay untouched. */
            while (popped < pushed) {
                memset(out, 0xa5, sizeof(out));
                size_t n = kvd_ring_pop(ring, out, BATCH);
                size_t expect =
                    pushed - popped < BATCH ? pushed - popped : BATCH;
                assert_int_equal(n, expect);
                for (size_t i = 0; i < n; i++) {
                    fill_pattern(want, size, popped++);
                    assert_memory_equal(out + i * size, want, size);
                }
                for (size_t i = n * size; i < n * size + GUARD; i++) {
                    assert_int_equal(out[i], 0xa5);
                }
            }
        }
        kvd_ring_destroy(ring);
    }
}

static void *producer_main(void *arg)
{
    test_producer_t *p = arg;
    for (uint64_t seq = 0; seq < p->count; seq++) {
        test_rec_t rec = {.producer = p->id, .seq = seq};
        kvd_status_t st;
        while ((st = kvd_ring_push(p->ring, &rec)) == KVD_ERR_BUSY) {
            p->busy_retries++;
            sched_yield();
        }
        if (st != KVD_OK) {
            p->failure = st;
            return NULL;
        }
        if (p->pause_every != 0 && seq % p->pause_every == 0) {
            sleep_us(50 + (long)(seq / p->pause_every % 4) * 50);
        }
    }
    return NULL;
}

static void start_producers(test_producer_t *prod, int num, kvd_ring_t *ring,
                            uint64_t count, unsigned pause_every)
{
    for (int i = 0; i < num; i++) {
        prod[i] = (test_producer_t){.ring = ring,
                                    .id = (uint32_t)i,
                                    .count = count,
                                    .pause_every = pause_every,
                                    .failure = KVD_OK};
        assert_int_equal(
            pthread_create(&prod[i].thread, NULL, producer_main, &prod[i]), 0);
    }
}

/* Checks a popped batch against per-producer counters: every element
 * arrives once, in the order its producer pushed it. */
static void check_batch(const test_rec_t *recs, size_t n, uint64_t *next,
                        int num_producers)
{
    for (size_t i = 0; i < n; i++) {
        assert_true(recs[i].producer < (uint32_t)num_producers);
        assert_int_equal(recs[i].seq, next[recs[i].producer]);
        next[recs[i].producer]++;
    }
}

static uint64_t join_producers(test_producer_t *prod, int num)
{
    uint64_t busy = 0;
    for (int i = 0; i < num; i++) {
        assert_int_equal(pthread_join(prod[i].thread, NULL), 0);
        assert_int_equal(prod[i].failure, KVD_OK);
        busy += prod[i].busy_retries;
    }
    return busy;
}

static void run_stress_with_wait(size_t capacity)
{
    kvd_ring_t *ring = NULL;
    test_producer_t prod[NUM_PRODUCERS];
    uint64_t next[NUM_PRODUCERS] = {0};
    const uint64_t total = (uint64_t)NUM_PRODUCERS * STRESS_PER_PRODUCER;
    test_rec_t recs[64];

    assert_int_equal(kvd_ring_create(capacity, sizeof(test_rec_t), &ring),
                     KVD_OK);
    start_producers(prod, NUM_PRODUCERS, ring, STRESS_PER_PRODUCER, 0);
    for (uint64_t received = 0; received < total;) {
        assert_int_equal(kvd_ring_wait(ring, HANG_TIMEOUT_MS), KVD_OK);
        /* OK promises that pop returns at least one element. */
        size_t n = kvd_ring_pop(ring, recs, 64);
        assert_true(n >= 1);
        check_batch(recs, n, next, NUM_PRODUCERS);
        received += n;
    }
    uint64_t busy = join_producers(prod, NUM_PRODUCERS);
    for (int i = 0; i < NUM_PRODUCERS; i++) {
        assert_int_equal(next[i], STRESS_PER_PRODUCER);
    }
    assert_int_equal(kvd_ring_pop(ring, recs, 64), 0);
    assert_int_equal(kvd_ring_size_approx(ring), 0);
    assert_int_equal(kvd_ring_wait(ring, 0), KVD_ERR_TIMEOUT);
    print_message("capacity %zu: %llu elements, %llu busy retries\n", capacity,
                  (unsigned long long)total, (unsigned long long)busy);
    kvd_ring_destroy(ring);
}

static void test_stress_tiny_ring(void **state)
{
    (void)state;
    run_stress_with_wait(4);
}

static void test_stress_large_ring(void **state)
{
    (void)state;
    run_stress_with_wait(4096);
}

/* The epoll-style consumer from common/ring_int.h: it only ever sleeps in
 * poll() on the fd after kvd_ring_arm(). Producers pause now and then so
 * that it really sleeps; a lost wake-up shows as a poll() timeout. */
static void test_poll_consumer_misses_nothing(void **state)
{
    (void)state;
    enum { NUM = 2 };
    kvd_ring_t *ring = NULL;
    test_producer_t prod[NUM];
    uint64_t next[NUM] = {0};
    const uint64_t total = (uint64_t)NUM * POLL_PER_PRODUCER;
    test_rec_t recs[16];
    uint64_t sleeps = 0;

    assert_int_equal(kvd_ring_create(64, sizeof(test_rec_t), &ring), KVD_OK);
    start_producers(prod, NUM, ring, POLL_PER_PRODUCER, 32);
    for (uint64_t received = 0; received < total;) {
        size_t n = kvd_ring_pop(ring, recs, 16);
        check_batch(recs, n, next, NUM);
        received += n;
        if (n == 0 && kvd_ring_arm(ring)) {
            struct pollfd pfd = {.fd = kvd_ring_fd(ring), .events = POLLIN};
            int rc = poll(&pfd, 1, HANG_TIMEOUT_MS);
            if (rc < 0 && errno == EINTR) {
                continue;
            }
            assert_int_equal(rc, 1); /* 0 would be a lost wake-up */
            sleeps++;
        }
    }
    join_producers(prod, NUM);
    for (int i = 0; i < NUM; i++) {
        assert_int_equal(next[i], POLL_PER_PRODUCER);
    }
    assert_true(sleeps > 0);
    print_message("poll consumer slept %llu times for %llu elements\n",
                  (unsigned long long)sleeps, (unsigned long long)total);
    kvd_ring_destroy(ring);
}

/* The fd is readable exactly when the protocol says: not for pushes to an
 * unarmed ring, once per arming however many pushes follow, and cleared by
 * the next arm. */
static void test_fd_signals_once_per_arming(void **state)
{
    (void)state;
    kvd_ring_t *ring = NULL;
    uint64_t value = 1, out[4];

    assert_int_equal(kvd_ring_create(8, sizeof(value), &ring), KVD_OK);
    assert_int_equal(kvd_ring_push(ring, &value), KVD_OK);
    assert_false(fd_readable(ring));  /* unarmed: no system call */
    assert_false(kvd_ring_arm(ring)); /* not empty: do not sleep */
    assert_int_equal(kvd_ring_pop(ring, out, 4), 1);

    assert_true(kvd_ring_arm(ring));
    assert_false(fd_readable(ring));
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kvd_ring_push(ring, &value), KVD_OK);
        assert_true(fd_readable(ring));
    }
    uint64_t counter = 0;
    assert_int_equal(read(kvd_ring_fd(ring), &counter, sizeof(counter)),
                     sizeof(counter));
    assert_int_equal(counter, 1); /* one write for three pushes */

    /* A stale signal is cleared by the next arm, even one that finds
     * elements waiting. */
    assert_int_equal(kvd_ring_pop(ring, out, 4), 3);
    assert_true(kvd_ring_arm(ring));
    assert_int_equal(kvd_ring_push(ring, &value), KVD_OK);
    assert_true(fd_readable(ring));
    assert_false(kvd_ring_arm(ring));
    assert_false(fd_readable(ring));
    assert_int_equal(kvd_ring_pop(ring, out, 4), 1);
    kvd_ring_destroy(ring);
}

static void test_wait_times_out_after_timeout(void **state)
{
    (void)state;
    kvd_ring_t *ring = NULL;
    assert_int_equal(kvd_ring_create(4, 8, &ring), KVD_OK);

    uint64_t start = kvd_time_now_ns();
    assert_int_equal(kvd_ring_wait(ring, 0), KVD_ERR_TIMEOUT);
    assert_true(elapsed_ms_since(start) < 2000);

    start = kvd_time_now_ns();
    assert_int_equal(kvd_ring_wait(ring, 150), KVD_ERR_TIMEOUT);
    uint64_t waited = elapsed_ms_since(start);
    assert_true(waited >= 150);
    assert_true(waited < 150 + 2000);
    kvd_ring_destroy(ring);
}

static void test_wait_returns_at_once_when_not_empty(void **state)
{
    (void)state;
    kvd_ring_t *ring = NULL;
    uint64_t value = 42, out = 0;
    assert_int_equal(kvd_ring_create(4, sizeof(value), &ring), KVD_OK);
    assert_int_equal(kvd_ring_push(ring, &value), KVD_OK);

    uint64_t start = kvd_time_now_ns();
    assert_int_equal(kvd_ring_wait(ring, 0), KVD_OK);
    assert_int_equal(kvd_ring_wait(ring, -1), KVD_OK);
    assert_int_equal(kvd_ring_wait(ring, 60000), KVD_OK);
    assert_true(elapsed_ms_since(start) < 2000);
    /* Waiting does not consume. */
    assert_int_equal(kvd_ring_pop(ring, &out, 1), 1);
    assert_int_equal(out, 42);
    kvd_ring_destroy(ring);
}

static void *delayed_push_main(void *arg)
{
    kvd_ring_t *ring = arg;
    uint64_t value = 5;
    sleep_us(50000);
    kvd_ring_push(ring, &value);
    return NULL;
}

static void test_wait_forever_wakes_on_push(void **state)
{
    (void)state;
    kvd_ring_t *ring = NULL;
    pthread_t thread;
    uint64_t out = 0;
    assert_int_equal(kvd_ring_create(4, sizeof(out), &ring), KVD_OK);
    assert_int_equal(pthread_create(&thread, NULL, delayed_push_main, ring), 0);
    assert_int_equal(kvd_ring_wait(ring, -1), KVD_OK);
    assert_int_equal(kvd_ring_pop(ring, &out, 1), 1);
    assert_int_equal(out, 5);
    assert_int_equal(pthread_join(thread, NULL), 0);
    kvd_ring_destroy(ring);
}

static volatile sig_atomic_t signals_seen;

static void on_sigusr1(int sig)
{
    (void)sig;
    signals_seen = signals_seen + 1;
}

typedef struct test_signaller {
    pthread_t target;
    atomic_int stop;
} test_signaller_t;

static void *signaller_main(void *arg)
{
    test_signaller_t *s = arg;
    while (atomic_load(&s->stop) == 0) {
        sleep_us(20000);
        pthread_kill(s->target, SIGUSR1);
    }
    return NULL;
}

/* Signals interrupt poll() with EINTR; the wait goes on to the deadline
 * fixed on entry instead of returning early or starting over. */
static void test_wait_keeps_deadline_across_signals(void **state)
{
    (void)state;
    kvd_ring_t *ring = NULL;
    struct sigaction sa = {.sa_handler = on_sigusr1}, old_sa;
    test_signaller_t sig = {.target = pthread_self()};
    pthread_t thread;

    sigemptyset(&sa.sa_mask); /* no SA_RESTART: poll() sees EINTR */
    assert_int_equal(sigaction(SIGUSR1, &sa, &old_sa), 0);
    assert_int_equal(kvd_ring_create(4, 8, &ring), KVD_OK);
    signals_seen = 0;
    atomic_init(&sig.stop, 0);
    assert_int_equal(pthread_create(&thread, NULL, signaller_main, &sig), 0);

    uint64_t start = kvd_time_now_ns();
    kvd_status_t st = kvd_ring_wait(ring, 300);
    uint64_t waited = elapsed_ms_since(start);
    atomic_store(&sig.stop, 1);
    assert_int_equal(pthread_join(thread, NULL), 0);

    assert_int_equal(st, KVD_ERR_TIMEOUT);
    assert_true(waited >= 300);
    assert_true(waited < 300 + 2000);
    assert_true(signals_seen > 0);
    assert_int_equal(sigaction(SIGUSR1, &old_sa, NULL), 0);
    kvd_ring_destroy(ring);
}

static void test_destroy_with_elements_left(void **state)
{
    (void)state;
    kvd_ring_t *ring = NULL;
    unsigned char elem[100];
    memset(elem, 0x5a, sizeof(elem));
    assert_int_equal(kvd_ring_create(16, sizeof(elem), &ring), KVD_OK);
    for (int i = 0; i < 5; i++) {
        assert_int_equal(kvd_ring_push(ring, elem), KVD_OK);
    }
    assert_true(kvd_ring_arm(ring) == false);
    int fd = kvd_ring_fd(ring);
    kvd_ring_destroy(ring); /* LeakSanitizer reports the ring if kept */
    errno = 0;
    assert_int_equal(fcntl(fd, F_GETFD), -1); /* the eventfd is closed */
    assert_int_equal(errno, EBADF);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_create_rejects_bad_geometry),
        cmocka_unit_test(test_create_reports_resource_failures),
        cmocka_unit_test(test_calls_reject_null),
        cmocka_unit_test(test_fd_is_nonblocking_cloexec_eventfd),
        cmocka_unit_test(test_full_at_capacity_then_fifo),
        cmocka_unit_test(test_wraps_around_many_times),
        cmocka_unit_test(test_odd_sizes_copied_intact),
        cmocka_unit_test(test_stress_tiny_ring),
        cmocka_unit_test(test_stress_large_ring),
        cmocka_unit_test(test_poll_consumer_misses_nothing),
        cmocka_unit_test(test_fd_signals_once_per_arming),
        cmocka_unit_test(test_wait_times_out_after_timeout),
        cmocka_unit_test(test_wait_returns_at_once_when_not_empty),
        cmocka_unit_test(test_wait_forever_wakes_on_push),
        cmocka_unit_test(test_wait_keeps_deadline_across_signals),
        cmocka_unit_test(test_destroy_with_elements_left),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
