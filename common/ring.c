/*
 * Bounded MPSC ring with eventfd wake-up (contract in common/ring_int.h).
 *
 * Slots follow Dmitry Vyukov's bounded queue: every slot carries a sequence
 * number that says whose turn it is. Slot i of lap k holds seq == pos for a
 * free slot waiting for the producer of position pos = k*capacity + i, and
 * seq == pos + 1 once that producer has copied its element in. A producer
 * claims a position by compare-and-swap on `tail`, copies, then publishes
 * with seq = pos + 1; the consumer copies out and frees the slot for the
 * next lap with seq = pos + capacity. The release/acquire pairs on `seq`
 * order the element bytes, so producers never touch a slot the consumer is
 * reading and vice versa. Only one consumer exists, so `head` needs no
 * compare-and-swap; it is atomic only for kvd_ring_size_approx().
 *
 * Wake-up: a push must not cost a write(2) while the consumer is busy, so
 * producers signal the eventfd only after the consumer has armed the ring
 * (`armed` = 1) in kvd_ring_arm(), and the producer that turns `armed` back
 * to 0 is the one that writes. See kvd_ring_arm() for why no wake-up can be
 * lost.
 *
 * Layout: tail (written by producers), head (written by the consumer) and
 * armed (read by every push, written about once per sleep) live on
 * separate cache lines, away from the read-only geometry. The ring and its
 * slots are one allocation made at create time.
 */
#include <errno.h>
#include <poll.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "common/failpoint_int.h"
#include "common/log_int.h"
#include "common/ring_int.h"
#include "common/time_int.h"

#define KVD_RING_CACHE_LINE 64

typedef struct kvd_ring_cell {
    atomic_size_t seq;
    unsigned char data[];
} kvd_ring_cell_t;

/* The padding is the point: see "Layout" above. */
/* NOLINTNEXTLINE(clang-analyzer-optin.performance.Padding) */
struct kvd_ring {
    /* Read-only after create. */
    unsigned char *cells;
    size_t mask; /* capacity - 1 */
    size_t elem_size;
    size_t stride; /* bytes per slot: sequence word + element, aligned */
    int efd;

    /* Next position to claim (producers, compare-and-swap). */
    alignas(KVD_RING_CACHE_LINE) atomic_size_t tail;
    /* Next position to pop (consumer only writes it). */
    alignas(KVD_RING_CACHE_LINE) atomic_size_t head;
    /* 1 while the consumer may be asleep on efd; see kvd_ring_arm(). */
    alignas(KVD_RING_CACHE_LINE) atomic_int armed;
};

static inline kvd_ring_cell_t *kvd_ring_cell(const kvd_ring_t *ring, size_t pos)
{
    return (kvd_ring_cell_t *)(ring->cells + (pos & ring->mask) * ring->stride);
}

static size_t kvd_ring_round_up(size_t value, size_t align)
{
    return (value + align - 1) / align * align;
}

static kvd_status_t kvd_ring_check_geometry(size_t capacity, size_t elem_size,
                                            size_t *stride_out)
{
    if (capacity < 2 || capacity > KVD_RING_CAPACITY_MAX ||
        (capacity & (capacity - 1)) != 0) {
        KVD_LOG_WARN("ring: capacity %zu is not a power of two in 2..%u",
                     capacity, KVD_RING_CAPACITY_MAX);
        return KVD_ERR_INVALID;
    }
    if (elem_size == 0 || elem_size > KVD_RING_ELEM_SIZE_MAX) {
        KVD_LOG_WARN("ring: element size %zu is not in 1..%d", elem_size,
                     KVD_RING_ELEM_SIZE_MAX);
        return KVD_ERR_INVALID;
    }
    /* Both factors are bounded above, so the product fits in 64 bits. */
    size_t stride = kvd_ring_round_up(sizeof(kvd_ring_cell_t) + elem_size,
                                      alignof(kvd_ring_cell_t));
    if ((uint64_t)capacity * stride > KVD_RING_BYTES_MAX) {
        KVD_LOG_WARN("ring: %zu slots of %zu bytes exceed %u bytes", capacity,
                     stride, KVD_RING_BYTES_MAX);
        return KVD_ERR_INVALID;
    }
    *stride_out = stride;
    return KVD_OK;
}

