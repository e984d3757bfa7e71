/*
 * kvdepotd's plain-TCP acceptor (rpc_accept_int.h): it owns the listening
 * socket of server.tcp_address when TLS is off, accepts each connection and
 * hands it to the gRPC server as a channel from a descriptor, and keeps one
 * record per descriptor (the peer's address, the wasted calls of the
 * current second) so that rpc.c can have a connection that wastes calls
 * shut down. Shutting the socket (shutdown(2), never close: the descriptor
 * is gRPC's) makes the core see the connection end, cancel its calls and
 * free them. A record is checked against getpeername() before the shut, so
 * a strike that arrives after gRPC closed the descriptor and the number was
 * reused for another socket shuts nothing. A connection that has made no
 * admitted call within server.handshake_timeout of its accept (a caller
 * that stalls before or inside the HTTP/2 preface, idles, or has every
 * call refused) is shut too: gRPC's own handshake deadline does not apply
 * to connections handed over this way.
 */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <grpc/grpc_posix.h>
#include <grpc/grpc_security.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "common/time_int.h"
#include "server/rpc_accept_int.h"
#include "server/rpc_int.h"

/* Descriptors tracked at most (above: handed over, never shut). */
#define ACCEPT_TRACK_MAX 65536
/* How often connections without an admitted call are checked. */
#define ACCEPT_SWEEP_MS 200

typedef struct accept_conn {
    bool open;     /* accepted by us, not shut yet */
    bool admitted; /* one of its calls was admitted */
    uint64_t accepted_ms;
    uint64_t window_s;
    uint32_t strikes;
    socklen_t peer_len;
    struct sockaddr_storage peer;
} accept_conn_t;

struct rpc_accept {
    int listen_fd;
    int stop_fd; /* eventfd: the thread's stop signal */
    grpc_server *server;
    grpc_server_credentials *creds;
    pthread_t thread;
    bool started;
    int deadline_ms;    /* for a connection's first admitted call */
    pthread_mutex_t mu; /* conns and waiting */
    accept_conn_t *conns;
    size_t n_conns;
    int *waiting; /* descriptors without an admitted call yet */
    size_t n_waiting;
};

bool kvd_rpc_address_split(const char *address, char *host, size_t host_len,
                           int *port_out)
{
    const char *colon = NULL;
    const char *h = address;
    size_t hl = 0;
    if (address[0] == '[') {
        const char *close = strchr(address, ']');
        if (close == NULL || close[1] != ':') {
            return false;
        }
        h = address + 1;
        hl = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(address, ':');
        if (colon == NULL) {
            return false;
        }
        hl = (size_t)(colon - address);
    }
    char *end = NULL;
    errno = 0;
    long port = strtol(colon + 1, &end, 10);
    if (hl >= host_len || end == colon + 1 || *end != '\0' || errno != 0 ||
        port < 0 || port > 65535 || colon[1] == '-' || colon[1] == '+' ||
        colon[1] == ' ') {
        return false;
    }
    memcpy(host, h, hl);
    host[hl] = '\0';
    *port_out = (int)port;
    return true;
}

/* A listening socket on the first address `host`:`port` resolves to. */
static int accept_listen(const char *host, const char *port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV};
    struct addrinfo *res = NULL;
    if (getaddrinfo(host[0] != '\0' ? host : NULL, port, &hints, &res) != 0) {
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
        fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                    ai->ai_protocol);
        if (fd < 0) {
            continue;
        }
        int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 ||
            listen(fd, SOMAXCONN) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

