/*
 * The shared-memory hand-off messages and the one-descriptor unix socket
 * send/receive (client/handoff.h has the format). A receive is bounded
 * as a whole: a peer that sends part of a message and stalls costs the
 * caller its timeout, never more.
 */
#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/config_int.h"
#include "common/endian_int.h"
#include "common/time_int.h"
#include "client/handoff.h"

static const uint8_t hello_magic[4] = {'K', 'V', 'D', 'H'};
static const uint8_t reply_magic[4] = {'K', 'V', 'D', 'A'};

void kvd_handoff_hello_encode(uint8_t *out)
{
    memset(out, 0, KVD_HANDOFF_HELLO_BYTES);
    memcpy(out, hello_magic, 4);
    kvd_put_le16(out + 4, KVD_HANDOFF_VERSION);
}

/* Common header checks: length, magic, version, flags. */
static kvd_status_t handoff_header(const uint8_t *data, size_t len, size_t want,
                                   const uint8_t *magic, const char *what,
                                   char *err, size_t err_len)
{
    if (data == NULL || len != want) {
        kvd_config_err(err, err_len, "hand-off %s: %zu bytes, want %zu", what,
                       data == NULL ? 0 : len, want);
        return KVD_ERR_PROTO;
    }
    if (memcmp(data, magic, 4) != 0) {
        kvd_config_err(err, err_len, "hand-off %s: bad magic", what);
        return KVD_ERR_PROTO;
    }
    uint16_t version = kvd_get_le16(data + 4);
    if (version != KVD_HANDOFF_VERSION) {
        kvd_config_err(err, err_len, "hand-off %s: version %u, want %u", what,
                       version, KVD_HANDOFF_VERSION);
        return KVD_ERR_UNSUPPORTED;
    }
    if (kvd_get_le16(data + 6) != 0) {
        kvd_config_err(err, err_len, "hand-off %s: unknown flags 0x%x", what,
                       kvd_get_le16(data + 6));
        return KVD_ERR_PROTO;
    }
    return KVD_OK;
}

kvd_status_t kvd_handoff_hello_decode(const uint8_t *data, size_t len,
                                      char *err, size_t err_len)
{
    kvd_status_t s = handoff_header(data, len, KVD_HANDOFF_HELLO_BYTES,
                                    hello_magic, "hello", err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    if (kvd_get_le64(data + 8) != 0) {
        kvd_config_err(err, err_len, "hand-off hello: reserved bytes set");
        return KVD_ERR_PROTO;
    }
    return KVD_OK;
}

void kvd_handoff_reply_encode(const kvd_handoff_reply_t *reply, uint8_t *out)
{
    memset(out, 0, KVD_HANDOFF_REPLY_BYTES);
    memcpy(out, reply_magic, 4);
    kvd_put_le16(out + 4, KVD_HANDOFF_VERSION);
    kvd_put_le32(out + 8, (uint32_t)(int32_t)reply->status);
    kvd_put_le64(out + 16, reply->instance_id);
    kvd_put_le64(out + 24, reply->map_bytes);
    kvd_put_le64(out + 32, reply->size_bytes);
    memcpy(out + 40, reply->session, KVD_HANDOFF_SESSION_BYTES);
    kvd_put_le64(out + 56, reply->offset);
}

kvd_status_t kvd_handoff_reply_decode(const uint8_t *data, size_t len,
                                      kvd_handoff_reply_t *out, char *err,
                                      size_t err_len)
{
    kvd_status_t s = handoff_header(data, len, KVD_HANDOFF_REPLY_BYTES,
                                    reply_magic, "reply", err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    if (kvd_get_le32(data + 12) != 0) {
        kvd_config_err(err, err_len, "hand-off reply: reserved bytes set");
        return KVD_ERR_PROTO;
    }
    kvd_handoff_reply_t r = {
        .status = (kvd_status_t)(int32_t)kvd_get_le32(data + 8),
        .instance_id = kvd_get_le64(data + 16),
        .map_bytes = kvd_get_le64(data + 24),
        .size_bytes = kvd_get_le64(data + 32),
        .offset = kvd_get_le64(data + 56),
    };
    memcpy(r.session, data + 40, KVD_HANDOFF_SESSION_BYTES);
    if ((int32_t)r.status > 0 || (int32_t)r.status < KVD_ERR_INTERNAL) {
        kvd_config_err(err, err_len, "hand-off reply: status %d out of range",
                       (int)r.status);
        return KVD_ERR_PROTO;
    }
    if (r.status == KVD_OK &&
        (r.instance_id == 0 || r.size_bytes == 0 ||
         r.size_bytes > r.map_bytes || r.map_bytes % 4096 != 0 ||
         r.offset % 4096 != 0 || r.offset > UINT64_MAX - r.size_bytes)) {
        kvd_config_err(
            err, err_len,
            "hand-off reply: instance %llx, map %llu bytes, size "
            "%llu bytes at offset %llu: inconsistent",
            (unsigned long long)r.instance_id, (unsigned long long)r.map_bytes,
            (unsigned long long)r.size_bytes, (unsigned long long)r.offset);
        return KVD_ERR_PROTO;
    }
    *out = r;
    return KVD_OK;
}

kvd_status_t kvd_handoff_send(int sock, const uint8_t *data, size_t len, int fd)
{
    struct iovec iov = {.iov_base = (void *)data, .iov_len = len};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    memset(&ctl, 0, sizeof ctl);
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    ssize_t n;
    do {
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    if (n < 0) {
        return kvd_status_from_errno(errno);
    }
    /* A unix stream socket takes a 64-byte message whole or not at all
     * unless its buffer is nearly full, which a fresh connection's is not. */
    return (size_t)n == len ? KVD_OK : KVD_ERR_IO;
}

/* Closes every descriptor carried by `msg`'s control data; returns how
 * many there were, storing the first in *first (or leaving it -1). */
static int handoff_take_fds(struct msghdr *msg, int *first)
{
    int count = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c != NULL;
         c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
            continue;
        }
        size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < n; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
            if (count == 0) {
                *first = fd;
            } else {
                close(fd);
            }
            count++;
        }
    }
    return count;
}

