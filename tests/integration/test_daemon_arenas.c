/*
 * kvdepotd end to end, its arenas: /metrics says what backs the arena
 * (plain pages, THP or hugetlb); with server.tenant_arenas a tenant's
 * process is handed its own arena's memfd only, cannot reach another
 * tenant's bytes nor another tenant its bytes, and its saves evict only
 * its own objects (as root: the other tenant is a child as uid 65534);
 * after a restart a tenant arena's objects come back from NVMe into the
 * same tenant's arena. By default (server.tenant_arena_size=auto) every
 * tenant of server.tenants has an arena of its own: a co-tenant that
 * overwrites all it maps changes none of another tenant's objects.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvdepot/store.h"
#include "common/time_int.h"
#include "tests/unit/kvd_testdir_int.h"
#include "tests/integration/kvd_testdaemon_int.h"
#include "tests/integration/kvd_testdaemonclient_int.h"

/* Reserves, fills with `byte` and commits keys h[0..n) as tenant 0 (the
 * daemon binds the caller's own); returns how many committed. */
static size_t save_filled(kvd_store_t *st, const kvd_namespace_t *ns,
                          const kvd_block_hash_t *h, size_t n, uint8_t byte)
{
    kvd_store_reservation_t r[NKEYS];
    kvd_store_key_t keys[NKEYS];
    assert_true(n <= NKEYS);
    if (kvd_store_reserve(st, ns, h, n, OBJ_BYTES, 0, r) != KVD_OK) {
        return 0;
    }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t *p = r[i].status == KVD_OK
                         ? kvd_store_reservation_ptr(st, &r[i], OBJ_BYTES)
                         : NULL;
        if (p == NULL) {
            continue;
        }
        memset(p, byte, OBJ_BYTES);
        keys[k].ns = *ns;
        keys[k++].hash = h[i];
    }
    kvd_status_t cs[NKEYS];
    if (k > 0 && kvd_store_commit(st, keys, k, cs) != KVD_OK) {
        return 0;
    }
    return k;
}

/* Whether the caller's whole mapping holds a page-aligned 4 KiB run of
 * `byte` (objects are page-aligned slots filled with one byte). */
static bool mapping_has_run(kvd_store_t *st, uint8_t byte)
{
    kvd_store_arena_export_t exp;
    assert_int_equal(kvd_store_arena_export(st, &exp), KVD_OK);
    close(exp.fd);
    for (uint64_t off = 0; off < exp.size_bytes; off += 4096) {
        const uint8_t *p = kvd_store_arena_ptr(st, exp.offset + off, 4096);
        assert_non_null(p);
        size_t i = 0;
        while (i < 4096 && p[i] == byte) {
            i++;
        }
        if (i == 4096) {
            return true;
        }
    }
    return false;
}

/* In a child as uid 65534 (tenant team-b, the main arena): saves its
 * keys (`save`) or checks they are all there; either way its mapping must
 * hold none of team-a's bytes. Exit code 0 when all holds. */
static int team_b_child(const kvd_test_dir_t *d, const kvd_namespace_t *ns,
                        const kvd_block_hash_t *h, bool save)
{
    kvd_store_t *cs = NULL;
    if (setgid(65534) != 0 || setuid(65534) != 0 ||
        client_open(d, "30s", "2s", &cs) != KVD_OK) {
        return 1;
    }
    int rc = 0;
    kvd_store_arena_export_t exp;
    if (kvd_store_arena_export(cs, &exp) != KVD_OK || exp.offset != 0 ||
        exp.size_bytes != 16u << 20) {
        rc = 2;
    } else {
        close(exp.fd);
    }
    if (rc == 0 && save && save_filled(cs, ns, h, 4, 0xB7) != 4) {
        rc = 3;
    }
    kvd_store_lease_t l[4];
    size_t m = 0;
    if (rc == 0 && !save &&
        (kvd_store_lookup(cs, ns, h, 4, l, &m) != KVD_OK || m != 4)) {
        rc = 4;
    }
    for (size_t i = 0; rc == 0 && !save && i < m; i++) {
        const uint8_t *p = kvd_store_lease_ptr(cs, &l[i]);
        if (p == NULL || p[0] != 0xB7 || p[OBJ_BYTES - 1] != 0xB7) {
            rc = 5;
        }
    }
    if (rc == 0 && mapping_has_run(cs, 0xA7)) {
        rc = 6; /* team-a's bytes readable from team-b's process */
    }
    kvd_store_close(cs);
    return rc;
}

typedef struct team_b_args {
    const kvd_test_dir_t *d;
    const kvd_namespace_t *ns;
    const kvd_block_hash_t *h;
    bool save;
} team_b_args_t;

