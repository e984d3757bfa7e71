/*
 * The etcd client (cluster/etcd.c) and the membership over TLS, against a
 * real etcd started here with --cert-file/--key-file (and
 * --trusted-ca-file --client-cert-auth for client certificates). The
 * certificates are made at test time with the openssl command: a CA, a
 * server certificate for 127.0.0.1 (subjectAltName IP:127.0.0.1), a client
 * certificate, and a second CA that signed neither. Skipped (77) when
 * KVDEPOT_ETCD names no etcd binary or openssl is missing.
 *
 * What it proves: with the CA a client reaches a TLS etcd and two nodes
 * join and see each other; a client trusting the other CA is refused with
 * KVD_ERR_AUTH (the handshake failed) within the deadline; a plaintext
 * client gets nothing from a TLS etcd; with --client-cert-auth a client
 * with its certificate is served and one without is not; TLS settings that
 * do not go together are KVD_ERR_INVALID.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <signal.h>
#include <unistd.h>

#include "cluster/etcd_int.h"
#include "cluster/membership.h"
#include "tests/unit/kvd_testdir_int.h"
#include "tests/integration/kvd_testetcd_int.h"

#define TIMEOUT_MS 2000

/* Makes the CA, server, client and other-CA files in `dir`; false when the
 * openssl command failed. */
static bool make_certs(const char *dir)
{
    char cmd[2048];
    snprintf(
        cmd, sizeof cmd,
        "cd '%s' && K='-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
        "-nodes' && "
        "openssl req -x509 $K -keyout ca.key -out ca.pem -days 2 "
        "-subj /CN=kvd-test-ca && "
        "openssl req -x509 $K -keyout other.key -out other.pem -days 2 "
        "-subj /CN=kvd-other-ca && "
        "printf 'subjectAltName=IP:127.0.0.1\\n"
        "extendedKeyUsage=serverAuth\\n' > server.ext && "
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext && "
        "openssl req $K -keyout server.key -out server.csr "
        "-subj /CN=127.0.0.1 && "
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key "
        "-CAcreateserial -out server.pem -days 2 -extfile server.ext && "
        "openssl req $K -keyout client.key -out client.csr -subj /CN=node && "
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key "
        "-CAcreateserial -out client.pem -days 2 -extfile client.ext",
        dir);
    char quiet[2100];
    snprintf(quiet, sizeof quiet, "(%s) >'%s/openssl.log' 2>&1", cmd, dir);
    return system(quiet) == 0;
}

/* A file's text (NUL-terminated, freed by the caller). */
static char *slurp(const char *dir, const char *name)
{
    char path[300];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    char *buf = calloc(1, 65536);
    assert_non_null(buf);
    size_t n = fread(buf, 1, 65535, f);
    fclose(f);
    assert_true(n > 0);
    return buf;
}

typedef struct tls_fixture {
    etcd_proc_t etcd;
    char *ca, *other, *cert, *key;
} tls_fixture_t;

/* Starts a TLS etcd (client_auth: --client-cert-auth) and waits until a
 * client with the CA (and the client certificate) is granted a lease. */
static int tls_setup(void **state, bool client_auth)
{
    tls_fixture_t *f = calloc(1, sizeof *f);
    assert_non_null(f);
    kvd_test_dir_make(&f->etcd.dir, "etcdtls");
    if (!make_certs(f->etcd.dir.path)) {
        fail_msg("openssl could not make the certificates (see %s)",
                 f->etcd.dir.path);
    }
    f->ca = slurp(f->etcd.dir.path, "ca.pem");
    f->other = slurp(f->etcd.dir.path, "other.pem");
    f->cert = slurp(f->etcd.dir.path, "client.pem");
    f->key = slurp(f->etcd.dir.path, "client.key");
    snprintf(f->etcd.tls_dir, sizeof f->etcd.tls_dir, "%s", f->etcd.dir.path);
    f->etcd.client_auth = client_auth;
    f->etcd.client_port = free_port();
    f->etcd.peer_port = free_port();
    snprintf(f->etcd.endpoint, sizeof f->etcd.endpoint, "127.0.0.1:%d",
             f->etcd.client_port);
    etcd_start(&f->etcd);
    *state = f;

    kvd_etcd_tls_t tls = {
        .ca_pem = f->ca, .cert_pem = f->cert, .key_pem = f->key};
    kvd_etcd_t *e = NULL;
    assert_int_equal(kvd_etcd_open_tls(f->etcd.endpoint, &tls, 500, &e),
                     KVD_OK);
    int64_t id = 0;
    bool up = false;
    for (double end = now_s() + 20; !up && now_s() < end; usleep(50000)) {
        up = kvd_etcd_lease_grant(e, 5, &id, NULL) == KVD_OK;
    }
    kvd_etcd_close(e);
    if (!up) {
        fail_msg("TLS etcd did not come up (log in %s)", f->etcd.dir.path);
    }
    return 0;
}

static int setup_server_auth(void **state)
{
    return tls_setup(state, false);
}
static int setup_client_auth(void **state)
{
    return tls_setup(state, true);
}

