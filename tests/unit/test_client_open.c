/*
 * The store client's open and close (client/client.c, client/open.c)
 * against a kvdepotd run in this process (kvd_testclient_int.h):
 *   - a bad configuration is refused with KVD_ERR_INVALID and the reason,
 *     nothing written to the out-parameter;
 *   - no daemon: KVD_ERR_UNREACHABLE at once; a hand-off socket that never
 *     answers: KVD_ERR_TIMEOUT after store.timeout; a daemon whose gRPC
 *     socket is gone: the open's ping fails with KVD_ERR_UNREACHABLE
 *     within store.timeout;
 *   - kvd_store_open in daemon mode gives a store whose ops are the
 *     client's ("daemon"), kvd_client_of / kvd_client_store round trip,
 *     and what a daemon does not offer is KVD_ERR_UNSUPPORTED;
 *   - a daemon that goes away turns calls into KVD_ERR_UNREACHABLE within
 *     the deadline; the same store answers again once one is back.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <sys/socket.h>
#include <sys/un.h>

#include "tests/unit/kvd_testclient_int.h"

static kvd_client_config_t good_cfg(const char *address)
{
    return (kvd_client_config_t){.address = address,
                                 .timeout_ms = 1000,
                                 .lease_ttl_ms = 30000,
                                 .get_queue = 16};
}

static void test_open_refuses_bad_config(void **state)
{
    (void)state;
    kvd_client_t *sentinel = (kvd_client_t *)&sentinel;
    kvd_client_t *c = sentinel;
    char err[1024] = "";
    kvd_client_config_t cfg = good_cfg("unix:/nonexistent/d.sock");
    assert_int_equal(kvd_client_open(NULL, &c, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_client_open(&cfg, NULL, err, sizeof err),
                     KVD_ERR_INVALID);
    cfg.timeout_ms = 0;
    assert_int_equal(kvd_client_open(&cfg, &c, err, sizeof err),
                     KVD_ERR_INVALID);
    cfg = good_cfg("unix:/nonexistent/d.sock");
    cfg.get_queue = 0;
    assert_int_equal(kvd_client_open(&cfg, &c, err, sizeof err),
                     KVD_ERR_INVALID);
    cfg = good_cfg(NULL);
    assert_int_equal(kvd_client_open(&cfg, &c, err, sizeof err),
                     KVD_ERR_INVALID);
    assert_ptr_equal(c, sentinel);

    /* Only a unix socket carries the arena: a bare host:port, an empty
     * path and a path too long for sun_path (with ".shm" added) are refused
     * by name. */
    char longpath[300] = "unix:/";
    memset(longpath + 6, 'p', sizeof longpath - 7);
    longpath[sizeof longpath - 1] = '\0';
    const char *bad[] = {"127.0.0.1:7000", "unix:", longpath};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cfg = good_cfg(bad[i]);
        err[0] = '\0';
        assert_int_equal(kvd_client_open(&cfg, &c, err, sizeof err),
                         KVD_ERR_INVALID);
        assert_non_null(strstr(err, "want unix:PATH"));
        assert_ptr_equal(c, sentinel);
    }

    /* tcp:HOST:PORT is the operator client (no arena): a malformed one is
     * refused by name, a port nobody serves is unreachable; nothing is
     * left open either way. */
    const char *bad_tcp[] = {"tcp:",
                             "tcp:127.0.0.1",
                             "tcp:127.0.0.1:",
                             "tcp:127.0.0.1:http",
                             "tcp:127.0.0.1:70000",
                             "tcp:[::1:7000"};
    for (size_t i = 0; i < sizeof bad_tcp / sizeof bad_tcp[0]; i++) {
        cfg = good_cfg(bad_tcp[i]);
        err[0] = '\0';
        assert_int_equal(kvd_client_open(&cfg, &c, err, sizeof err),
                         KVD_ERR_INVALID);
        assert_non_null(strstr(err, "want tcp:HOST:PORT"));
        assert_ptr_equal(c, sentinel);
    }
    cfg = good_cfg("tcp:127.0.0.1:1");
    cfg.timeout_ms = 300;
    assert_int_not_equal(kvd_client_open(&cfg, &c, err, sizeof err), KVD_OK);
    assert_ptr_equal(c, sentinel);

    /* The same through kvd_store_open's mode switch. */
    kvd_config_t *kc = NULL;
    assert_int_equal(kvd_config_create(&kc), KVD_OK);
    kvd_test_cl_set(kc, "store.mode", "daemon");
    kvd_test_cl_set(kc, "store.address", "127.0.0.1:7000");
    kvd_store_t *st = (kvd_store_t *)sentinel;
    assert_int_equal(kvd_store_open(kc, &st, err, sizeof err), KVD_ERR_INVALID);
    assert_ptr_equal(st, (kvd_store_t *)sentinel);
    kvd_config_destroy(kc);
    kvd_client_close(NULL); /* accepted */
}

