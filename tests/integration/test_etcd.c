/*
 * The etcd v3 client (cluster/etcd.c) against a real etcd: Debian's
 * etcd-server, started here on 127.0.0.1 ports the kernel picked, with its
 * data in a temporary directory, and stopped by its pid. Skipped (77) when
 * KVDEPOT_ETCD does not name an etcd binary.
 *
 * What it proves: leases are granted, renewed and expire; keys put under a
 * lease are read back by prefix with the read's revision; a watch opened
 * from that revision + 1 sees later puts and the deletion a lease expiry
 * causes; a dead etcd fails calls within the deadline; a restarted etcd is
 * used again by the same client. Membership (cluster/membership.c) on top:
 * nodes see each other, a stopped node leaves at once, a SIGKILLed node
 * (a child process: this binary run with --member) leaves after its lease
 * TTL, and a view goes stale while etcd is down and recovers after.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cluster/etcd_int.h"
#include "cluster/membership.h"
#include "tests/unit/kvd_testdir_int.h"
#include "tests/integration/kvd_testetcd_int.h"

#define TIMEOUT_MS 2000

/* Waits until etcd grants a lease (it is serving). */
static void etcd_wait_ready(kvd_etcd_t *e)
{
    int64_t id = 0;
    for (double end = now_s() + 20; now_s() < end; usleep(50000)) {
        if (kvd_etcd_lease_grant(e, 5, &id, NULL) == KVD_OK) {
            assert_int_equal(kvd_etcd_lease_revoke(e, id), KVD_OK);
            return;
        }
    }
    fail_msg("etcd did not come up");
}

static int setup(void **state)
{
    const char *bin = getenv("KVDEPOT_ETCD");
    if (bin == NULL || bin[0] == '\0' || access(bin, X_OK) != 0) {
        return -1;
    }
    etcd_proc_t *p = calloc(1, sizeof *p);
    assert_non_null(p);
    kvd_test_dir_make(&p->dir, "etcd");
    etcd_start_listening(p);
    *state = p;
    return 0;
}

static int teardown(void **state)
{
    etcd_proc_t *p = *state;
    etcd_kill(p, SIGKILL);
    kvd_test_dir_remove(&p->dir);
    free(p);
    return 0;
}

typedef struct seen {
    char keys[8][64];
    char values[8][64];
    int n;
    int puts, deletes;
    char last_deleted[64];
} seen_t;

static kvd_status_t collect(void *ctx, const kvd_etcd_kv_t *kv)
{
    seen_t *s = ctx;
    if (s->n < 8) {
        snprintf(s->keys[s->n], sizeof s->keys[0], "%s", kv->key);
        snprintf(s->values[s->n], sizeof s->values[0], "%.*s",
                 (int)kv->value_len, (const char *)kv->value);
        s->n++;
    }
    return KVD_OK;
}

static kvd_status_t on_event(void *ctx, enum kvd_etcd_event_type type,
                             const kvd_etcd_kv_t *kv)
{
    seen_t *s = ctx;
    if (type == KVD_ETCD_PUT) {
        s->puts++;
        return collect(ctx, kv);
    }
    s->deletes++;
    snprintf(s->last_deleted, sizeof s->last_deleted, "%s", kv->key);
    return KVD_OK;
}