kvd_status_t rpc_accept_open(const char *address, rpc_accept_t **out,
                             int *port_out, char *err, size_t err_len)
{
    char host[256], port[16];
    int port_num = 0;
    if (!kvd_rpc_address_split(address, host, sizeof host, &port_num)) {
        kvd_config_err(err, err_len,
                       "server.tcp_address %s: want host:port, [v6]:port or "
                       ":port",
                       address);
        return KVD_ERR_INVALID;
    }
    snprintf(port, sizeof port, "%d", port_num);
    rpc_accept_t *a = calloc(1, sizeof *a);
    struct rlimit rl;
    size_t n = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur > 0 &&
                       rl.rlim_cur < ACCEPT_TRACK_MAX
                   ? (size_t)rl.rlim_cur
                   : ACCEPT_TRACK_MAX;
    if (a == NULL || (a->conns = calloc(n, sizeof *a->conns)) == NULL ||
        (a->waiting = calloc(n, sizeof *a->waiting)) == NULL) {
        if (a != NULL) {
            free(a->conns);
        }
        free(a);
        return KVD_ERR_NOMEM;
    }
    a->n_conns = n;
    pthread_mutex_init(&a->mu, NULL);
    a->stop_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    a->listen_fd = accept_listen(host, port);
    if (a->listen_fd < 0 || a->stop_fd < 0) {
        kvd_config_err(err, err_len, "server.tcp_address %s: cannot bind: %s",
                       address, strerror(errno));
        rpc_accept_free(a);
        return KVD_ERR_UNREACHABLE;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(a->listen_fd, (struct sockaddr *)&ss, &sl) != 0) {
        rpc_accept_free(a);
        return kvd_status_from_errno(errno);
    }
    *port_out = ss.ss_family == AF_INET6
                    ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                    : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *out = a;
    return KVD_OK;
}

/* Records connection `fd` and hands it to gRPC (which expects it
 * non-blocking, as its own listener makes its sockets). */
static void accept_one(rpc_accept_t *a, int fd)
{
    int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if ((size_t)fd < a->n_conns) {
        pthread_mutex_lock(&a->mu);
        accept_conn_t *c = &a->conns[fd];
        *c = (accept_conn_t){.open = true, .accepted_ms = kvd_time_now_ms()};
        c->peer_len = sizeof c->peer;
        if (getpeername(fd, (struct sockaddr *)&c->peer, &c->peer_len) != 0) {
            c->open = false; /* gone already: gRPC will see it end */
        } else if (a->n_waiting < a->n_conns) {
            a->waiting[a->n_waiting++] = fd;
        }
        pthread_mutex_unlock(&a->mu);
    }
    grpc_server_add_channel_from_fd(a->server, fd, a->creds);
}

/* Whether `fd` is still the socket connected to c->peer. */
static bool accept_same_peer(int fd, const accept_conn_t *c)
{
    struct sockaddr_storage now;
    socklen_t len = sizeof now;
    return getpeername(fd, (struct sockaddr *)&now, &len) == 0 &&
           len == c->peer_len && memcmp(&now, &c->peer, len) == 0;
}

/* Shuts the connections that made no admitted call within deadline_ms of
 * their accept (a stalled or idle caller without credentials holds a
 * descriptor no longer than that); forgets those that did. */
static void accept_sweep(rpc_accept_t *a)
{
    uint64_t now = kvd_time_now_ms();
    unsigned long shut = 0;
    pthread_mutex_lock(&a->mu);
    size_t keep = 0;
    for (size_t i = 0; i < a->n_waiting; i++) {
        int fd = a->waiting[i];
        accept_conn_t *c = &a->conns[fd];
        if (!c->open || c->admitted) {
            continue;
        }
        if (now - c->accepted_ms < (uint64_t)a->deadline_ms) {
            a->waiting[keep++] = fd;
            continue;
        }
        if (accept_same_peer(fd, c) && shutdown(fd, SHUT_RDWR) == 0) {
            shut++;
        }
        c->open = false;
    }
    a->n_waiting = keep;
    pthread_mutex_unlock(&a->mu);
    if (shut > 0) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "kvdepotd: closed %lu TCP connections without an "
                            "admitted call within %d ms",
                            shut, a->deadline_ms);
    }
}

