/*
 * Controls of the CPU model of kernels/cuda (fake_cuda.c), for the tests
 * built against it (KVD_FAKE_CUDA).
 *
 * By default every operation waits on its stream until something waits for
 * it: the device lagging as far behind the host as it may. That exposes a
 * reader that did not wait for a producer running late, not one that
 * starts early. The two controls below let one side of an ordering run
 * ahead of the other, so a missing wait between them shows as wrong bytes.
 */
#ifndef KVD_TESTS_GPU_FAKE_CUDA_INT_H
#define KVD_TESTS_GPU_FAKE_CUDA_INT_H

#include <stdbool.h>

/* The engine's stream `stream` (NULL: the legacy default stream) runs
 * each operation as it is enqueued, a wait on another stream's event
 * first running that stream up to the event; the other streams lag. A
 * read the engine enqueues after waiting for a load then sees only what
 * the load's event covered. */
void kvd_fake_cuda_engine_ahead(void *stream);

/* Every stream but the engine's `stream` runs each operation as it is
 * enqueued as far as it can without making another stream run: a wait on
 * an event its stream has not reached stops it there (it goes on when
 * something waits for it). The engine's stream lags. A save that did not
 * wait for the engine's writes then reads the bytes from before them. */
void kvd_fake_cuda_others_ahead(void *stream);

/* Every stream lags again (the default). */
void kvd_fake_cuda_lazy(void);

#endif
