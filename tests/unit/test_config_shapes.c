/*
 * Lists and pairs in the configuration (kvd_config_parse_list and
 * kvd_config_parse_pairs): a YAML mapping of scalars and the "k=v,..."
 * text give the same canonical value, as do a YAML sequence and the
 * "a,b" text; --print-config shows that one form; a mapping or a list
 * given to a field of another shape, a mapping that holds more than
 * scalars and a list that holds more than scalars are errors naming the
 * key and the line; the kvdepotd keys that take them (server.tenants,
 * server.tls_tenants, server.tenant_quotas, server.tenant_arenas,
 * cluster.etcd) are declared so.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvd_testconfig_int.h"
#include "server/srv_int.h"

typedef struct shaped {
    char tenants[KVD_CONFIG_STRING_MAX];
    char etcd[KVD_CONFIG_STRING_MAX];
    int64_t count;
} shaped_t;

static const kvd_config_field_t shaped_table[] = {
    {"shp.tenants", "", "uid -> tenant", kvd_config_parse_pairs,
     offsetof(shaped_t, tenants), 0, 0, NULL},
    {"shp.etcd", "", "endpoints", kvd_config_parse_list,
     offsetof(shaped_t, etcd), 0, 0, NULL},
    {"shp.count", "1", "a count", kvd_config_parse_int,
     offsetof(shaped_t, count), 0, 100, NULL},
};
#define SHAPED_FIELDS (sizeof(shaped_table) / sizeof(shaped_table[0]))

static kvd_status_t shaped_apply(const char *yaml, shaped_t *out, char *err,
                                 size_t err_len)
{
    kvd_config_t *config = config_new();
    kvd_status_t st =
        kvd_config_load_yaml(config, yaml, strlen(yaml), err, err_len);
    if (st == KVD_OK) {
        memset(out, 0x5a, sizeof(*out));
        st = kvd_config_apply(config, shaped_table, SHAPED_FIELDS, out, err,
                              err_len);
    }
    kvd_config_destroy(config);
    return st;
}

/* Expects `yaml` to load and then fail to apply with an error holding
 * every one of the NULL-terminated needles. */
static void apply_bad(const char *yaml, ...)
{
    kvd_config_t *config = config_new();
    char err[512] = "";
    load(config, yaml);
    shaped_t s;
    assert_int_equal(kvd_config_apply(config, shaped_table, SHAPED_FIELDS, &s,
                                      err, sizeof(err)),
                     KVD_ERR_INVALID);
    va_list ap;
    va_start(ap, yaml);
    for (const char *n = va_arg(ap, const char *); n != NULL;
         n = va_arg(ap, const char *)) {
        if (strstr(err, n) == NULL) {
            fail_msg("error '%s' lacks '%s'", err, n);
        }
    }
    va_end(ap);
    kvd_config_destroy(config);
}

static void test_map_and_string_agree(void **state)
{
    (void)state;
    shaped_t a, b, c;
    char err[256] = "";
    assert_int_equal(shaped_apply("shp:\n"
                                  "  tenants: {1000: alice, 1001: bob}\n"
                                  "  etcd: [127.0.0.1:1, 127.0.0.1:2]\n",
                                  &a, err, sizeof(err)),
                     KVD_OK);
    assert_string_equal(a.tenants, "1000=alice,1001=bob");
    assert_string_equal(a.etcd, "127.0.0.1:1,127.0.0.1:2");
    /* Block style, and the flat text with stray spaces. */
    assert_int_equal(shaped_apply("shp:\n"
                                  "  tenants:\n"
                                  "    1000: alice\n"
                                  "    1001: bob\n"
                                  "  etcd:\n"
                                  "    - 127.0.0.1:1\n"
                                  "    - 127.0.0.1:2\n",
                                  &b, err, sizeof(err)),
                     KVD_OK);
    assert_int_equal(shaped_apply("shp:\n"
                                  "  tenants: ' 1000 = alice , 1001=bob'\n"
                                  "  etcd: 127.0.0.1:1, 127.0.0.1:2\n",
                                  &c, err, sizeof(err)),
                     KVD_OK);
    assert_string_equal(b.tenants, a.tenants);
    assert_string_equal(c.tenants, a.tenants);
    assert_string_equal(b.etcd, a.etcd);
    assert_string_equal(c.etcd, a.etcd);
    /* Empty structures are empty values; a key holding '=' splits at the
     * last one, as the text does. */
    assert_int_equal(
        shaped_apply("shp: {tenants: {}, etcd: []}\n", &a, err, sizeof(err)),
        KVD_OK);
    assert_string_equal(a.tenants, "");
    assert_string_equal(a.etcd, "");
    assert_int_equal(
        shaped_apply("shp: {tenants: {'cn=x': t}}\n", &a, err, sizeof(err)),
        KVD_OK);
    assert_string_equal(a.tenants, "cn=x=t");
}