static int teardown(void **state)
{
    tls_fixture_t *f = *state;
    etcd_kill(&f->etcd, SIGKILL);
    kvd_test_dir_remove(&f->etcd.dir);
    free(f->ca);
    free(f->other);
    free(f->cert);
    free(f->key);
    free(f);
    return 0;
}

/* One lease grant with `tls` (NULL: plaintext): its status. */
static kvd_status_t grant_with(const tls_fixture_t *f,
                               const kvd_etcd_tls_t *tls)
{
    kvd_etcd_t *e = NULL;
    assert_int_equal(kvd_etcd_open_tls(f->etcd.endpoint, tls, 1000, &e),
                     KVD_OK);
    int64_t id = 0;
    double t0 = now_s();
    kvd_status_t s = kvd_etcd_lease_grant(e, 5, &id, NULL);
    assert_true(now_s() - t0 < 3.0); /* within the deadline, and a bit */
    kvd_etcd_close(e);
    return s;
}

static kvd_membership_t *member_start(const tls_fixture_t *f, const char *id)
{
    kvd_member_t self;
    memset(&self, 0, sizeof self);
    snprintf(self.node_id, sizeof self.node_id, "%s", id);
    snprintf(self.grpc_address, sizeof self.grpc_address, "127.0.0.1:1");
    self.ucx_address_len = 4;
    snprintf(self.version, sizeof self.version, "test");
    kvd_membership_config_t cfg = {.etcd_endpoint = f->etcd.endpoint,
                                   .etcd_tls_ca = f->ca,
                                   .cluster = "tls",
                                   .self = &self,
                                   .lease_ttl_s = 5,
                                   .timeout_ms = 1000};
    kvd_membership_t *m = NULL;
    assert_int_equal(kvd_membership_start(&cfg, &m), KVD_OK);
    return m;
}

/* Waits up to 10 s for both nodes in a fresh view of `m`. */
static bool sees_both(kvd_membership_t *m)
{
    kvd_member_t nodes[4];
    for (double end = now_s() + 10; now_s() < end; usleep(20000)) {
        kvd_membership_stats_t st;
        size_t n = kvd_membership_view(m, nodes, 4, &st);
        if (n == 2 && !st.stale && strcmp(nodes[0].node_id, "a") == 0 &&
            strcmp(nodes[1].node_id, "b") == 0) {
            return true;
        }
    }
    return false;
}

static void test_server_auth(void **state)
{
    tls_fixture_t *f = *state;
    kvd_etcd_tls_t good = {.ca_pem = f->ca};
    kvd_etcd_tls_t wrong = {.ca_pem = f->other};
    assert_int_equal(grant_with(f, &good), KVD_OK);
    assert_int_equal(grant_with(f, &wrong), KVD_ERR_AUTH);
    assert_int_not_equal(grant_with(f, NULL), KVD_OK);

    /* Keys round trip over TLS. */
    kvd_etcd_t *e = NULL;
    assert_int_equal(kvd_etcd_open_tls(f->etcd.endpoint, &good, TIMEOUT_MS, &e),
                     KVD_OK);
    assert_int_equal(kvd_etcd_put(e, "/t/k", "v", 1, 0), KVD_OK);
    kvd_etcd_close(e);

    /* Two nodes join over TLS and see each other. */
    kvd_membership_t *a = member_start(f, "a");
    kvd_membership_t *b = member_start(f, "b");
    assert_true(sees_both(a));
    assert_true(sees_both(b));
    kvd_membership_stop(b);
    kvd_membership_stop(a);
}

static void test_client_auth(void **state)
{
    tls_fixture_t *f = *state;
    kvd_etcd_tls_t with_cert = {
        .ca_pem = f->ca, .cert_pem = f->cert, .key_pem = f->key};
    kvd_etcd_tls_t ca_only = {.ca_pem = f->ca};
    assert_int_equal(grant_with(f, &with_cert), KVD_OK);
    assert_int_not_equal(grant_with(f, &ca_only), KVD_OK);
    assert_int_not_equal(grant_with(f, NULL), KVD_OK);
}

static void test_bad_settings(void **state)
{
    tls_fixture_t *f = *state;
    kvd_etcd_t *e = NULL;
    kvd_etcd_tls_t no_key = {.ca_pem = f->ca, .cert_pem = f->cert};
    kvd_etcd_tls_t no_cert = {.ca_pem = f->ca, .key_pem = f->key};
    kvd_etcd_tls_t no_ca = {.cert_pem = f->cert, .key_pem = f->key};
    assert_int_equal(kvd_etcd_open_tls("127.0.0.1:1", &no_key, 100, &e),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_etcd_open_tls("127.0.0.1:1", &no_cert, 100, &e),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_etcd_open_tls("127.0.0.1:1", &no_ca, 100, &e),
                     KVD_ERR_INVALID);
    assert_null(e);
}

int main(void)
{
    if (etcd_bin() == NULL || system("openssl version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "test_etcd_tls: no etcd binary (KVDEPOT_ETCD) or no "
                        "openssl; skipped\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_server_auth, setup_server_auth,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_client_auth, setup_client_auth,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_bad_settings, setup_server_auth,
                                        teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