static void *accept_main(void *arg)
{
    rpc_accept_t *a = arg;
    uint64_t next_sweep = kvd_time_now_ms() + ACCEPT_SWEEP_MS;
    for (;;) {
        struct pollfd p[2] = {{.fd = a->listen_fd, .events = POLLIN},
                              {.fd = a->stop_fd, .events = POLLIN}};
        int rc = poll(p, 2, ACCEPT_SWEEP_MS);
        if (kvd_time_now_ms() >= next_sweep) {
            accept_sweep(a);
            next_sweep = kvd_time_now_ms() + ACCEPT_SWEEP_MS;
        }
        if (rc < 0 && errno != EINTR) {
            KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_ERROR, 1000,
                                "kvdepotd: TCP accept poll: %s",
                                strerror(errno));
            usleep(10000);
            continue;
        }
        if (rc <= 0) {
            continue;
        }
        if (p[1].revents != 0) {
            return NULL;
        }
        if (!(p[0].revents & POLLIN)) {
            continue;
        }
        int fd =
            accept4(a->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
                errno == ENOMEM) {
                KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                                    "kvdepotd: TCP accept: %s",
                                    strerror(errno));
                usleep(10000); /* let descriptors come back */
            }
            continue;
        }
        accept_one(a, fd);
    }
}

kvd_status_t rpc_accept_start(rpc_accept_t *a, grpc_server *server,
                              int deadline_ms)
{
    a->server = server;
    a->deadline_ms = deadline_ms;
    a->creds = grpc_insecure_server_credentials_create();
    if (a->creds == NULL) {
        return KVD_ERR_NOMEM;
    }
    int rc = pthread_create(&a->thread, NULL, accept_main, a);
    if (rc != 0) {
        return kvd_status_from_errno(rc);
    }
    a->started = true;
    return KVD_OK;
}

/* The descriptor of `peer` ("fd:N") if this acceptor tracks it, else -1. */
static int accept_peer_fd(const rpc_accept_t *a, const char *peer)
{
    int fd = -1;
    char tail = '\0';
    if (a == NULL || peer == NULL || sscanf(peer, "fd:%d%c", &fd, &tail) != 1 ||
        fd < 0 || (size_t)fd >= a->n_conns) {
        return -1;
    }
    return fd;
}

void rpc_accept_admit(rpc_accept_t *a, const char *peer)
{
    int fd = accept_peer_fd(a, peer);
    if (fd < 0) {
        return;
    }
    pthread_mutex_lock(&a->mu);
    a->conns[fd].admitted = true;
    pthread_mutex_unlock(&a->mu);
}

bool rpc_accept_strike(rpc_accept_t *a, const char *peer)
{
    int fd = accept_peer_fd(a, peer);
    if (fd < 0) {
        return false;
    }
    uint64_t now_s = kvd_time_now_ms() / 1000;
    bool shut = false;
    uint32_t strikes = 0;
    pthread_mutex_lock(&a->mu);
    accept_conn_t *c = &a->conns[fd];
    if (c->open) {
        if (c->window_s != now_s) {
            c->window_s = now_s;
            c->strikes = 0;
        }
        strikes = ++c->strikes;
        if (strikes > RPC_CONN_STRIKES && accept_same_peer(fd, c)) {
            shut = shutdown(fd, SHUT_RDWR) == 0;
            c->open = false;
        }
    }
    pthread_mutex_unlock(&a->mu);
    if (shut) {
        KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000,
                            "kvdepotd: closed TCP connection %s: %u refused "
                            "or cancelled calls within a second",
                            peer, (unsigned)strikes);
    }
    return shut;
}

void rpc_accept_stop(rpc_accept_t *a)
{
    if (a == NULL || !a->started) {
        return;
    }
    uint64_t one = 1;
    (void)!write(a->stop_fd, &one, sizeof one);
    pthread_join(a->thread, NULL);
    a->started = false;
}

void rpc_accept_free(rpc_accept_t *a)
{
    if (a == NULL) {
        return;
    }
    rpc_accept_stop(a);
    if (a->listen_fd >= 0) {
        close(a->listen_fd);
    }
    if (a->stop_fd >= 0) {
        close(a->stop_fd);
    }
    if (a->creds != NULL) {
        grpc_server_credentials_release(a->creds);
    }
    pthread_mutex_destroy(&a->mu);
    free(a->waiting);
    free(a->conns);
    free(a);
}