static int team_b_main(void *arg)
{
    const team_b_args_t *a = arg;
    return team_b_child(a->d, a->ns, a->h, a->save);
}

static void team_b_run(const kvd_test_dir_t *d, const kvd_namespace_t *ns,
                       const kvd_block_hash_t *h, bool save)
{
    team_b_args_t a = {.d = d, .ns = ns, .h = h, .save = save};
    assert_int_equal(run_in_child(team_b_main, &a), 0);
}

/* In a child as uid 65534 (tenant team-b): looks for team-a's bytes in
 * every page it maps, then overwrites every page it maps with 0xEE, as a
 * hostile co-tenant would. Exit code 0 when the mapping held none of
 * team-a's bytes. */
static int overwrite_child(void *arg)
{
    const kvd_test_dir_t *d = arg;
    kvd_store_t *cs = NULL;
    if (setgid(65534) != 0 || setuid(65534) != 0 ||
        client_open(d, "30s", "2s", &cs) != KVD_OK) {
        return 1;
    }
    kvd_store_arena_export_t exp;
    if (kvd_store_arena_export(cs, &exp) != KVD_OK) {
        kvd_store_close(cs);
        return 2;
    }
    close(exp.fd);
    int rc = mapping_has_run(cs, 0xA7) ? 3 : 0;
    for (uint64_t off = 0; off < exp.size_bytes; off += 4096) {
        uint8_t *p = kvd_store_arena_ptr(cs, exp.offset + off, 4096);
        if (p == NULL) {
            rc = 4;
            break;
        }
        memset(p, 0xEE, 4096);
    }
    kvd_store_close(cs);
    return rc;
}

/* team-a (this process) saves 8 objects of 0xA7, a team-b child scans and
 * overwrites its whole mapping, team-a reads its objects back: returns how
 * many came back with any byte that is not 0xA7. `child_rc` gets the
 * child's exit code. */
static size_t overwrite_attack(const kvd_test_dir_t *d, int *child_rc)
{
    kvd_namespace_t ns;
    kvd_block_hash_t h[NKEYS];
    keys_make(&ns, h, NKEYS, 0x5A);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(d, "30s", "2s", &st), KVD_OK);
    uint64_t t0 = kvd_time_now_ns();
    assert_int_equal(save_filled(st, &ns, h, NKEYS, 0xA7), NKEYS);
    uint64_t t_save = kvd_time_now_ns() - t0;
    kvd_store_close(st); /* no gRPC client across the fork */

    *child_rc = run_in_child(overwrite_child, (void *)d);

    assert_int_equal(client_open(d, "30s", "2s", &st), KVD_OK);
    kvd_store_lease_t l[NKEYS];
    size_t m = 0, wrong = 0;
    t0 = kvd_time_now_ns();
    assert_int_equal(kvd_store_lookup(st, &ns, h, NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, NKEYS);
    for (size_t i = 0; i < m; i++) {
        const uint8_t *p = kvd_store_lease_ptr(st, &l[i]);
        assert_non_null(p);
        size_t k = 0;
        while (k < OBJ_BYTES && p[k] == 0xA7) {
            k++;
        }
        wrong += k != OBJ_BYTES;
    }
    uint64_t t_read = kvd_time_now_ns() - t0;
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    kvd_store_close(st);
    fprintf(stderr,
            "  team-a: %d objects of %u KiB saved in %.2f ms, looked up and "
            "checked in %.2f ms; %zu with team-b's bytes\n",
            NKEYS, OBJ_BYTES >> 10, (double)t_save / 1e6, (double)t_read / 1e6,
            wrong);
    return wrong;
}

/* server.tenant_arena_size (default auto): every tenant of server.tenants
 * gets an arena of its own, an equal share of store.arena_size, so a
 * hostile co-tenant's process that overwrites every page it maps changes
 * none of another tenant's objects. With tenant_arena_size=shared both map
 * the main arena and the same attack changes every object: the exposure
 * the default closes. Needs root (team-b is a child as uid 65534). */