/* Waits until `sock` is readable or `deadline_ns` passes. */
static kvd_status_t handoff_wait(int sock, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = kvd_time_now_ns();
        if (now >= deadline_ns) {
            return KVD_ERR_TIMEOUT;
        }
        uint64_t left_ms =
            (deadline_ns - now + KVD_NSEC_PER_MSEC - 1) / KVD_NSEC_PER_MSEC;
        struct pollfd pfd = {.fd = sock, .events = POLLIN};
        int rc = poll(&pfd, 1, left_ms > INT32_MAX ? INT32_MAX : (int)left_ms);
        if (rc > 0) {
            return KVD_OK;
        }
        if (rc < 0 && errno != EINTR) {
            return kvd_status_from_errno(errno);
        }
    }
}

kvd_status_t kvd_handoff_read(int sock, uint8_t *data, size_t len,
                              kvd_handoff_piece_t *out)
{
    out->n = 0;
    out->fd = -1;
    out->num_fds = 0;
    out->truncated = false;
    struct iovec iov = {.iov_base = data, .iov_len = len};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(4 * sizeof(int))];
    } ctl;
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof ctl.buf};
    ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
        return errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK
                   ? KVD_AGAIN
                   : kvd_status_from_errno(errno);
    }
    out->n = (size_t)n;
    out->num_fds = handoff_take_fds(&msg, &out->fd);
    out->truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
    return KVD_OK;
}

kvd_status_t kvd_handoff_recv(int sock, uint8_t *data, size_t len,
                              int timeout_ms, int *fd_out)
{
    /* The whole message within the deadline, in however many pieces the
     * peer sends it: a peer that sends part and stalls costs timeout_ms. */
    uint64_t deadline =
        kvd_time_now_ns() +
        (uint64_t)(timeout_ms < 0 ? 0 : timeout_ms) * KVD_NSEC_PER_MSEC;
    size_t got = 0;
    int fd = -1, count = 0;
    bool trunc = false;
    kvd_status_t s = KVD_OK;
    while (got < len && s == KVD_OK) {
        s = handoff_wait(sock, deadline);
        if (s != KVD_OK) {
            break;
        }
        kvd_handoff_piece_t piece;
        s = kvd_handoff_read(sock, data + got, len - got, &piece);
        if (s == KVD_AGAIN) {
            s = KVD_OK;
            continue;
        }
        if (s != KVD_OK) {
            break;
        }
        if (fd < 0) {
            fd = piece.fd;
        } else if (piece.fd >= 0) {
            close(piece.fd);
        }
        count += piece.num_fds;
        trunc = trunc || piece.truncated;
        if (piece.n == 0) {
            s = got == 0 ? KVD_ERR_PEER : KVD_ERR_PROTO;
        }
        got += piece.n;
    }
    if (s == KVD_OK && (count > 1 || trunc)) {
        s = KVD_ERR_PROTO;
    }
    if (s != KVD_OK) {
        if (fd >= 0) {
            close(fd);
        }
        return s;
    }
    *fd_out = fd;
    return KVD_OK;
}
