/*
 * The store client's Stats and Admin calls (client/admin.c), the operator
 * calls of client/client.h the CLI uses, against a kvdepotd run in this
 * process (kvd_testclient_int.h), each answer checked against what the
 * daemon holds:
 *   - stats: the daemon store's own counters, and its lease count;
 *   - list: every namespace and tenant with its objects and bytes;
 *   - drop_namespace and drop_tenant: the objects go, leased ones stay;
 *   - drain: saves refused while on, the leases and reservations held;
 *   - ping: the daemon's version and node id; config_dump: its settings
 *     one "key = value  # from: source" line each; flush.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include <cmocka.h>

#include "tests/unit/kvd_testclient_int.h"

typedef struct fixture {
    kvd_test_cl_t t;
    kvd_store_t *st;
    kvd_client_t *c;
} fixture_t;

static int setup(void **state)
{
    static fixture_t f;
    kvd_test_cl_start(&f.t, "client_admin", false, (const char *)NULL);
    assert_int_equal(kvd_test_cl_open(&f.t, &f.st, (const char *)NULL), KVD_OK);
    f.c = kvd_client_of(f.st);
    assert_non_null(f.c);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fixture_t *f = *state;
    kvd_store_close(f->st);
    kvd_test_cl_stop(&f->t);
    return 0;
}

static size_t found(kvd_store_t *st, const kvd_namespace_t *ns,
                    const kvd_block_hash_t *h, size_t n)
{
    kvd_store_lease_t l[KVD_TEST_CL_MAX];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, ns, h, n, l, &m), KVD_OK);
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    return m;
}

static void test_stats(void **state)
{
    fixture_t *f = *state;
    kvd_namespace_t ns;
    kvd_block_hash_t h[3];
    kvd_test_cl_keys(&ns, 1, h, 3, 1);
    kvd_test_cl_save(f->st, &ns, h, 3);
    kvd_store_lease_t l[2];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(f->st, &ns, h, 2, l, &m), KVD_OK);
    kvd_store_stats_t got;
    assert_int_equal(kvd_store_stats(f->st, &got), KVD_OK);
    kvd_store_stats_t own;
    kvd_service_stats_t svc;
    kvd_server_collect(f->t.srv, &own, &svc);
    assert_int_equal(got.host.objects, 3);
    assert_int_equal(got.host.objects, own.host.objects);
    assert_int_equal(got.host.bytes, own.host.bytes);
    assert_true(got.host.bytes >= 3 * KVD_TEST_CL_OBJ);
    assert_int_equal(got.host.capacity_bytes, own.host.capacity_bytes);
    assert_int_equal(got.host.capacity_bytes, 16u << 20);
    assert_int_equal(got.host.hits, own.host.hits);
    assert_int_equal(got.disk.objects, 0);
    assert_int_equal(got.checksum_errors, 0);
    assert_int_equal(got.leases, 1);
    assert_int_equal(svc.methods[KVD_RPC_STATS].calls, 1);
    assert_int_equal(kvd_store_release(f->st, l, 2), KVD_OK);
}

static const kvd_client_ns_usage_t *ns_of(const kvd_client_ns_usage_t *u,
                                          size_t n, const kvd_namespace_t *ns)
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&u[i].ns, ns, sizeof *ns) == 0) {
            return &u[i];
        }
    }
    return NULL;
}

static void test_list_and_drop_namespace(void **state)
{
    fixture_t *f = *state;
    kvd_namespace_t na, nb, none;
    kvd_block_hash_t ha[2], hb[3];
    kvd_test_cl_keys(&na, 0xA, ha, 2, 2);
    kvd_test_cl_keys(&nb, 0xB, hb, 3, 3);
    kvd_test_cl_keys(&none, 0xC, hb, 0, 0);
    kvd_test_cl_save(f->st, &na, ha, 2);
    kvd_test_cl_save(f->st, &nb, hb, 3);
    kvd_client_ns_usage_t *u = NULL;
    kvd_client_tenant_usage_t *tu = NULL;
    size_t nu = 0, ntu = 0;
    bool truncated = true;
    assert_int_equal(kvd_client_list(f->c, &u, &nu, &tu, &ntu, &truncated),
                     KVD_OK);
    assert_int_equal(nu, 2);
    assert_false(truncated);
    const kvd_client_ns_usage_t *ua = ns_of(u, nu, &na),
                                *ub = ns_of(u, nu, &nb);
    assert_non_null(ua);
    assert_non_null(ub);
    assert_int_equal(ua->host_objects, 2);
    assert_int_equal(ub->host_objects, 3);
    assert_int_equal(ub->disk_objects, 0);
    assert_int_equal(ua->bytes, 2 * KVD_TEST_CL_OBJ);
    assert_int_equal(ub->bytes, 3 * KVD_TEST_CL_OBJ);
    assert_int_equal(ntu, 1); /* everything under tenant 0 */
    assert_int_equal(tu[0].tenant, 0);
    assert_int_equal(tu[0].objects, 5);
    free(u);
    free(tu);

    /* Drop B while one of its objects is leased: that one stays. */
    kvd_store_lease_t held;
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(f->st, &nb, hb, 1, &held, &m), KVD_OK);
    uint64_t dropped = 99;
    assert_int_equal(kvd_client_drop_namespace(f->c, &nb, &dropped), KVD_OK);
    assert_int_equal(dropped, 2);
    assert_int_equal(found(f->st, &nb, hb, 3), 1);
    assert_int_equal(found(f->st, &na, ha, 2), 2);
    assert_int_equal(kvd_client_drop_namespace(f->c, &none, &dropped), KVD_OK);
    assert_int_equal(dropped, 0);
    assert_int_equal(kvd_store_release(f->st, &held, 1), KVD_OK);
    assert_int_equal(kvd_client_list(f->c, &u, &nu, &tu, &ntu, &truncated),
                     KVD_OK);
    ub = ns_of(u, nu, &nb);
    assert_non_null(ub);
    assert_int_equal(ub->host_objects, 1);
    free(u);
    free(tu);
}