static void test_tenants_get_own_arenas(void **state)
{
    (void)state;
    if (geteuid() != 0) {
        fprintf(stderr, "not root: a second tenant's uid is not available\n");
        return;
    }
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_own_arenas");
    assert_int_equal(chmod(d.path, 0755), 0);
    char tenants[96];
    snprintf(tenants, sizeof tenants, "server.tenants=%u=team-a,65534=team-b",
             (unsigned)getuid());
    /* 16 MiB of 2 MiB chunks: 2 + 2 for the tenants, 4 for the main. */
    pid_t dpid =
        daemon_start(&d, tenants, "server.unix_mode=0666",
                     "server.metrics_address=127.0.0.1:0", (const char *)NULL);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_bytes{arena=\"main\"}"),
        8u << 20);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_bytes{arena=\"team-a\"}"),
        4u << 20);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_bytes{arena=\"team-b\"}"),
        4u << 20);
    int rc = -1;
    fprintf(stderr, "server.tenant_arena_size=auto (the default):\n");
    assert_int_equal(overwrite_attack(&d, &rc), 0);
    assert_int_equal(rc, 0);
    daemon_stop(dpid);

    dpid = daemon_start(&d, tenants, "server.unix_mode=0666",
                        "server.tenant_arena_size=shared", (const char *)NULL);
    fprintf(stderr, "server.tenant_arena_size=shared:\n");
    assert_int_equal(overwrite_attack(&d, &rc), NKEYS);
    assert_int_equal(rc, 3); /* team-b saw team-a's bytes, too */
    daemon_stop(dpid);

    /* A size: each tenant's arena is that size, besides the main one. */
    dpid =
        daemon_start(&d, tenants, "server.tenant_arena_size=2m",
                     "server.metrics_address=127.0.0.1:0", (const char *)NULL);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_bytes{arena=\"main\"}"),
        16u << 20);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_bytes{arena=\"team-b\"}"),
        2u << 20);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* /metrics says what backs the arena: 4 KiB pages and nothing else with
 * store.arena_hugepages=off; exactly one backing with the default (auto),
 * whatever this host offers. */
static void test_arena_pages_metric(void **state)
{
    (void)state;
    static const char *const names[] = {
        "kvdepot_arena_pages{backing=\"plain\"}",
        "kvdepot_arena_pages{backing=\"thp\"}",
        "kvdepot_arena_pages{backing=\"hugetlb\"}"};
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_arena_pages");
    pid_t dpid =
        daemon_start(&d, "store.arena_hugepages=off",
                     "server.metrics_address=127.0.0.1:0", (const char *)NULL);
    assert_true(kvd_test_daemon_metric(&d, names[0]) == 1);
    assert_true(kvd_test_daemon_metric(&d, names[1]) == 0);
    assert_true(kvd_test_daemon_metric(&d, names[2]) == 0);
    daemon_stop(dpid);
    dpid = daemon_start(&d, "server.metrics_address=127.0.0.1:0",
                        (const char *)NULL);
    double sum = 0;
    for (size_t i = 0; i < 3; i++) {
        double v = kvd_test_daemon_metric(&d, names[i]);
        assert_true(v == 0 || v == 1);
        sum += v;
    }
    assert_true(sum == 1);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* server.tenant_arenas: a tenant with an arena of its own receives that
 * arena's memfd only at the hand-off. Its process cannot reach another
 * tenant's bytes, nor another tenant its bytes, and its saves evict only
 * its own objects. The other tenant (a child as uid 65534) needs root. */
static void test_tenant_arenas(void **state)
{
    (void)state;
    bool root = geteuid() == 0;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_tenant_arenas");
    assert_int_equal(chmod(d.path, 0755), 0);
    char tenants[96];
    snprintf(tenants, sizeof tenants, "server.tenants=%u=team-a%s",
             (unsigned)getuid(), root ? ",65534=team-b" : "");
    /* 4 MiB: 2 chunks of 2 MiB, 64 objects of 64 KiB. */
    pid_t dpid =
        daemon_start(&d, tenants, "server.tenant_arenas=team-a=4m",
                     "server.unix_mode=0666", "server.tenant_arena_size=shared",
                     "server.metrics_address=127.0.0.1:0", (const char *)NULL);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_bytes{arena=\"main\"}"),
        16u << 20);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_bytes{arena=\"team-a\"}"),
        4u << 20);
    assert_int_equal(kvd_test_daemon_metric(
                         &d, "kvdepot_arena_free_bytes{arena=\"team-a\"}"),
                     4u << 20);
    /* The children fork while this process has no client open (a gRPC
     * client does not survive a fork). */
    kvd_namespace_t nsb;
    kvd_block_hash_t hb[4];
    keys_make(&nsb, hb, 4, 0xB0);
    if (root) {
        team_b_run(&d, &nsb, hb, true);
    }
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    kvd_store_arena_export_t exp;
    assert_int_equal(kvd_store_arena_export(st, &exp), KVD_OK);
    assert_int_equal(exp.offset, 16u << 20); /* after store.arena_size */
    assert_int_equal(exp.size_bytes, 4u << 20);
    struct stat sb;
    assert_int_equal(fstat(exp.fd, &sb), 0);
    assert_int_equal((uint64_t)sb.st_size, 4u << 20);
    close(exp.fd);
    assert_null(kvd_store_arena_ptr(st, 0, 1));
    assert_null(kvd_store_arena_ptr(st, (16u << 20) - 1, 2));
    assert_null(kvd_store_arena_ptr(st, 20u << 20, 1));

    /* team-a saves 10 batches of 8 into its 64 slots: the first ones are
     * evicted, the last ones are there, with its bytes. */
    kvd_namespace_t nsa;
    kvd_block_hash_t ha[10][NKEYS];
    for (uint8_t b = 0; b < 10; b++) {
        keys_make(&nsa, ha[b], NKEYS, (uint8_t)(0xA0 + b));
        assert_int_equal(save_filled(st, &nsa, ha[b], NKEYS, 0xA7), NKEYS);
    }
    kvd_store_lease_t l[NKEYS];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &nsa, ha[9], NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, NKEYS);
    for (size_t i = 0; i < m; i++) {
        assert_true(l[i].arena_offset >= 16u << 20);
        const uint8_t *p = kvd_store_lease_ptr(st, &l[i]);
        assert_non_null(p);
        assert_int_equal(p[0], 0xA7);
        assert_int_equal(p[OBJ_BYTES - 1], 0xA7);
    }
    assert_int_equal(kvd_store_release(st, l, m), KVD_OK);
    assert_int_equal(kvd_store_lookup(st, &nsa, ha[0], NKEYS, l, &m), KVD_OK);
    assert_int_equal(m, 0);
    assert_false(mapping_has_run(st, 0xB7));
    /* team-a's arena is full; the main one holds team-b's one chunk. */
    assert_int_equal(kvd_test_daemon_metric(
                         &d, "kvdepot_arena_free_bytes{arena=\"team-a\"}"),
                     0);
    assert_int_equal(
        kvd_test_daemon_metric(&d, "kvdepot_arena_free_bytes{arena=\"main\"}"),
        root ? 14u << 20 : 16u << 20);
    kvd_store_close(st);

    if (root) {
        /* team-b's objects outlived team-a's pressure, and team-b's
         * process still sees none of team-a's bytes. */
        team_b_run(&d, &nsb, hb, false);
    }
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