static void test_open_without_daemon(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "client_nodaemon");
    char addr[300], err[512] = "";
    snprintf(addr, sizeof addr, "unix:%s/none.sock", d.path);
    kvd_client_config_t cfg = good_cfg(addr);
    cfg.timeout_ms = 5000;
    kvd_client_t *c = NULL;
    uint64_t t0 = kvd_test_cl_now_ms();
    assert_int_equal(kvd_client_open(&cfg, &c, err, sizeof err),
                     KVD_ERR_UNREACHABLE);
    /* Nothing listens: refused at once, not after the deadline. */
    assert_true(kvd_test_cl_now_ms() - t0 < 2500);
    assert_null(c);
    assert_non_null(strstr(err, "none.sock.shm"));

    /* A hand-off socket that accepts and never answers: the deadline. */
    int ls = socket(AF_UNIX, SOCK_STREAM, 0);
    assert_true(ls >= 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    static const char name[] = "/mute.sock.shm";
    size_t dlen = strlen(d.path);
    assert_true(dlen + sizeof name <= sizeof a.sun_path);
    memcpy(a.sun_path, d.path, dlen);
    memcpy(a.sun_path + dlen, name, sizeof name);
    assert_int_equal(bind(ls, (struct sockaddr *)&a, sizeof a), 0);
    assert_int_equal(listen(ls, 4), 0);
    snprintf(addr, sizeof addr, "unix:%s/mute.sock", d.path);
    cfg = good_cfg(addr);
    cfg.timeout_ms = 300;
    t0 = kvd_test_cl_now_ms();
    assert_int_equal(kvd_client_open(&cfg, &c, err, sizeof err),
                     KVD_ERR_TIMEOUT);
    uint64_t took = kvd_test_cl_now_ms() - t0;
    assert_true(took >= 250 && took < 2000);
    assert_null(c);
    close(ls);
    kvd_test_dir_remove(&d);
}

static void test_open_daemon_without_grpc(void **state)
{
    (void)state;
    kvd_test_cl_t t;
    kvd_test_cl_start(&t, "client_nogrpc", false, (const char *)NULL);
    /* The hand-off still answers, the gRPC socket is gone: open maps the
     * arena, then its ping finds nobody and everything is undone. */
    assert_int_equal(unlink(t.address + 5), 0);
    kvd_client_config_t cfg = good_cfg(t.address);
    cfg.timeout_ms = 1500;
    kvd_client_t *c = NULL;
    char err[512] = "";
    uint64_t t0 = kvd_test_cl_now_ms();
    assert_int_equal(kvd_client_open(&cfg, &c, err, sizeof err),
                     KVD_ERR_UNREACHABLE);
    assert_true(kvd_test_cl_now_ms() - t0 < 1500 + 1000);
    assert_null(c);
    assert_non_null(strstr(err, "ping"));
    kvd_test_cl_stop(&t);
}