static void test_drop_tenant(void **state)
{
    fixture_t *f = *state;
    kvd_namespace_t ns;
    kvd_block_hash_t h[3];
    kvd_test_cl_keys(&ns, 4, h, 3, 4);
    kvd_test_cl_save(f->st, &ns, h, 1); /* tenant 0 */
    /* Tenant 7 goes to the daemon by name ("7"). */
    kvd_store_reservation_t r[2];
    assert_int_equal(
        kvd_store_reserve(f->st, &ns, &h[1], 2, KVD_TEST_CL_OBJ, 7, r), KVD_OK);
    kvd_store_key_t k[2] = {{ns, h[1]}, {ns, h[2]}};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(r[i].status, KVD_OK);
        kvd_test_cl_fill(
            kvd_store_reservation_ptr(f->st, &r[i], KVD_TEST_CL_OBJ),
            &h[1 + i]);
    }
    assert_int_equal(kvd_store_commit(f->st, k, 2, NULL), KVD_OK);
    kvd_client_ns_usage_t *u = NULL;
    kvd_client_tenant_usage_t *tu = NULL;
    size_t nu = 0, ntu = 0;
    bool truncated = true;
    assert_int_equal(kvd_client_list(f->c, &u, &nu, &tu, &ntu, &truncated),
                     KVD_OK);
    assert_int_equal(ntu, 2);
    uint32_t seven = kvd_service_tenant_id("7");
    size_t i7 = tu[0].tenant == seven ? 0 : 1;
    assert_int_equal(tu[i7].tenant, seven);
    assert_int_equal(tu[i7].objects, 2);
    assert_int_equal(tu[i7].bytes, 2 * KVD_TEST_CL_OBJ);
    free(u);
    free(tu);

    uint64_t admins = kvd_test_cl_calls(&f->t, KVD_RPC_ADMIN);
    uint64_t dropped = 99;
    char longname[KVD_PROTO_MAX_ID_BYTES + 2];
    memset(longname, 't', sizeof longname - 1);
    longname[sizeof longname - 1] = '\0';
    assert_int_equal(kvd_client_drop_tenant(f->c, NULL, &dropped),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_client_drop_tenant(f->c, longname, &dropped),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_test_cl_calls(&f->t, KVD_RPC_ADMIN), admins);
    assert_int_equal(kvd_client_drop_tenant(f->c, "7", &dropped), KVD_OK);
    assert_int_equal(dropped, 2);
    assert_int_equal(found(f->st, &ns, h, 3), 1); /* tenant 0's stays */
}