static void test_leases_keys_and_watch(void **state)
{
    etcd_proc_t *p = *state;
    kvd_etcd_t *e = NULL;
    assert_int_equal(kvd_etcd_open(p->endpoint, TIMEOUT_MS, &e), KVD_OK);
    etcd_wait_ready(e);

    int64_t short_lease = 0, long_lease = 0, ttl = 0;
    assert_int_equal(kvd_etcd_lease_grant(e, 1, &short_lease, &ttl), KVD_OK);
    assert_true(short_lease != 0);
    assert_int_equal(kvd_etcd_lease_grant(e, 30, &long_lease, &ttl), KVD_OK);
    assert_int_equal(ttl, 30);
    assert_int_equal(
        kvd_etcd_put(e, "/kvdepot/t/nodes/a", "addr-a", 6, long_lease), KVD_OK);
    assert_int_equal(
        kvd_etcd_put(e, "/kvdepot/t/nodes/b", "addr-b", 6, short_lease),
        KVD_OK);
    assert_int_equal(kvd_etcd_put(e, "/kvdepot/t/other", "x", 1, 0), KVD_OK);

    seen_t got = {0};
    int64_t rev = 0;
    assert_int_equal(
        kvd_etcd_get_prefix(e, "/kvdepot/t/nodes/", collect, &got, &rev),
        KVD_OK);
    assert_int_equal(got.n, 2);
    assert_string_equal(got.keys[0], "/kvdepot/t/nodes/a");
    assert_string_equal(got.values[1], "addr-b");
    assert_true(rev > 0);

    /* From the read's revision on: nothing is missed in between. */
    assert_int_equal(
        kvd_etcd_put(e, "/kvdepot/t/nodes/c", "addr-c", 6, long_lease), KVD_OK);
    kvd_etcd_watch_t *w = NULL;
    assert_int_equal(kvd_etcd_watch_open(e, "/kvdepot/t/nodes/", rev + 1, &w),
                     KVD_OK);
    seen_t ev = {0};
    /* Node b's 1 s lease runs out with no keep-alive: its key is deleted.
     * Node a's is renewed meanwhile. */
    double t0 = now_s();
    while (ev.deletes == 0 && now_s() < t0 + 10) {
        kvd_status_t s = kvd_etcd_watch_next(w, 500, on_event, &ev);
        assert_true(s == KVD_OK || s == KVD_ERR_TIMEOUT);
        assert_int_equal(kvd_etcd_lease_keepalive(e, long_lease, &ttl), KVD_OK);
        assert_true(ttl > 0);
    }
    assert_int_equal(ev.puts, 1);
    assert_string_equal(ev.keys[0], "/kvdepot/t/nodes/c");
    assert_int_equal(ev.deletes, 1);
    assert_string_equal(ev.last_deleted, "/kvdepot/t/nodes/b");
    assert_int_equal(kvd_etcd_lease_keepalive(e, short_lease, &ttl),
                     KVD_ERR_NOT_FOUND);

    /* Nothing more: a wait times out and the watch stays usable. */
    assert_int_equal(kvd_etcd_watch_next(w, 100, on_event, &ev),
                     KVD_ERR_TIMEOUT);
    assert_int_equal(kvd_etcd_put(e, "/kvdepot/t/nodes/d", "addr-d", 6, 0),
                     KVD_OK);
    kvd_status_t s = KVD_ERR_TIMEOUT;
    for (int i = 0; i < 20 && ev.puts < 2; i++) {
        s = kvd_etcd_watch_next(w, 250, on_event, &ev);
    }
    assert_int_equal(s, KVD_OK);
    assert_int_equal(ev.puts, 2);

    /* Revoking a lease deletes its keys at once. */
    assert_int_equal(kvd_etcd_lease_revoke(e, long_lease), KVD_OK);
    memset(&got, 0, sizeof got);
    assert_int_equal(
        kvd_etcd_get_prefix(e, "/kvdepot/t/nodes/", collect, &got, &rev),
        KVD_OK);
    assert_int_equal(got.n, 1);
    assert_string_equal(got.keys[0], "/kvdepot/t/nodes/d");
    kvd_etcd_watch_close(w);

    /* Bad arguments. */
    assert_int_equal(kvd_etcd_put(e, "", "x", 1, 0), KVD_ERR_INVALID);
    assert_int_equal(kvd_etcd_lease_grant(e, 0, &ttl, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_etcd_get_prefix(e, "", collect, &got, NULL),
                     KVD_ERR_INVALID);
    kvd_etcd_close(e);
}

static void test_dead_and_restarted_etcd(void **state)
{
    etcd_proc_t *p = *state;
    kvd_etcd_t *e = NULL;
    assert_int_equal(kvd_etcd_open(p->endpoint, 500, &e), KVD_OK);
    etcd_wait_ready(e);
    kvd_etcd_watch_t *w = NULL;
    assert_int_equal(kvd_etcd_watch_open(e, "/kvdepot/r/", 0, &w), KVD_OK);

    etcd_kill(p, SIGKILL);
    /* Calls fail within the deadline (plus the client's 1 s slack). */
    double t0 = now_s();
    kvd_status_t s = kvd_etcd_put(e, "/kvdepot/r/x", "1", 1, 0);
    assert_true(s == KVD_ERR_UNREACHABLE || s == KVD_ERR_TIMEOUT);
    assert_true(now_s() - t0 < 2.0);
    seen_t ev = {0};
    s = KVD_ERR_TIMEOUT;
    for (int i = 0; i < 20 && s == KVD_ERR_TIMEOUT; i++) {
        s = kvd_etcd_watch_next(w, 250, on_event, &ev);
    }
    assert_int_equal(s, KVD_ERR_UNREACHABLE); /* the stream ended */
    kvd_etcd_watch_close(w);

    /* Same ports, same data: the client finds it again by itself. */
    etcd_start(p);
    etcd_wait_ready(e);
    assert_int_equal(kvd_etcd_put(e, "/kvdepot/r/x", "1", 1, 0), KVD_OK);
    kvd_etcd_close(e);
}

/* ---- membership ---------------------------------------------------------- */

static kvd_membership_t *member_start(const etcd_proc_t *p, const char *id,
                                      int ttl_s)
{
    kvd_member_t self;
    memset(&self, 0, sizeof self);
    snprintf(self.node_id, sizeof self.node_id, "%s", id);
    snprintf(self.grpc_address, sizeof self.grpc_address, "127.0.0.1:%d",
             1000 + id[0]);
    self.ucx_address_len = 16;
    memset(self.ucx_address, id[0], 16);
    self.capacity_bytes = UINT64_C(1) << 30;
    snprintf(self.version, sizeof self.version, "test");
    kvd_membership_config_t cfg = {.etcd_endpoint = p->endpoint,
                                   .cluster = "t1",
                                   .self = &self,
                                   .lease_ttl_s = ttl_s,
                                   .timeout_ms = 500};
    kvd_membership_t *m = NULL;
    assert_int_equal(kvd_membership_start(&cfg, &m), KVD_OK);
    return m;
}

/* Waits up to `secs` for `m`'s view to list exactly `ids` (comma-separated,
 * in order, "" for none) and not be stale. */
static bool view_is(kvd_membership_t *m, const char *ids, double secs)
{
    static kvd_member_t nodes[8];
    for (double end = now_s() + secs;; usleep(20000)) {
        kvd_membership_stats_t st;
        size_t n = kvd_membership_view(m, nodes, 8, &st);
        char got[256] = "";
        for (size_t i = 0; i < n && i < 8; i++) {
            size_t len = strlen(got);
            snprintf(got + len, sizeof got - len, "%s%.32s", i ? "," : "",
                     nodes[i].node_id);
        }
        if (!st.stale && strcmp(got, ids) == 0) {
            return true;
        }
        if (now_s() > end) {
            fprintf(stderr, "view: [%s]%s, want [%s]\n", got,
                    st.stale ? " (stale)" : "", ids);
            return false;
        }
    }
}

static bool is_stale(kvd_membership_t *m, double secs)
{
    for (double end = now_s() + secs; now_s() < end; usleep(20000)) {
        kvd_membership_stats_t st;
        (void)kvd_membership_view(m, NULL, 0, &st);
        if (st.stale) {
            return true;
        }
    }
    return false;
}

static void test_membership(void **state)
{
    etcd_proc_t *p = *state;
    kvd_etcd_t *e = NULL;
    assert_int_equal(kvd_etcd_open(p->endpoint, TIMEOUT_MS, &e), KVD_OK);
    etcd_wait_ready(e);
    kvd_etcd_close(e);

    kvd_membership_t *a = member_start(p, "a", 2);
    kvd_membership_t *b = member_start(p, "b", 2);
    assert_true(view_is(a, "a,b", 5));
    assert_true(view_is(b, "a,b", 5));
    kvd_member_t nodes[2];
    assert_int_equal(kvd_membership_view(a, nodes, 2, NULL), 2);
    assert_string_equal(nodes[1].grpc_address, "127.0.0.1:1098");
    assert_int_equal(nodes[1].ucx_address_len, 16);
    assert_int_equal(nodes[1].ucx_address[15], 'b');

    /* A stopped node revokes its lease: gone at once. */
    double t0 = now_s();
    kvd_membership_stop(b);
    assert_true(view_is(a, "a", 2));
    double left_stopped = now_s() - t0;

    /* A node SIGKILLed in another process: gone after its lease's TTL
     * (2 s), while a keeps its own lease alive. */
    char port[16];
    snprintf(port, sizeof port, "%d", p->client_port);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        execl("/proc/self/exe", "test_etcd", "--member", port, "c",
              (char *)NULL);
        _exit(127);
    }
    assert_true(view_is(a, "a,c", 10));
    t0 = now_s();
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    assert_true(view_is(a, "a", 8));
    double left_killed = now_s() - t0;
    fprintf(stderr,
            "membership: stopped node left in %.2f s, SIGKILLed node (TTL 2 "
            "s) in %.2f s\n",
            left_stopped, left_killed);
    assert_true(left_killed >= 1.0);

    /* etcd down: the view goes stale, keeps its last members, and comes
     * back when etcd does. */
    etcd_kill(p, SIGKILL);
    assert_true(is_stale(a, 5));
    assert_int_equal(kvd_membership_view(a, nodes, 2, NULL), 1);
    etcd_start(p);
    t0 = now_s();
    assert_true(view_is(a, "a", 15));
    fprintf(stderr, "membership: view fresh again %.2f s after etcd restart\n",
            now_s() - t0);
    kvd_membership_stop(a);
}

