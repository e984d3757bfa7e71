/*
 * Bounded multi-producer single-consumer ring of fixed-size elements, with
 * an eventfd for consumers that sleep.
 *
 * It carries completion records from I/O and copy threads to the one thread
 * that polls (docs/architecture.md §9): any thread pushes a record with
 * kvd_ring_push(), which never blocks and answers KVD_ERR_BUSY when the ring
 * is full; the owning thread drains records with the non-blocking
 * kvd_ring_pop(), and sleeps either in kvd_ring_wait() or in its own
 * poll()/epoll_wait() on kvd_ring_fd().
 *
 * Elements are copied in and out by value (elem_size bytes); the ring never
 * looks inside them and owns nothing they point at. All memory is allocated
 * by kvd_ring_create(); push, pop and wait never allocate.
 *
 * Ordering: elements pushed by one thread are popped in the order that
 * thread pushed them. Elements from different producers are popped in the
 * order their pushes claimed a slot.
 *
 * Threading: kvd_ring_push() and kvd_ring_size_approx() may be called from
 * any thread, concurrently. kvd_ring_pop(), kvd_ring_wait() and
 * kvd_ring_arm() are for one consumer thread at a time (the "consumer"; it
 * may change, provided the hand-over itself synchronises, e.g. with a
 * mutex). kvd_ring_create() and kvd_ring_destroy() must not run
 * concurrently with any other call on the same ring.
 *
 * Sleeping on the fd yourself (epoll integration):
 *
 *     for (;;) {
 *         size_t n = kvd_ring_pop(ring, recs, MAX);
 *         ...handle n records...
 *         if (n == 0 && kvd_ring_arm(ring)) {
 *             poll(&(struct pollfd){kvd_ring_fd(ring), POLLIN, 0}, 1, -1);
 *         }
 *     }
 *
 * kvd_ring_fd() becomes readable when an element is published while the
 * ring is armed; kvd_ring_arm() is the only call that clears it. Pushes made
 * while the consumer has not armed the ring do not touch the eventfd, so a
 * busy consumer costs producers no system call.
 *
 * Internal: not exported from libkvdepot.so; tests link the static library.
 */
#ifndef KVD_COMMON_RING_INT_H
#define KVD_COMMON_RING_INT_H

#include <stdbool.h>
#include <stddef.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest element, in bytes. */
#define KVD_RING_ELEM_SIZE_MAX 4096
/* Largest capacity, in elements. */
#define KVD_RING_CAPACITY_MAX (1u << 22)
/* Largest total allocation for the slots (elements plus a sequence word
 * each), so that a bad configuration cannot ask for gigabytes. */
#define KVD_RING_BYTES_MAX (256u << 20)

typedef struct kvd_ring kvd_ring_t;

/*
 * Creates an empty ring of `capacity` elements of `elem_size` bytes each and
 * its eventfd (EFD_NONBLOCK | EFD_CLOEXEC), and writes it to `*ring_out`.
 * The ring is created unarmed.
 *
 * Errors (nothing is allocated and `*ring_out` is untouched):
 *   KVD_ERR_INVALID  `ring_out` is NULL; `capacity` is not a power of two
 *                    in 2..KVD_RING_CAPACITY_MAX; `elem_size` is not in
 *                    1..KVD_RING_ELEM_SIZE_MAX; or the slots would need
 *                    more than KVD_RING_BYTES_MAX bytes.
 *   KVD_ERR_NOMEM    allocation failed (failpoint "ring.alloc").
 *   other            eventfd(2) failed, translated by kvd_status_from_errno
 *                    (failpoint "ring.eventfd").
 *
 * Ownership: the caller owns the ring and frees it with kvd_ring_destroy().
 */
kvd_status_t kvd_ring_create(size_t capacity, size_t elem_size,
                             kvd_ring_t **ring_out);

/*
 * Closes the eventfd and frees the ring. Elements still in it are discarded
 * (they are plain bytes). NULL is accepted. No other call on the ring may be
 * in progress or follow; in particular every producer must have stopped.
 */
void kvd_ring_destroy(kvd_ring_t *ring);

