/*
 * The daemon's arena in this process (client_int.h): the hand-off that maps
 * it (the memfd over <socket>.shm, client/handoff.h), the remap after a
 * daemon restart, and the calls that turn arena offsets into pointers.
 *
 * Offsets are only meaningful in the arena of the instance that gave them,
 * so every mapping is kept with its instance and a count of the leases and
 * reservations the caller still holds from it: kvd_client_lease_ptr and
 * kvd_client_reservation_ptr resolve through that mapping (never through a
 * newer arena, where the same offset is another object's slot), and an old
 * mapping is unmapped when its count reaches zero, so a restarted daemon's
 * memory is not kept alive by every client that knew it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "client/client_int.h"
#include "common/log_int.h"
#include "common/time_int.h"

/* ---- arena mappings (`mu` held) ------------------------------------------ */

/* Whether arena offsets [offset, offset + len) are in the current mapping
 * (the caller's partition of the daemon's arena). */
bool kvd_cl_arena_contains(const kvd_client_t *c, uint64_t offset, uint64_t len)
{
    if (offset < c->offset) {
        return false;
    }
    offset -= c->offset;
    return offset < c->size_bytes && len <= c->size_bytes - offset;
}

static void map_remove(kvd_client_t *c, size_t i)
{
    kvd_arena_mapping_close(c->maps[i].map);
    memmove(c->maps + i, c->maps + i + 1,
            (c->n_maps - i - 1) * sizeof c->maps[0]);
    c->n_maps--;
}

cl_map_t *kvd_cl_map_of_instance(kvd_client_t *c, uint64_t instance)
{
    for (size_t i = 0; i < c->n_maps; i++) {
        if (c->maps[i].instance == instance) {
            return &c->maps[i];
        }
    }
    return NULL;
}

/* Adds `delta` to what the caller holds of `instance`'s arena; unmaps that
 * arena when it is not the current one and nothing of it is held. */
void kvd_cl_map_held(kvd_client_t *c, uint64_t instance, int64_t delta)
{
    cl_map_t *m = kvd_cl_map_of_instance(c, instance);
    if (m == NULL) {
        return;
    }
    m->held =
        delta < 0 && (uint64_t)-delta > m->held ? 0 : m->held + (uint64_t)delta;
    if (m->held == 0 && m->instance != c->instance) {
        KVD_LOG_DEBUG("store client: arena of instance %016" PRIx64 " unmapped",
                      m->instance);
        map_remove(c, (size_t)(m - c->maps));
    }
}

/* ---- the hand-off -------------------------------------------------------- */

/* One hand-off exchange: the daemon's reply in *r, its memfd in *fd_out
 * and the connection in *sock_out (both to close), or an error with the
 * reason in `err` (nothing left open). */
static kvd_status_t cl_handoff(kvd_client_t *c, kvd_handoff_reply_t *r,
                               int *fd_out, int *sock_out, char *err,
                               size_t err_len)
{
    int sock = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (sock < 0) {
        return kvd_status_from_errno(errno);
    }
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", c->shm_path);
    if (connect(sock, (struct sockaddr *)&a, sizeof a) != 0) {
        kvd_config_err(err, err_len, "store.address: %s: %s", c->shm_path,
                       strerror(errno));
        close(sock);
        return KVD_ERR_UNREACHABLE;
    }
    uint8_t hello[KVD_HANDOFF_HELLO_BYTES], rbuf[KVD_HANDOFF_REPLY_BYTES];
    kvd_handoff_hello_encode(hello);
    int fd = -1;
    kvd_status_t s = kvd_handoff_send(sock, hello, sizeof hello, -1);
    if (s == KVD_OK) {
        s = kvd_handoff_recv(sock, rbuf, sizeof rbuf, (int)c->cfg.timeout_ms,
                             &fd);
    }
    if (s == KVD_OK) {
        s = kvd_handoff_reply_decode(rbuf, sizeof rbuf, r, err, err_len);
    } else {
        kvd_config_err(err, err_len, "store.address: %s: hand-off: %s",
                       c->shm_path, kvd_status_str(s));
    }
    if (s == KVD_OK && r->status != KVD_OK) {
        kvd_config_err(err, err_len,
                       "store.address: the daemon refused the "
                       "hand-off: %s",
                       kvd_status_str(r->status));
        s = r->status;
    }
    if (s == KVD_OK && fd < 0) {
        kvd_config_err(err, err_len, "hand-off reply without a descriptor");
        s = KVD_ERR_PROTO;
    }
    if (s != KVD_OK) {
        if (fd >= 0) {
            close(fd);
        }
        close(sock);
        return s;
    }
    *fd_out = fd;
    *sock_out = sock;
    return KVD_OK;
}

