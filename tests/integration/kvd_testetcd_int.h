/*
 * A real etcd (Debian's etcd-server, $KVDEPOT_ETCD) for the integration
 * tests: started on 127.0.0.1 ports the kernel picked, its data and log in
 * the test's directory, stopped by its pid, and killed with the test
 * (PR_SET_PDEATHSIG). Header-only (static inline); the including test has
 * cmocka.h included first.
 */
#ifndef KVD_TESTS_TESTETCD_INT_H
#define KVD_TESTS_TESTETCD_INT_H

#include <arpa/inet.h>
#include <stdbool.h>
#include <stdint.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster/etcd_int.h"
#include "tests/unit/kvd_testdir_int.h"

typedef struct etcd_proc {
    kvd_test_dir_t dir;
    pid_t pid;
    int client_port, peer_port;
    char endpoint[64];
    /* TLS on the client URL: a directory holding server.pem, server.key
     * and ca.pem ("": plaintext); client_auth adds --client-cert-auth
     * (clients must present a certificate signed by ca.pem). */
    char tls_dir[200];
    bool client_auth;
} etcd_proc_t;

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    assert_true(fd >= 0);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Starts etcd on the ports in `p` (picked once, so a restart reuses them
 * and the data directory). */
static inline void etcd_start(etcd_proc_t *p)
{
    const char *bin = getenv("KVDEPOT_ETCD");
    char client[64], peer[64], cluster[96], data[256], log[256];
    bool tls = p->tls_dir[0] != '\0';
    char cert[256], key[256], ca[256];
    snprintf(client, sizeof client, "%s://127.0.0.1:%d", tls ? "https" : "http",
             p->client_port);
    snprintf(cert, sizeof cert, "%s/server.pem", p->tls_dir);
    snprintf(key, sizeof key, "%s/server.key", p->tls_dir);
    snprintf(ca, sizeof ca, "%s/ca.pem", p->tls_dir);
    const char *tls_args[7] = {NULL};
    if (tls) {
        tls_args[0] = "--cert-file";
        tls_args[1] = cert;
        tls_args[2] = "--key-file";
        tls_args[3] = key;
        tls_args[4] = p->client_auth ? "--trusted-ca-file" : NULL;
        tls_args[5] = ca;
        tls_args[6] = "--client-cert-auth";
    }
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", p->peer_port);
    snprintf(cluster, sizeof cluster, "t=%s", peer);
    snprintf(data, sizeof data, "%s/etcd", p->dir.path);
    snprintf(log, sizeof log, "%s/etcd.log", p->dir.path);
    pid_t parent = getpid();
    p->pid = fork();
    assert_true(p->pid >= 0);
    if (p->pid == 0) {
        (void)prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent || freopen(log, "a", stdout) == NULL) {
            _exit(126);
        }
        (void)dup2(STDOUT_FILENO, STDERR_FILENO);
        execl(bin, bin, "--name", "t", "--data-dir", data,
              "--listen-client-urls", client, "--advertise-client-urls", client,
              "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
              "--initial-cluster", cluster, "--log-level", "warn", "--logger",
              "zap", tls_args[0], tls_args[1], tls_args[2], tls_args[3],
              tls_args[4], tls_args[5], tls_args[6], (char *)NULL);
        _exit(127);
    }
}

/* True once etcd's client port accepts a connection. */
static inline bool etcd_listening(const etcd_proc_t *p)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)p->client_port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0) {
        close(fd);
    }
    return ok;
}

/* Picks two free ports and starts etcd on them until it listens. A port
 * free_port returned can be taken again before etcd binds it (another
 * test's listener, or an outgoing connection's source port): etcd then
 * exits, and it is started again on new ports, three times at most. */
static inline void etcd_start_listening(etcd_proc_t *p)
{
    for (int attempt = 0; attempt < 3; attempt++) {
        p->client_port = free_port();
        p->peer_port = free_port();
        snprintf(p->endpoint, sizeof p->endpoint, "127.0.0.1:%d",
                 p->client_port);
        etcd_start(p);
        for (double end = now_s() + 20; now_s() < end; usleep(50000)) {
            if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
                fprintf(stderr,
                        "etcd exited at start (ports %d/%d): "
                        "trying other ports; log %s/etcd.log\n",
                        p->client_port, p->peer_port, p->dir.path);
                p->pid = -1;
                break;
            }
            if (etcd_listening(p)) {
                return;
            }
        }
        if (p->pid > 0) {
            fail_msg("etcd did not listen in 20 s: log %s/etcd.log",
                     p->dir.path);
        }
    }
    fail_msg("etcd exited at start three times: log %s/etcd.log", p->dir.path);
}

static inline void etcd_kill(etcd_proc_t *p, int sig)
{
    if (p->pid > 0) {
        kill(p->pid, sig);
        waitpid(p->pid, NULL, 0);
        p->pid = -1;
    }
}

/* The etcd binary, or NULL when $KVDEPOT_ETCD names none (skip). */
static inline const char *etcd_bin(void)
{
    const char *bin = getenv("KVDEPOT_ETCD");
    return bin != NULL && bin[0] != '\0' && access(bin, X_OK) == 0 ? bin : NULL;
}

/* Starts an etcd of its own for a test program (a temp dir named after
 * `tag`, two free ports on 127.0.0.1) and waits up to 20 s until it grants
 * a lease. Returns whether it answered; etcd_kill and kvd_test_dir_remove
 * undo it either way. */
static inline bool etcd_start_ready(etcd_proc_t *p, const char *tag,
                                    uint32_t timeout_ms)
{
    kvd_test_dir_make(&p->dir, tag);
    p->client_port = free_port();
    p->peer_port = free_port();
    snprintf(p->endpoint, sizeof p->endpoint, "127.0.0.1:%d", p->client_port);
    etcd_start(p);
    kvd_etcd_t *e = NULL;
    if (kvd_etcd_open(p->endpoint, timeout_ms, &e) != KVD_OK) {
        return false;
    }
    int64_t id = 0;
    bool up = false;
    for (double end = now_s() + 20; !up && now_s() < end; usleep(50000)) {
        up = kvd_etcd_lease_grant(e, 5, &id, NULL) == KVD_OK;
    }
    if (up) {
        up = kvd_etcd_lease_revoke(e, id) == KVD_OK;
    }
    kvd_etcd_close(e);
    return up;
}

#endif /* KVD_TESTS_TESTETCD_INT_H */