kvd_status_t kvd_ring_create(size_t capacity, size_t elem_size,
                             kvd_ring_t **ring_out)
{
    size_t stride = 0;
    kvd_status_t status;

    if (ring_out == NULL) {
        KVD_LOG_WARN("ring: ring_out is NULL");
        return KVD_ERR_INVALID;
    }
    status = kvd_ring_check_geometry(capacity, elem_size, &stride);
    if (status != KVD_OK) {
        return status;
    }

    /* sizeof(kvd_ring_t) is a multiple of the cache line (alignas members),
     * so the slots start on a line of their own. aligned_alloc wants a size
     * that is a multiple of the alignment. */
    size_t bytes = kvd_ring_round_up(sizeof(kvd_ring_t) + capacity * stride,
                                     KVD_RING_CACHE_LINE);
    kvd_ring_t *ring = NULL;
    int inject = KVD_FAILPOINT("ring.alloc");
    if (inject == 0) {
        ring = aligned_alloc(KVD_RING_CACHE_LINE, bytes);
    }
    if (ring == NULL) {
        KVD_LOG_ERROR("ring: cannot allocate %zu bytes (%zu x %zu)", bytes,
                      capacity, elem_size);
        status = KVD_ERR_NOMEM;
        goto err;
    }

    inject = KVD_FAILPOINT("ring.eventfd");
    if (inject != 0) {
        errno = inject;
        ring->efd = -1;
    } else {
        ring->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    }
    if (ring->efd < 0) {
        int err = errno;
        KVD_LOG_ERROR("ring: eventfd failed: %s", strerror(err));
        status = kvd_status_from_errno(err);
        goto err_free_ring;
    }

    ring->cells = (unsigned char *)ring + sizeof(kvd_ring_t);
    ring->mask = capacity - 1;
    ring->elem_size = elem_size;
    ring->stride = stride;
    atomic_init(&ring->tail, 0);
    atomic_init(&ring->head, 0);
    atomic_init(&ring->armed, 0);
    for (size_t i = 0; i < capacity; i++) {
        atomic_init(&kvd_ring_cell(ring, i)->seq, i);
    }

    *ring_out = ring;
    return KVD_OK;

err_free_ring:
    free(ring);
err:
    return status;
}

void kvd_ring_destroy(kvd_ring_t *ring)
{
    if (ring == NULL) {
        return;
    }
    close(ring->efd);
    free(ring);
}

int kvd_ring_fd(const kvd_ring_t *ring)
{
    return ring == NULL ? -1 : ring->efd;
}

/* Adds 1 to the eventfd counter. EAGAIN means the counter is saturated,
 * i.e. the fd is readable already. Nothing else can fail on a valid
 * eventfd; if something does, an armed consumer may not wake up, so the
 * cause is logged (rate-limited: this runs on producers' hot path). */
static void kvd_ring_signal(kvd_ring_t *ring)
{
    const uint64_t one = 1;
    for (;;) {
        ssize_t rc = write(ring->efd, &one, sizeof(one));
        if (rc == (ssize_t)sizeof(one) || (rc < 0 && errno == EAGAIN)) {
            return;
        }
        if (rc < 0 && errno == EINTR) {
            continue;
        }
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_ERROR, 1000,
                            "ring: write to eventfd %d failed: %s", ring->efd,
                            rc < 0 ? strerror(errno) : "short write");
        return;
    }
}

/* Resets the eventfd counter to 0. EAGAIN means it was 0 already. */
static void kvd_ring_drain(kvd_ring_t *ring)
{
    uint64_t count;
    for (;;) {
        ssize_t rc = read(ring->efd, &count, sizeof(count));
        if (rc == (ssize_t)sizeof(count) || (rc < 0 && errno == EAGAIN)) {
            return;
        }
        if (rc < 0 && errno == EINTR) {
            continue;
        }
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_ERROR, 1000,
                            "ring: read from eventfd %d failed: %s", ring->efd,
                            rc < 0 ? strerror(errno) : "short read");
        return;
    }
}