static void test_open_store_is_the_client(void **state)
{
    (void)state;
    kvd_test_cl_t t;
    kvd_test_cl_start(&t, "client_roundtrip", false, (const char *)NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(kvd_test_cl_open(&t, &st, (const char *)NULL), KVD_OK);
    assert_non_null(st);
    assert_ptr_equal(st->ops, &kvd_client_store_ops);
    assert_string_equal(st->ops->name, "daemon");
    kvd_client_t *c = kvd_client_of(st);
    assert_non_null(c);
    assert_ptr_equal(kvd_client_store(c), st);
    assert_null(kvd_client_of(NULL));
    assert_null(kvd_client_store(NULL));
    /* The daemon's arena is mapped: its first generation, its size. */
    assert_int_equal(kvd_store_arena_generation(st), 1);
    kvd_store_arena_export_t ex;
    assert_int_equal(kvd_store_arena_export(st, &ex), KVD_OK);
    assert_true(ex.fd >= 0);
    assert_int_equal(ex.size_bytes, 16u << 20);
    assert_true(ex.map_bytes >= ex.size_bytes);
    close(ex.fd);
    assert_non_null(kvd_store_arena_ptr(st, 0, KVD_TEST_CL_OBJ));
    assert_null(kvd_store_arena_ptr(st, ex.size_bytes, 1));
    /* The daemon owns its objects and quotas. */
    uint64_t cursor = 0;
    size_t n = 0;
    kvd_store_object_t obj;
    assert_int_equal(kvd_store_scan(st, &cursor, &obj, 1, &n),
                     KVD_ERR_UNSUPPORTED);
    assert_int_equal(kvd_store_tenant_set_quota(st, 1, 1 << 20),
                     KVD_ERR_UNSUPPORTED);
    kvd_store_close(st);

    /* An embedded store is no client, and a client opened directly is. */
    kvd_config_t *kc = NULL;
    assert_int_equal(kvd_config_create(&kc), KVD_OK);
    kvd_test_cl_set(kc, "store.arena_size", "4m");
    kvd_test_cl_set(kc, "store.arena_chunk", "1m");
    kvd_test_cl_set(kc, "store.arena_hugepages", "off");
    kvd_test_cl_set(kc, "store.arena_prefault", "false");
    char err[512] = "";
    assert_int_equal(kvd_store_open(kc, &st, err, sizeof err), KVD_OK);
    kvd_config_destroy(kc);
    assert_string_equal(st->ops->name, "embedded");
    assert_null(kvd_client_of(st));
    kvd_store_close(st);
    kvd_client_config_t cfg = good_cfg(t.address);
    assert_int_equal(kvd_client_open(&cfg, &c, err, sizeof err), KVD_OK);
    assert_ptr_equal(kvd_client_of(kvd_client_store(c)), c);
    kvd_client_close(c);
    kvd_test_cl_stop(&t);
}

static void test_calls_fail_within_deadline_without_daemon(void **state)
{
    (void)state;
    kvd_test_cl_t t;
    kvd_test_cl_start(&t, "client_gone", false, (const char *)NULL);
    kvd_store_t *st = NULL;
    assert_int_equal(
        kvd_test_cl_open(&t, &st, "store.timeout", "500ms", (const char *)NULL),
        KVD_OK);
    kvd_server_stop(t.srv);
    t.srv = NULL;
    kvd_namespace_t ns;
    kvd_block_hash_t h[2];
    kvd_test_cl_keys(&ns, 1, h, 2, 1);
    uint64_t t0 = kvd_test_cl_now_ms();
    kvd_store_stats_t ss;
    kvd_status_t s = kvd_store_stats(st, &ss);
    assert_int_equal(s, KVD_ERR_UNREACHABLE);
    kvd_store_lease_t l[2];
    size_t m = 99;
    s = kvd_store_lookup(st, &ns, h, 2, l, &m);
    assert_int_equal(s, KVD_ERR_UNREACHABLE);
    assert_int_equal(m, 99);
    assert_true(kvd_test_cl_now_ms() - t0 < 2 * 500 + 1000);
    /* Back: the same store answers again. */
    kvd_test_cl_daemon_open(&t);
    uint64_t deadline = kvd_test_cl_now_ms() + 5000;
    while (kvd_store_stats(st, &ss) != KVD_OK) {
        assert_true(kvd_test_cl_now_ms() < deadline);
        usleep(20000);
    }
    assert_int_equal(kvd_store_arena_generation(st), 2);
    kvd_store_close(st);
    kvd_test_cl_stop(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_refuses_bad_config),
        cmocka_unit_test(test_open_without_daemon),
        cmocka_unit_test(test_open_daemon_without_grpc),
        cmocka_unit_test(test_open_store_is_the_client),
        cmocka_unit_test(test_calls_fail_within_deadline_without_daemon),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
