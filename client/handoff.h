/*
 * The shared-memory hand-off (docs/daemon.md): how a client on the daemon's
 * node gets the arena. gRPC cannot carry a file descriptor, so the daemon
 * listens on a second unix socket, `<server.unix_socket>.shm`; a client
 * connects, sends one HELLO, and receives one REPLY with the arena's memfd
 * attached (SCM_RIGHTS) when the reply's status is KVD_OK. After that the
 * client maps the arena once and every payload byte moves by memcpy or DMA
 * into slots the gRPC calls lease; no payload crosses a socket.
 *
 * Wire format (all integers little-endian, fixed size, no padding):
 *   HELLO (16 bytes)  magic "KVDH" | u16 version (2) | u16 flags (0)
 *                     | u64 reserved (0)
 *   REPLY (64 bytes)  magic "KVDA" | u16 version (2) | u16 flags (0)
 *                     | i32 status | u32 reserved (0) | u64 instance_id
 *                     | u64 map_bytes | u64 size_bytes | u8 session[16]
 *                     | u64 offset
 * The memfd is the arena partition of the caller's tenant: the whole arena,
 * or for a tenant with an arena of its own (server.tenant_arenas) that
 * partition only, whose first byte is arena offset `offset`; lease and
 * reservation offsets outside [offset, offset + size_bytes) are not in the
 * caller's mapping. (Version 1 had no offset and always the whole arena.)
 * `instance_id` is random per daemon start: a client sends it with every
 * RPC (metadata "kvdepot-instance") so a restarted daemon, whose arena is a
 * new one, refuses calls naming slots of the old one (FAILED_PRECONDITION)
 * and the client maps the new arena. `session` is a random secret the
 * daemon binds to the peer's credentials (SO_PEERCRED uid) on this socket;
 * the client sends it with every RPC (metadata "kvdepot-session", hex), so
 * the daemon knows whose calls they are without trusting what they claim
 * (tenants mapped to users, `server.tenants`).
 *
 * Both decoders treat their input as hostile (fuzzed by
 * tests/fuzz/fuzz_handoff.c). Thread: any; no state.
 */
#ifndef KVD_CLIENT_HANDOFF_H
#define KVD_CLIENT_HANDOFF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVD_HANDOFF_VERSION 2u
#define KVD_HANDOFF_HELLO_BYTES 16u
#define KVD_HANDOFF_REPLY_BYTES 64u
#define KVD_HANDOFF_SESSION_BYTES 16u
/* Suffix of the hand-off socket's path after the gRPC unix socket's. */
#define KVD_HANDOFF_SUFFIX ".shm"

typedef struct kvd_handoff_reply {
    kvd_status_t status;  /* KVD_OK: an fd comes with the reply */
    uint64_t instance_id; /* non-zero */
    uint64_t map_bytes;   /* length to mmap; >= size_bytes, page multiple */
    uint64_t size_bytes;  /* arena offsets below this are slots */
    uint8_t session[KVD_HANDOFF_SESSION_BYTES]; /* for KVD_OK: the caller's
                                                   session secret */
    uint64_t offset; /* arena offset of the memfd's first byte; a multiple
                        of 4096 */
} kvd_handoff_reply_t;

/* Writes the HELLO into out[KVD_HANDOFF_HELLO_BYTES]. */
void kvd_handoff_hello_encode(uint8_t *out);

/* Checks `len` bytes as a HELLO: KVD_OK, or KVD_ERR_PROTO (wrong length,
 * magic, non-zero flags or reserved bytes) / KVD_ERR_UNSUPPORTED (another
 * version), with the reason in `err`. */
kvd_status_t kvd_handoff_hello_decode(const uint8_t *data, size_t len,
                                      char *err, size_t err_len);

/* Writes `reply` into out[KVD_HANDOFF_REPLY_BYTES]. */
void kvd_handoff_reply_encode(const kvd_handoff_reply_t *reply, uint8_t *out);

/* Decodes and validates a REPLY (status a negative kvd_status_t or KVD_OK;
 * for KVD_OK: instance_id non-zero, 0 < size_bytes <= map_bytes, map_bytes
 * and offset multiples of 4096, offset + size_bytes without overflow).
 * KVD_ERR_PROTO / KVD_ERR_UNSUPPORTED with a reason;
 * `*out` written only on success. */
kvd_status_t kvd_handoff_reply_decode(const uint8_t *data, size_t len,
                                      kvd_handoff_reply_t *out, char *err,
                                      size_t err_len);

/* Sends `len` bytes on a connected unix socket, with `fd` attached when it
 * is >= 0. KVD_OK or a translated errno. */
kvd_status_t kvd_handoff_send(int sock, const uint8_t *data, size_t len,
                              int fd);

/* What one read of a hand-off socket got: `n` bytes (0: the peer closed
 * it), the first descriptor attached (-1: none; O_CLOEXEC; any others are
 * closed), how many were attached, and whether the kernel cut the control
 * data (then descriptors may have been lost). */
typedef struct kvd_handoff_piece {
    size_t n;
    int fd;
    int num_fds;
    bool truncated;
} kvd_handoff_piece_t;

/* One non-blocking read of at most `len` bytes into `data`: KVD_OK with
 * *out filled, KVD_AGAIN when nothing is there yet (or a signal came
 * first), else a translated errno (*out then has fd -1). The caller owns
 * out->fd. */
kvd_status_t kvd_handoff_read(int sock, uint8_t *data, size_t len,
                              kvd_handoff_piece_t *out);

/* Receives exactly `len` bytes (one message, in any number of pieces)
 * within `timeout_ms` for the whole of it; an
 * attached descriptor (at most one; more is KVD_ERR_PROTO and all are
 * closed) is written to *fd_out (-1 if none, O_CLOEXEC). KVD_ERR_TIMEOUT,
 * KVD_ERR_PEER (closed early), KVD_ERR_PROTO (short or truncated), or a
 * translated errno. */
kvd_status_t kvd_handoff_recv(int sock, uint8_t *data, size_t len,
                              int timeout_ms, int *fd_out);

#ifdef __cplusplus
}
#endif

#endif /* KVD_CLIENT_HANDOFF_H */