/* Sets the session the calls send from the hand-off's reply. */
static void cl_session_set(kvd_client_t *c, const kvd_handoff_reply_t *r)
{
    for (size_t i = 0; i < KVD_HANDOFF_SESSION_BYTES; i++) {
        snprintf(c->session_hex + 2 * i, 3, "%02x", r->session[i]);
    }
}

/* Asks the daemon for its arena and maps it; `mu` held. */
kvd_status_t kvd_cl_arena_map(kvd_client_t *c, char *err, size_t err_len)
{
    kvd_handoff_reply_t r;
    int fd = -1, sock = -1;
    kvd_status_t s = cl_handoff(c, &r, &fd, &sock, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    kvd_arena_mapping_t *map = NULL;
    if (s == KVD_OK) {
        kvd_arena_export_t exp = {.fd = fd,
                                  .map_bytes = r.map_bytes,
                                  .size_bytes = r.size_bytes,
                                  .chunk_bytes = r.size_bytes,
                                  .offset = r.offset};
        s = kvd_arena_mapping_open(&exp, &map);
        if (s != KVD_OK) {
            kvd_config_err(err, err_len, "mapping the daemon's arena: %s",
                           kvd_status_str(s));
        }
    }
    if (s != KVD_OK) {
        close(fd);
        close(sock);
        return s;
    }
    /* The connection stays open while this process maps the arena: its
     * end tells the daemon that nothing here can touch a slot any more
     * (it then frees the slots of our expired leases and reservations it
     * kept quarantined). The previous daemon's is of no use now. */
    if (c->handoff_fd >= 0) {
        close(c->handoff_fd);
    }
    c->handoff_fd = sock;
    if (c->n_maps == CL_MAPPINGS_MAX) {
        /* A daemon that restarted this often while the caller held on to
         * leases of each instance: the oldest mapping goes. */
        KVD_LOG_WARN("store client: %u arena mappings: unmapping the oldest "
                     "with %" PRIu64 " leases or reservations still held",
                     CL_MAPPINGS_MAX, c->maps[0].held);
        map_remove(c, 0);
    }
    c->maps[c->n_maps++] =
        (cl_map_t){.map = map, .instance = r.instance_id, .gen = ++c->map_gen};
    if (c->arena_fd >= 0) {
        close(c->arena_fd);
    }
    c->arena_fd = fd;
    c->map = map;
    c->map_bytes = r.map_bytes;
    c->size_bytes = r.size_bytes;
    c->offset = r.offset;
    c->instance = r.instance_id;
    snprintf(c->instance_hex, sizeof c->instance_hex, "%016" PRIx64,
             r.instance_id);
    if (c->n_maps >= 2) {
        kvd_cl_map_held(c, c->maps[c->n_maps - 2].instance, 0);
    }
    cl_session_set(c, &r);
    return KVD_OK;
}

kvd_status_t kvd_cl_session_renew(kvd_client_t *c, const char *used)
{
    kvd_status_t s = KVD_OK;
    char err[256] = "";
    pthread_mutex_lock(&c->mu);
    if (c->handoff_fd < 0) {
        s = KVD_ERR_AUTH; /* no hand-off session to renew (TCP) */
    } else if (strcmp(c->session_hex, used) == 0) {
        kvd_handoff_reply_t r;
        int fd = -1, sock = -1;
        s = cl_handoff(c, &r, &fd, &sock, err, sizeof err);
        if (s == KVD_OK && r.instance_id == c->instance &&
            r.map_bytes == c->map_bytes && r.size_bytes == c->size_bytes &&
            r.offset == c->offset) {
            /* The same arena: keep the mapping, take the new session and
             * its connection (the old one's end closes the old session). */
            close(fd);
            close(c->handoff_fd);
            c->handoff_fd = sock;
            cl_session_set(c, &r);
        } else if (s == KVD_OK) {
            close(fd);
            close(sock);
            s = kvd_cl_arena_map(c, err, sizeof err);
        }
        if (s == KVD_OK) {
            KVD_LOG_INFO("store client: the daemon no longer knew our "
                         "session; handed off again");
        } else {
            KVD_LOG_WARN("store client: session renewal failed: %s",
                         err[0] ? err : kvd_status_str(s));
        }
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* After KVD_ERR_STATE from an instance we used: map the new arena (once,
 * whichever thread sees it first). */
kvd_status_t kvd_cl_arena_remap(kvd_client_t *c, uint64_t used)
{
    kvd_status_t s = KVD_OK;
    pthread_mutex_lock(&c->mu);
    if (c->instance == used) {
        char err[256] = "";
        s = kvd_cl_arena_map(c, err, sizeof err);
        if (s == KVD_OK) {
            KVD_LOG_INFO("store client: daemon restarted; arena mapped again "
                         "(instance %s)",
                         c->instance_hex);
        } else {
            KVD_LOG_WARN("store client: daemon restarted, remap failed: %s",
                         err);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

/* Unmaps every arena, the current one last, and closes its descriptor. */
void kvd_cl_arena_unmap_all(kvd_client_t *c)
{
    while (c->n_maps > 0) {
        map_remove(c, c->n_maps - 1);
    }
    if (c->arena_fd >= 0) {
        close(c->arena_fd);
    }
    /* Last: once this closes the daemon may reuse our expired slots. */
    if (c->handoff_fd >= 0) {
        close(c->handoff_fd);
        c->handoff_fd = -1;
    }
}

/* ---- arena pointers ------------------------------------------------------ */

void *kvd_client_arena_ptr(kvd_client_t *c, uint64_t offset, uint64_t len)
{
    pthread_mutex_lock(&c->mu);
    void *p = len == 0 ? NULL : kvd_arena_mapping_ptr(c->map, offset, len);
    pthread_mutex_unlock(&c->mu);
    return p;
}

void *kvd_client_lease_ptr(kvd_client_t *c, const kvd_store_lease_t *lease)
{
    void *p = NULL;
    pthread_mutex_lock(&c->mu);
    const cl_group_t *grp = kvd_cl_lease_group(c, lease);
    /* Past the deadline the daemon may have ended the lease. */
    if (lease->tier == KVD_STORE_TIER_HOST && lease->size_bytes > 0 &&
        grp != NULL && kvd_time_now_ns() < grp->deadline_ns) {
        cl_map_t *m = kvd_cl_map_of_instance(c, grp->instance);
        if (m != NULL) {
            p = kvd_arena_mapping_ptr(m->map, lease->arena_offset,
                                      lease->size_bytes);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return p;
}

kvd_status_t kvd_client_arena_hold(kvd_client_t *c, void **base_out,
                                   uint64_t *size_bytes_out,
                                   uint32_t *generation_out)
{
    kvd_status_t s = KVD_ERR_STATE;
    pthread_mutex_lock(&c->mu);
    if (c->n_maps > 0) {
        cl_map_t *m = &c->maps[c->n_maps - 1];
        m->held++;
        *base_out = kvd_arena_mapping_base(m->map);
        *size_bytes_out = kvd_arena_mapping_size(m->map);
        *generation_out = m->gen;
        s = KVD_OK;
    }
    pthread_mutex_unlock(&c->mu);
    return s;
}

void kvd_client_arena_unhold(kvd_client_t *c, uint32_t generation)
{
    pthread_mutex_lock(&c->mu);
    for (size_t i = 0; i < c->n_maps; i++) {
        if (c->maps[i].gen == generation) {
            kvd_cl_map_held(c, c->maps[i].instance, -1);
            break;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

uint32_t kvd_client_arena_generation(kvd_client_t *c)
{
    pthread_mutex_lock(&c->mu);
    uint32_t g = c->n_maps > 0 ? c->maps[c->n_maps - 1].gen : 0;
    pthread_mutex_unlock(&c->mu);
    return g;
}

kvd_status_t kvd_client_arena_export(kvd_client_t *c,
                                     kvd_store_arena_export_t *out)
{
    pthread_mutex_lock(&c->mu);
    int fd = fcntl(c->arena_fd, F_DUPFD_CLOEXEC, 0);
    int e = errno;
    out->map_bytes = c->map_bytes;
    out->size_bytes = c->size_bytes;
    out->offset = c->offset;
    pthread_mutex_unlock(&c->mu);
    if (fd < 0) {
        return kvd_status_from_errno(e);
    }
    out->fd = fd;
    return KVD_OK;
}