/* A tenant arena's objects come back from NVMe after a restart into the
 * same tenant's arena (the index keeps each object's tenant). */
static void test_tenant_arena_after_restart(void **state)
{
    (void)state;
    kvd_test_dir_t d;
    kvd_test_dir_make(&d, "daemon_tenant_restart");
    char disk[300], nvme[300], tenants[64];
    snprintf(disk, sizeof disk, "store.disk_path=%s/nvme", d.path);
    snprintf(nvme, sizeof nvme, "%s/nvme", d.path);
    assert_int_equal(mkdir(nvme, 0700), 0);
    snprintf(tenants, sizeof tenants, "server.tenants=%u=team-a",
             (unsigned)getuid());
    pid_t dpid =
        daemon_start(&d, tenants, "server.tenant_arenas=team-a=4m", disk,
                     "store.disk_size=32m", "store.disk_write=through",
                     "store.sync_interval=0", (const char *)NULL);
    kvd_namespace_t ns;
    kvd_block_hash_t h[4];
    keys_make(&ns, h, 4, 21);
    kvd_store_t *st = NULL;
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    assert_int_equal(save_objects(st, &ns, h, 4), 4);
    assert_int_equal(kvd_store_flush(st, 10000), KVD_OK);
    kvd_store_close(st);
    daemon_stop(dpid);

    dpid = daemon_start(&d, tenants, "server.tenant_arenas=team-a=4m", disk,
                        "store.disk_size=32m", "store.disk_write=through",
                        "store.sync_interval=0", (const char *)NULL);
    assert_int_equal(client_open(&d, "30s", "2s", &st), KVD_OK);
    kvd_store_lease_t l[4], got[4];
    size_t m = 0;
    assert_int_equal(kvd_store_lookup(st, &ns, h, 4, l, &m), KVD_OK);
    assert_int_equal(m, 4);
    get_from_disk(st, l, 4, got);
    for (size_t i = 0; i < 4; i++) {
        assert_true(got[i].arena_offset >= 16u << 20); /* team-a's arena */
        check_bytes(st, &got[i]);
    }
    assert_int_equal(kvd_store_release(st, got, 4), KVD_OK);
    kvd_store_close(st);
    daemon_stop(dpid);
    kvd_test_dir_remove(&d);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_arena_pages_metric),
        cmocka_unit_test(test_tenant_arenas),
        cmocka_unit_test(test_tenants_get_own_arenas),
        cmocka_unit_test(test_tenant_arena_after_restart),
    };
    return cmocka_run_group_tests(tests, skip_without_daemon, NULL);
}