/*
 * Copies `elem_size` bytes from `elem` into the ring. Any thread; lock-free
 * (a failed compare-and-swap means another producer made progress); never
 * blocks and never allocates. `elem` is borrowed for the call.
 *
 * If the consumer armed the ring (kvd_ring_arm(), or kvd_ring_wait() about
 * to sleep), the first push that sees it armed disarms it and writes the
 * eventfd, after the element is visible to kvd_ring_pop().
 *
 * Returns KVD_OK (the element will be popped exactly once, unless the ring
 * is destroyed first), KVD_ERR_BUSY when the ring holds `capacity`
 * elements (nothing changed: retry later), or KVD_ERR_INVALID when `ring`
 * or `elem` is NULL.
 */
kvd_status_t kvd_ring_push(kvd_ring_t *ring, const void *elem);

/*
 * Copies up to `max_elems` elements, oldest first, into `elems_out` (room
 * for max_elems * elem_size bytes) and removes them from the ring. Consumer
 * thread only; never blocks. Returns how many were copied: 0 when the ring
 * is empty, when `max_elems` is 0, or when `ring` or `elems_out` is NULL.
 *
 * A producer that has claimed the oldest slot but not finished copying into
 * it holds back the elements behind it until it finishes; pop then returns
 * fewer elements (maybe 0) even though kvd_ring_size_approx() counts more.
 * That producer's push will wake an armed consumer, so nothing is lost.
 */
size_t kvd_ring_pop(kvd_ring_t *ring, void *elems_out, size_t max_elems);

/*
 * The ring's eventfd, for poll()/epoll (POLLIN). Valid until
 * kvd_ring_destroy(); owned by the ring: never read, write or close it.
 * It is readable after an element was published while the ring was armed
 * (it may also be readable spuriously, e.g. when that element was already
 * popped; pop again and re-arm). Only kvd_ring_arm() clears it. Returns -1
 * for a NULL ring. Any thread.
 */
int kvd_ring_fd(const kvd_ring_t *ring);

/*
 * Announces that the consumer is about to sleep on kvd_ring_fd(): clears
 * the eventfd, arms the ring, then checks again for a poppable element.
 * Consumer thread only; never blocks.
 *
 * Returns true when the ring is armed and was empty after arming: the
 * caller may sleep until kvd_ring_fd() is readable, and the next element
 * published will make it readable. Returns false when an element can be
 * popped already (the caller must pop instead of sleeping; the ring is left
 * unarmed), or when `ring` is NULL.
 */
bool kvd_ring_arm(kvd_ring_t *ring);

/*
 * kvd_ring_pop() for a consumer that sleeps on kvd_ring_fd() between pops:
 * when it returns fewer than `max_elems`, the ring has been armed while
 * empty, so the next element published makes the fd readable. (When it
 * returns max_elems the ring may hold more: pop again before sleeping.)
 * Costs one eventfd read per call that drains the ring. Consumer thread
 * only.
 */
size_t kvd_ring_pop_arm(kvd_ring_t *ring, void *elems_out, size_t max_elems);

/*
 * Sleeps until at least one element can be popped. Consumer thread only.
 * `timeout_ms` < 0 waits forever, 0 only checks. Signals (EINTR) do not
 * shorten or extend the wait: the deadline is fixed on entry.
 *
 * Returns KVD_OK as soon as kvd_ring_pop() would return at least one
 * element (at once if one is already there), KVD_ERR_TIMEOUT when the
 * deadline passed first, KVD_ERR_INVALID for a NULL ring, or the status of
 * an unexpected poll(2) failure (logged). The ring may be left armed.
 */
kvd_status_t kvd_ring_wait(kvd_ring_t *ring, int timeout_ms);

/*
 * Number of elements pushed but not yet popped, including slots whose push
 * is still copying; at most `capacity`. A snapshot for stats that may be
 * stale by the time it returns. Any thread; 0 for a NULL ring.
 */
size_t kvd_ring_size_approx(const kvd_ring_t *ring);

#ifdef __cplusplus
}
#endif

#endif /* KVD_COMMON_RING_INT_H */