static void test_call_parameter_keeps_text(void **state)
{
    (void)state;
    kvd_config_t *config = config_new();
    load(config, "shp: {tenants: {1000: alice}}\n");
    assert_int_equal(kvd_config_set(config, "shp.tenants", "7=x, 8=y"), KVD_OK);
    shaped_t s;
    char err[256] = "";
    assert_int_equal(kvd_config_apply(config, shaped_table, SHAPED_FIELDS, &s,
                                      err, sizeof(err)),
                     KVD_OK);
    assert_string_equal(s.tenants, "7=x,8=y");
    /* A bad text names the item. */
    assert_int_equal(kvd_config_set(config, "shp.tenants", "7=x,alice"),
                     KVD_OK);
    assert_int_equal(kvd_config_apply(config, shaped_table, SHAPED_FIELDS, &s,
                                      err, sizeof(err)),
                     KVD_ERR_INVALID);
    assert_non_null(strstr(err, "shp.tenants='7=x,alice' (from call "
                                "parameter): item 2 'alice' is not key=value"));
    assert_int_equal(kvd_config_set(config, "shp.etcd", "a,,b"), KVD_OK);
    assert_int_equal(kvd_config_set(config, "shp.tenants", ""), KVD_OK);
    assert_int_equal(kvd_config_apply(config, shaped_table, SHAPED_FIELDS, &s,
                                      err, sizeof(err)),
                     KVD_ERR_INVALID);
    assert_non_null(strstr(err, "item 2 is empty"));
    kvd_config_destroy(config);
}

static void test_wrong_shapes(void **state)
{
    (void)state;
    apply_bad("shp:\n  count: {a: 1}\n", "shp.count (from file <yaml>:2)",
              "a mapping where a single value is expected", NULL);
    apply_bad("shp:\n  count: [1]\n", "shp.count (from file <yaml>:2)",
              "a list where a single value is expected", NULL);
    apply_bad("shp:\n  etcd: {a: b}\n", "shp.etcd (from file <yaml>:2)",
              "a mapping where a list of scalars", NULL);
    apply_bad("shp:\n  tenants: [a, b]\n", "shp.tenants (from file <yaml>:2)",
              "a list where a mapping of scalars", NULL);
    apply_bad("shp:\n  tenants: alice\n",
              "shp.tenants='alice' (from file "
              "<yaml>:2)",
              "item 1 'alice' is not key=value", NULL);
    apply_bad("shp:\n  tenants:\n    1000: alice\n    1001: {x: 1}\n",
              "shp.tenants (from file <yaml>:2)",
              "the value of '1001' is a mapping (line 4)", NULL);
    apply_bad("shp:\n  tenants:\n    1000: [a]\n",
              "the value of '1000' is a list (line 3)", NULL);
    apply_bad("shp:\n  tenants:\n    1000: 'a,b'\n",
              "the value of '1000' is empty or holds a ',' or '=' (line 3)",
              NULL);
    apply_bad("shp:\n  tenants: {'a,b': c}\n",
              "the key 'a,b' holds a ',' (line 2)", NULL);
}

static void test_list_load_errors(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        const char *want;
    } cases[] = {
        {"shp:\n  etcd: [a, [b]]\n",
         "<yaml>:2: a list of 'shp.etcd' holds a list (lists hold scalars "
         "only)"},
        {"shp:\n  etcd:\n    - a\n    - {b: c}\n",
         "<yaml>:4: a list of 'shp.etcd' holds a mapping (lists hold scalars "
         "only)"},
        {"shp:\n  etcd: [a, 'b,c']\n",
         "<yaml>:2: a list item of 'shp.etcd' is empty or holds a ',': "
         "'b,c'"},
        {"shp:\n  etcd: [a, '']\n",
         "<yaml>:2: a list item of 'shp.etcd' is empty or holds a ',': ''"},
        {"shp:\n  etcd: [a]\n  etcd: b\n",
         "<yaml>:3: duplicate key 'shp.etcd' (first set on line 2)"},
        {"shp:\n  tenants: {a: b}\nshp.tenants: x\n",
         "<yaml>:3: duplicate key 'shp.tenants' (first set on line 2)"},
        {"- a\n", "<yaml>:1: the top level must be a mapping"},
        {"? [a]\n: 1\n", "<yaml>:1: mapping keys must be scalars"},
        {"shp: !!seq [a]\n",
         "<yaml>:1: tags are not supported ('tag:yaml.org,2002:seq')"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kvd_config_t *config = config_new();
        char err[256] = "";
        assert_int_equal(kvd_config_load_yaml(config, cases[i].yaml,
                                              strlen(cases[i].yaml), err,
                                              sizeof(err)),
                         KVD_ERR_INVALID);
        assert_string_equal(err, cases[i].want);
        kvd_config_destroy(config);
    }
}