kvd_status_t kvd_ring_push(kvd_ring_t *ring, const void *elem)
{
    if (ring == NULL || elem == NULL) {
        return KVD_ERR_INVALID;
    }

    kvd_ring_cell_t *cell;
    size_t pos = atomic_load_explicit(&ring->tail, memory_order_relaxed);
    for (;;) {
        cell = kvd_ring_cell(ring, pos);
        /* Acquire: if the slot is free, the consumer's copy-out of the
         * previous lap happened before our copy-in below. */
        size_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        intptr_t diff = (intptr_t)(seq - pos);
        if (diff == 0) {
            /* On failure `pos` is reloaded with the current tail. */
            if (atomic_compare_exchange_weak_explicit(
                    &ring->tail, &pos, pos + 1, memory_order_relaxed,
                    memory_order_relaxed)) {
                break;
            }
        } else if (diff < 0) {
            /* The slot still holds the element of the previous lap: the
             * ring holds `capacity` elements. Nothing was changed. */
            return KVD_ERR_BUSY;
        } else {
            /* Another producer claimed `pos` since we read tail. */
            pos = atomic_load_explicit(&ring->tail, memory_order_relaxed);
        }
    }

    memcpy(cell->data, elem, ring->elem_size);
    /* Publish (P1). seq_cst rather than release: it is one half of the
     * store-load pair that kvd_ring_arm() relies on. */
    atomic_store_explicit(&cell->seq, pos + 1, memory_order_seq_cst);

    /* P2: the cheap load keeps the exchange (and its cache-line transfer)
     * off the path while the consumer is busy. P3: exactly one producer
     * takes each arming and writes the eventfd. */
    if (atomic_load_explicit(&ring->armed, memory_order_seq_cst) != 0 &&
        atomic_exchange_explicit(&ring->armed, 0, memory_order_acq_rel) != 0) {
        kvd_ring_signal(ring);
    }
    return KVD_OK;
}

size_t kvd_ring_pop(kvd_ring_t *ring, void *elems_out, size_t max_elems)
{
    if (ring == NULL || elems_out == NULL) {
        return 0;
    }

    unsigned char *out = elems_out;
    size_t pos = atomic_load_explicit(&ring->head, memory_order_relaxed);
    size_t n = 0;
    while (n < max_elems) {
        kvd_ring_cell_t *cell = kvd_ring_cell(ring, pos);
        /* Acquire pairs with the producer's publish: the bytes are there. */
        size_t seq = atomic_load_explicit(&cell->seq, memory_order_acquire);
        if (seq != pos + 1) {
            break; /* empty, or the oldest push is still copying */
        }
        memcpy(out + n * ring->elem_size, cell->data, ring->elem_size);
        /* Release: our copy-out happens before the next lap's copy-in. */
        atomic_store_explicit(&cell->seq, pos + ring->mask + 1,
                              memory_order_release);
        pos++;
        n++;
    }
    if (n > 0) {
        atomic_store_explicit(&ring->head, pos, memory_order_relaxed);
    }
    return n;
}

/* True when kvd_ring_pop() would return at least one element. */
static bool kvd_ring_ready(const kvd_ring_t *ring, memory_order order)
{
    size_t pos = atomic_load_explicit(&ring->head, memory_order_relaxed);
    return atomic_load_explicit(&kvd_ring_cell(ring, pos)->seq, order) ==
           pos + 1;
}