/* The child of test_membership: a member until killed. */
static int member_child(const char *port, const char *id)
{
    etcd_proc_t p;
    memset(&p, 0, sizeof p);
    snprintf(p.endpoint, sizeof p.endpoint, "127.0.0.1:%s", port);
    kvd_member_t self;
    memset(&self, 0, sizeof self);
    snprintf(self.node_id, sizeof self.node_id, "%s", id);
    kvd_membership_config_t cfg = {.etcd_endpoint = p.endpoint,
                                   .cluster = "t1",
                                   .self = &self,
                                   .lease_ttl_s = 2,
                                   .timeout_ms = 500};
    kvd_membership_t *m = NULL;
    if (kvd_membership_start(&cfg, &m) != KVD_OK) {
        return 1;
    }
    for (;;) {
        pause();
    }
}

/* Several endpoints: a call that cannot reach the first goes on to the
 * next at once, whichever place the live one has; watches follow. */
static void test_several_endpoints(void **state)
{
    etcd_proc_t *p = *state;
    kvd_etcd_t *e = NULL;
    assert_int_equal(kvd_etcd_open(p->endpoint, TIMEOUT_MS, &e), KVD_OK);
    etcd_wait_ready(e);
    kvd_etcd_close(e);

    char list[160];
    int dead = free_port();
    for (int order = 0; order < 2; order++) {
        if (order == 0) {
            snprintf(list, sizeof list, "127.0.0.1:%d,%s", dead, p->endpoint);
        } else {
            snprintf(list, sizeof list, "%s,127.0.0.1:%d", p->endpoint, dead);
        }
        assert_int_equal(kvd_etcd_open(list, TIMEOUT_MS, &e), KVD_OK);
        int64_t lease = 0, ttl = 0;
        assert_int_equal(kvd_etcd_lease_grant(e, 30, &lease, &ttl), KVD_OK);
        assert_int_equal(kvd_etcd_put(e, "/kvdepot/multi/k", "v", 1, lease),
                         KVD_OK);
        seen_t got = {0};
        int64_t rev = 0;
        assert_int_equal(
            kvd_etcd_get_prefix(e, "/kvdepot/multi/", collect, &got, &rev),
            KVD_OK);
        assert_int_equal(got.n, 1);
        assert_string_equal(got.values[0], "v");
        kvd_etcd_watch_t *w = NULL;
        assert_int_equal(kvd_etcd_watch_open(e, "/kvdepot/multi/", rev + 1, &w),
                         KVD_OK);
        kvd_etcd_watch_close(w);
        assert_int_equal(kvd_etcd_lease_revoke(e, lease), KVD_OK);
        kvd_etcd_close(e);
    }
    /* Every endpoint dead: unreachable, after trying each. */
    snprintf(list, sizeof list, "127.0.0.1:%d,127.0.0.1:%d", dead, free_port());
    assert_int_equal(kvd_etcd_open(list, TIMEOUT_MS, &e), KVD_OK);
    int64_t lease = 0, ttl = 0;
    assert_int_equal(kvd_etcd_lease_grant(e, 30, &lease, &ttl),
                     KVD_ERR_UNREACHABLE);
    kvd_etcd_close(e);
    /* An empty endpoint, or more than the client takes. */
    assert_int_equal(kvd_etcd_open("a:1,,b:2", TIMEOUT_MS, &e),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_etcd_open("a:1,", TIMEOUT_MS, &e), KVD_ERR_INVALID);
    assert_int_equal(
        kvd_etcd_open("a:1,b:1,c:1,d:1,e:1,f:1,g:1,h:1,i:1", TIMEOUT_MS, &e),
        KVD_ERR_INVALID);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--member") == 0) {
        return member_child(argv[2], argv[3]);
    }
    const char *bin = getenv("KVDEPOT_ETCD");
    if (bin == NULL || bin[0] == '\0' || access(bin, X_OK) != 0) {
        fprintf(stderr, "test_etcd: no etcd binary (KVDEPOT_ETCD); skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_leases_keys_and_watch, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_dead_and_restarted_etcd, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_membership, setup, teardown),
        cmocka_unit_test_setup_teardown(test_several_endpoints, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