/* Members of a pairs field are not unknown settings; a section mapping
 * stays a section; an unknown mapping is still unknown. */
static void test_unknown_keys(void **state)
{
    (void)state;
    shaped_t s;
    char err[256] = "";
    assert_int_equal(shaped_apply("shp: {tenants: {1000: a}, count: 2}\n"
                                  "shp: {etcd: [x]}\n",
                                  &s, err, sizeof(err)),
                     KVD_OK);
    assert_int_equal(s.count, 2);
    assert_string_equal(s.etcd, "x");
    assert_string_equal(s.tenants, "1000=a");
    assert_int_equal(
        shaped_apply("shp:\n  tenant: {1000: a}\n", &s, err, sizeof(err)),
        KVD_ERR_NOT_FOUND);
    assert_non_null(strstr(err, "unknown setting 'shp.tenant."));
    assert_int_equal(shaped_apply("shp:\n  other: {}\n", &s, err, sizeof(err)),
                     KVD_ERR_NOT_FOUND);
    assert_string_equal(err,
                        "unknown setting 'shp.other' (from file <yaml>:2)");
}

static void test_print_canonical(void **state)
{
    (void)state;
    char *text[2];
    for (int i = 0; i < 2; i++) {
        kvd_config_t *config = config_new();
        load(config, i == 0 ? "shp: {tenants: {1000: alice, 1001: bob}, "
                              "etcd: [a, b]}\n"
                            : "shp: {tenants: '1000=alice, 1001 = bob', "
                              "etcd: ' a ,b'}\n");
        size_t len = 0;
        FILE *out = open_memstream(&text[i], &len);
        assert_non_null(out);
        assert_int_equal(
            kvd_config_print(config, shaped_table, SHAPED_FIELDS, out), KVD_OK);
        fclose(out);
        kvd_config_destroy(config);
    }
    assert_string_equal(text[0], text[1]);
    assert_non_null(strstr(text[0], "shp.tenants = 1000=alice,1001=bob  #"));
    assert_non_null(strstr(text[0], "shp.etcd = a,b  #"));
    free(text[0]);
    free(text[1]);
}

/* kvdepotd's own list and pairs keys, through its settings and its
 * tenancy (server.tls_tenants takes the same parser and needs TLS files,
 * so it is only checked to be declared with it). */
static void test_server_keys(void **state)
{
    (void)state;
    kvd_config_t *config = config_new();
    load(config, "server:\n"
                 "  tenants: {1000: alice, 1001: bob}\n"
                 "  tenant_quotas:\n"
                 "    alice: 4g\n"
                 "  tenant_arenas: {bob: 8m}\n"
                 "  tenant_arena_size: shared\n"
                 "cluster:\n"
                 "  etcd: [127.0.0.1:2379, 127.0.0.1:2380]\n");
    kvd_server_settings_t *cfg = calloc(1, sizeof(*cfg));
    srv_tenancy_t *tenancy = calloc(1, sizeof(*tenancy));
    assert_non_null(cfg);
    assert_non_null(tenancy);
    unsigned mode = 0;
    char err[512] = "";
    assert_int_equal(
        srv_settings(config, cfg, &mode, tenancy, err, sizeof(err)), KVD_OK);
    assert_string_equal(cfg->tenants, "1000=alice,1001=bob");
    assert_string_equal(cfg->tenant_quotas, "alice=4g");
    assert_string_equal(cfg->tenant_arenas, "bob=8m");
    assert_string_equal(cfg->cluster_etcd, "127.0.0.1:2379,127.0.0.1:2380");
    assert_int_equal(tenancy->n_uids, 2);
    assert_int_equal(tenancy->uids[1].uid, 1001);
    assert_string_equal(tenancy->uids[1].name, "bob");
    assert_int_equal(tenancy->n_quotas, 1);
    assert_true(tenancy->quotas[0].bytes == 4ull << 30);
    assert_int_equal(tenancy->n_arenas, 1);
    assert_true(tenancy->arenas[0].bytes == 8ull << 20);
    /* A list where pairs are expected, named with its line. */
    load(config, "server:\n  tls_tenants: [engine-a]\n");
    assert_int_equal(
        srv_settings(config, cfg, &mode, tenancy, err, sizeof(err)),
        KVD_ERR_INVALID);
    assert_non_null(strstr(err, "server.tls_tenants (from file <yaml>:2): a "
                                "list where a mapping"));
    free(tenancy);
    free(cfg);
    kvd_config_destroy(config);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_map_and_string_agree, setup),
        cmocka_unit_test_setup(test_call_parameter_keeps_text, setup),
        cmocka_unit_test_setup(test_wrong_shapes, setup),
        cmocka_unit_test_setup(test_list_load_errors, setup),
        cmocka_unit_test_setup(test_unknown_keys, setup),
        cmocka_unit_test_setup(test_print_canonical, setup),
        cmocka_unit_test_setup(test_server_keys, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