/*
 * Why no wake-up is lost. The consumer runs C0 drain eventfd, C1 store
 * armed = 1, C2 load the head slot's seq, and sleeps only if C2 found it
 * unpublished. The producer of the head slot runs P1 store seq (publish),
 * P2 load armed, P3 exchange armed with 0 and write the eventfd if it got 1.
 * C1, C2, P1 and P2 are all seq_cst, so they sit in one total order S that
 * agrees with each thread's program order. C2 did not see P1, so C2 comes
 * before P1 in S (had P1 come first, C2 would have to read P1 or a later
 * store: the slot's older value, the consumer's release store freeing it,
 * happens before P1 because the producer acquired it before claiming).
 * Hence C1 < C2 < P1 < P2, and P2 reads armed = 1 from C1 or a later value.
 * Later values come only from producers' P3 exchanges (the consumer writes
 * armed only when it is not going to sleep). So either this producer's exchange
 * takes the 1 from C1, or another producer's exchange took it first; either way
 * some producer writes the eventfd, and that write comes after C0 because its
 * exchange read C1's store (acquire after seq_cst), which follows C0 in program
 * order. Nothing but the next C0 clears the counter, so poll() on the fd
 * returns. Only the head slot matters: elements behind it are not poppable
 * until it is published.
 *
 * Draining must come before arming: a drain after C2 could swallow the
 * write of a producer that published after C2. Extra writes (a producer
 * other than the head's, or a push racing a consumer that found work) only
 * cause a spurious wake-up, after which the consumer pops or re-arms.
 */
bool kvd_ring_arm(kvd_ring_t *ring)
{
    if (ring == NULL) {
        return false;
    }
    kvd_ring_drain(ring);                                         /* C0 */
    atomic_store_explicit(&ring->armed, 1, memory_order_seq_cst); /* C1 */
    if (kvd_ring_ready(ring, memory_order_seq_cst)) {             /* C2 */
        /* Not sleeping: spare producers the write. If one already took
         * the arming, its write only causes a spurious wake-up later. */
        atomic_store_explicit(&ring->armed, 0, memory_order_relaxed);
        return false;
    }
    return true;
}

size_t kvd_ring_pop_arm(kvd_ring_t *ring, void *elems_out, size_t max_elems)
{
    size_t n = kvd_ring_pop(ring, elems_out, max_elems);
    /* kvd_ring_arm() refuses while an element is poppable: take it too. */
    while (ring != NULL && n < max_elems && !kvd_ring_arm(ring)) {
        n +=
            kvd_ring_pop(ring, (unsigned char *)elems_out + n * ring->elem_size,
                         max_elems - n);
    }
    return n;
}

kvd_status_t kvd_ring_wait(kvd_ring_t *ring, int timeout_ms)
{
    if (ring == NULL) {
        return KVD_ERR_INVALID;
    }

    uint64_t deadline_ns = kvd_time_deadline_ns(timeout_ms);
    for (;;) {
        if (kvd_ring_ready(ring, memory_order_acquire)) {
            return KVD_OK;
        }
        int remaining_ms = kvd_time_remaining_ms(deadline_ns);
        if (remaining_ms == 0) {
            return KVD_ERR_TIMEOUT;
        }
        if (!kvd_ring_arm(ring)) {
            return KVD_OK;
        }
        /* A readable fd is only a hint: loop and check the slot again. On
         * EINTR the remaining time is recomputed from the fixed deadline. */
        struct pollfd pfd = {.fd = ring->efd, .events = POLLIN};
        if (poll(&pfd, 1, remaining_ms) < 0 && errno != EINTR) {
            int err = errno;
            KVD_LOG_ERROR("ring: poll on eventfd %d failed: %s", ring->efd,
                          strerror(err));
            return kvd_status_from_errno(err);
        }
    }
}

size_t kvd_ring_size_approx(const kvd_ring_t *ring)
{
    if (ring == NULL) {
        return 0;
    }
    size_t head = atomic_load_explicit(&ring->head, memory_order_relaxed);
    size_t tail = atomic_load_explicit(&ring->tail, memory_order_relaxed);
    /* The two loads are not one snapshot: clamp what a race can skew. */
    intptr_t diff = (intptr_t)(tail - head);
    if (diff <= 0) {
        return 0;
    }
    return (size_t)diff > ring->mask + 1 ? ring->mask + 1 : (size_t)diff;
}