static void test_drain(void **state)
{
    fixture_t *f = *state;
    kvd_namespace_t ns;
    kvd_block_hash_t h[3];
    kvd_test_cl_keys(&ns, 5, h, 3, 5);
    kvd_test_cl_save(f->st, &ns, h, 1);
    kvd_store_lease_t held[2]; /* two lease ids, one reservation id */
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(f->st, &ns, h, 1, &held[0], &m), KVD_OK);
    assert_int_equal(kvd_store_lookup(f->st, &ns, h, 1, &held[1], &m), KVD_OK);
    kvd_store_reservation_t r;
    assert_int_equal(
        kvd_store_reserve(f->st, &ns, &h[1], 1, KVD_TEST_CL_OBJ, 0, &r),
        KVD_OK);
    assert_int_equal(r.status, KVD_OK);
    uint64_t leases = 99, resv = 99;
    assert_int_equal(kvd_client_drain(f->c, true, &leases, &resv), KVD_OK);
    assert_int_equal(leases, 2);
    assert_int_equal(resv, 1);
    assert_true(kvd_service_draining(f->t.srv->svc));
    /* New saves are refused (skipped, BUSY); loads go on. */
    kvd_store_reservation_t r2;
    assert_int_equal(
        kvd_store_reserve(f->st, &ns, &h[2], 1, KVD_TEST_CL_OBJ, 0, &r2),
        KVD_OK);
    assert_int_equal(r2.status, KVD_ERR_BUSY);
    assert_int_equal(found(f->st, &ns, h, 1), 1);
    kvd_store_key_t k = {ns, h[1]};
    assert_int_equal(kvd_store_abort(f->st, &k, 1, NULL), KVD_OK);
    assert_int_equal(kvd_store_release(f->st, held, 2), KVD_OK);
    assert_int_equal(kvd_client_drain(f->c, false, &leases, &resv), KVD_OK);
    assert_int_equal(leases, 0);
    assert_int_equal(resv, 0);
    assert_false(kvd_service_draining(f->t.srv->svc));
    kvd_test_cl_save(f->st, &ns, &h[2], 1);
}

static void test_ping_config_dump_flush(void **state)
{
    fixture_t *f = *state;
    char version[64], node[64];
    assert_int_equal(
        kvd_client_ping(f->c, version, sizeof version, node, sizeof node),
        KVD_OK);
    assert_string_equal(version, kvd_version());
    assert_string_equal(node, "client-test-node");
    char tiny[4];
    assert_int_equal(
        kvd_client_ping(f->c, version, sizeof version, tiny, sizeof tiny),
        KVD_OK);
    assert_string_equal(tiny, "cli"); /* cut to the buffer */

    assert_int_equal(kvd_client_config_dump(f->c, NULL), KVD_ERR_INVALID);
    char *text = NULL;
    assert_int_equal(kvd_client_config_dump(f->c, &text), KVD_OK);
    assert_non_null(text);
    assert_non_null(
        strstr(text, "\nserver.node_id = client-test-node  # from: "));
    assert_non_null(strstr(text, "\nstore.arena_chunk = 2m  # from: "));
    size_t lines = 0;
    for (char *p = text; *p != '\0'; lines++) {
        char *nl = strchr(p, '\n');
        assert_non_null(nl); /* every line ends */
        *nl = '\0';
        assert_non_null(strstr(p, " = "));
        assert_non_null(strstr(p, "  # from: "));
        p = nl + 1;
    }
    assert_true(lines > 10);
    free(text);

    uint64_t admins = kvd_test_cl_calls(&f->t, KVD_RPC_ADMIN);
    assert_int_equal(kvd_store_flush(f->st, 1000), KVD_OK);
    assert_int_equal(kvd_test_cl_calls(&f->t, KVD_RPC_ADMIN), admins + 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_stats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_and_drop_namespace, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_drop_tenant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_drain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ping_config_dump_flush, setup,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
