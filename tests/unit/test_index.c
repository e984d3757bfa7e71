/*
 * Persistent index (store/index.h): every record field survives a round
 * trip and a reopen; prefix lookups stop at the first gap; a 10k batch is
 * one transaction; deletes and namespace drops remove exactly what they
 * name; a child killed with SIGKILL mid-write leaves every synced batch and
 * only whole later batches; the map grows on demand and fails cleanly at
 * its cap; damaged records are reported, never served; an injected failure
 * leaves the index unchanged; readers see consistent snapshots while a
 * writer commits and grows the map.
 *
 * Worker threads and the forked child never call cmocka asserts; they
 * record failures that the test thread checks.
 */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/failpoint_int.h"
#include "store/index.h"

#if defined(__SANITIZE_THREAD__)
#define TEST_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TEST_UNDER_TSAN 1
#endif
#endif
#ifdef TEST_UNDER_TSAN
#define CONCURRENT_BATCHES 120
#else
#define CONCURRENT_BATCHES 300
#endif

#define MIB (1ull << 20)

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

typedef struct test_dir {
    char path[256];
} test_dir_t;

static void dir_make(test_dir_t *d)
{
    const char *tmp = getenv("TMPDIR");
    if (tmp == NULL || tmp[0] == '\0') {
        tmp = "/tmp";
    }
    snprintf(d->path, sizeof(d->path), "%s/kvd_test_index_XXXXXX", tmp);
    assert_non_null(mkdtemp(d->path));
}

static void dir_remove(const test_dir_t *d)
{
    char p[300];
    snprintf(p, sizeof(p), "%s/%s", d->path, KVD_INDEX_FILE_NAME);
    unlink(p);
    snprintf(p, sizeof(p), "%s/%s-lock", d->path, KVD_INDEX_FILE_NAME);
    unlink(p);
    assert_int_equal(rmdir(d->path), 0);
}

static kvd_index_t *index_open_or_fail(const test_dir_t *d,
                                       const kvd_index_config_t *cfg)
{
    kvd_index_t *idx = NULL;
    assert_int_equal(kvd_index_open(d->path, cfg, &idx), KVD_OK);
    assert_non_null(idx);
    return idx;
}

static kvd_namespace_t make_ns(uint8_t tag)
{
    kvd_namespace_t ns;
    for (int i = 0; i < KVD_INDEX_NS_BYTES; i++) {
        ns.bytes[i] = (uint8_t)(tag ^ (i * 17));
    }
    ns.bytes[0] = tag;
    return ns;
}

/* Unique per id (big-endian id first), pseudo-random after it, so keys
 * land all over the B-tree as real block hashes do. */
static kvd_block_hash_t make_hash(uint32_t id)
{
    kvd_block_hash_t h;
    uint64_t x = kvd_xxh3_64(&id, sizeof(id));
    for (int i = 0; i < KVD_SHA256_BYTES; i++) {
        h.bytes[i] = (uint8_t)(x >> ((i % 8) * 8)) ^ (uint8_t)i;
    }
    h.bytes[0] = (uint8_t)(id >> 24);
    h.bytes[1] = (uint8_t)(id >> 16);
    h.bytes[2] = (uint8_t)(id >> 8);
    h.bytes[3] = (uint8_t)id;
    return h;
}

static kvd_store_key_t make_key(uint8_t ns_tag, uint32_t id)
{
    kvd_store_key_t k;
    k.ns = make_ns(ns_tag);
    k.hash = make_hash(id);
    return k;
}

/* Every field derived from (ns, id, gen), so a reader can check a record it
 * finds without knowing what was written. */
static kvd_index_entry_t make_entry(uint8_t ns_tag, uint32_t id, uint32_t gen)
{
    kvd_index_entry_t e;
    memset(&e, 0, sizeof(e));
    e.key = make_key(ns_tag, id);
    e.tier = (id % 2) ? KVD_INDEX_TIER_DISK : KVD_INDEX_TIER_HOST;
    e.codec_k = (uint8_t)(id * 7);
    e.codec_v = (uint8_t)(gen * 3 + 1);
    e.flags = (uint8_t)(id ^ gen);
    e.tenant_id = 0xA0000000u + id;
    e.file_id = e.tier == KVD_INDEX_TIER_DISK ? id % 7 + 1 : 0;
    e.offset = (uint64_t)id * 2 * MIB + gen;
    e.size_bytes = 2 * MIB + id;
    e.checksum = kvd_xxh3_64(&e.offset, sizeof(e.offset)) ^ 0x5555;
    e.created_unix_ms = 1700000000000ull + id;
    e.last_access_unix_ms = e.created_unix_ms + gen;
    return e;
}

static int entry_equal(const kvd_index_entry_t *a, const kvd_index_entry_t *b)
{
    return memcmp(&a->key, &b->key, sizeof(a->key)) == 0 &&
           a->tier == b->tier && a->codec_k == b->codec_k &&
           a->codec_v == b->codec_v && a->flags == b->flags &&
           a->tenant_id == b->tenant_id && a->file_id == b->file_id &&
           a->offset == b->offset && a->size_bytes == b->size_bytes &&
           a->checksum == b->checksum &&
           a->created_unix_ms == b->created_unix_ms &&
           a->last_access_unix_ms == b->last_access_unix_ms;
}

/* Recovers gen from a record produced by make_entry, -1 if it is not one. */
static int64_t entry_gen(const kvd_index_entry_t *e, uint8_t ns_tag,
                         uint32_t id)
{
    uint32_t gen = (uint32_t)(e->last_access_unix_ms - e->created_unix_ms);
    kvd_index_entry_t want = make_entry(ns_tag, id, gen);
    return entry_equal(e, &want) ? (int64_t)gen : -1;
}

static kvd_status_t put_range(kvd_index_t *idx, uint8_t ns_tag, uint32_t first,
                              uint32_t n, uint32_t gen)
{
    kvd_index_entry_t *v = calloc(n, sizeof(*v));
    assert_non_null(v);
    for (uint32_t i = 0; i < n; i++) {
        v[i] = make_entry(ns_tag, first + i, gen);
    }
    kvd_status_t st = kvd_index_put_batch(idx, v, n);
    free(v);
    return st;
}

static void expect_range(kvd_index_t *idx, uint8_t ns_tag, uint32_t first,
                         uint32_t n, uint32_t gen)
{
    for (uint32_t i = 0; i < n; i++) {
        kvd_store_key_t k = make_key(ns_tag, first + i);
        kvd_index_entry_t want = make_entry(ns_tag, first + i, gen);
        kvd_index_entry_t got;
        assert_int_equal(kvd_index_get(idx, &k, &got), KVD_OK);
        assert_true(entry_equal(&got, &want));
    }
}

static uint64_t count_of(kvd_index_t *idx)
{
    uint64_t n = UINT64_MAX;
    assert_int_equal(kvd_index_count(idx, &n), KVD_OK);
    return n;
}

/* ------------------------------------------------------------------------ */
/* Tests                                                                    */
/* ------------------------------------------------------------------------ */

static void test_round_trip_every_field(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_t *idx = index_open_or_fail(&d, NULL);

    kvd_index_entry_t e[2];
    e[0] = make_entry(1, 10, 3);
    e[1] = make_entry(1, 11, 4);
    e[1].codec_k = 0xff;
    e[1].flags = 0x80;
    e[1].offset = UINT64_MAX - 1;
    e[1].size_bytes = UINT64_MAX;
    e[1].checksum = 0x0123456789abcdefull;
    e[1].tenant_id = UINT32_MAX;
    e[1].file_id = UINT32_MAX;
    assert_int_equal(kvd_index_put_batch(idx, e, 2), KVD_OK);
    for (int i = 0; i < 2; i++) {
        kvd_index_entry_t got;
        memset(&got, 0xee, sizeof(got));
        assert_int_equal(kvd_index_get(idx, &e[i].key, &got), KVD_OK);
        assert_true(entry_equal(&got, &e[i]));
    }

    /* Same key again replaces the record. */
    kvd_index_entry_t upd = make_entry(1, 10, 9);
    assert_int_equal(kvd_index_put_batch(idx, &upd, 1), KVD_OK);
    expect_range(idx, 1, 10, 1, 9);
    assert_int_equal(count_of(idx), 2);

    /* Misses and rejected entries; out-parameters untouched on error. */
    kvd_store_key_t missing = make_key(1, 12);
    kvd_index_entry_t got = make_entry(9, 9, 9);
    kvd_index_entry_t before = got;
    assert_int_equal(kvd_index_get(idx, &missing, &got), KVD_ERR_NOT_FOUND);
    assert_true(entry_equal(&got, &before));
    kvd_index_entry_t bad = make_entry(1, 20, 0);
    bad.tier = 3;
    assert_int_equal(kvd_index_put_batch(idx, &bad, 1), KVD_ERR_INVALID);
    bad = make_entry(1, 20, 0);
    bad.size_bytes = 0;
    assert_int_equal(kvd_index_put_batch(idx, &bad, 1), KVD_ERR_INVALID);
    bad = make_entry(1, 20, 0); /* even id: host tier */
    bad.file_id = 1;
    kvd_index_entry_t batch[2] = {make_entry(1, 21, 0), bad};
    assert_int_equal(kvd_index_put_batch(idx, batch, 2), KVD_ERR_INVALID);
    assert_int_equal(kvd_index_get(idx, &batch[0].key, &got),
                     KVD_ERR_NOT_FOUND);
    assert_int_equal(kvd_index_put_batch(idx, NULL, 1), KVD_ERR_INVALID);
    assert_int_equal(kvd_index_put_batch(idx, NULL, 0), KVD_OK);
    assert_int_equal(kvd_index_get(NULL, &missing, &got), KVD_ERR_INVALID);
    assert_int_equal(kvd_index_get(idx, NULL, &got), KVD_ERR_INVALID);
    assert_int_equal(kvd_index_get(idx, &missing, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_index_count(idx, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_index_query_map_size(idx, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_index_sync(NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_index_put_raw(idx, NULL, "x", 1), KVD_ERR_INVALID);
    size_t n = 0;
    assert_int_equal(kvd_index_scan(idx, NULL, NULL, 4, &n, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(kvd_index_scan(idx, NULL, &got, 1, NULL, NULL),
                     KVD_ERR_INVALID);
    assert_int_equal(count_of(idx), 2);
    assert_int_equal(kvd_index_sync(idx), KVD_OK);

    kvd_index_close(idx);
    kvd_index_close(NULL);
    dir_remove(&d);
}

static void test_sync_commits_mode(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_config_t cfg = {.sync_commits = 1};
    kvd_index_t *idx = index_open_or_fail(&d, &cfg);
    assert_int_equal(put_range(idx, 1, 0, 50, 1), KVD_OK);
    kvd_index_close(idx);
    /* The same file opens in the default (no per-commit fsync) mode. */
    idx = index_open_or_fail(&d, NULL);
    expect_range(idx, 1, 0, 50, 1);
    kvd_index_close(idx);
    dir_remove(&d);
}

static void test_open_rejects_bad_arguments(void **state)
{
    (void)state;
    static int sentinel;
    kvd_index_t *const untouched = (kvd_index_t *)(void *)&sentinel;
    kvd_index_t *idx = untouched;
    assert_int_equal(kvd_index_open(NULL, NULL, &idx), KVD_ERR_INVALID);
    assert_int_equal(kvd_index_open("/tmp", NULL, NULL), KVD_ERR_INVALID);
    assert_int_equal(kvd_index_open("/nonexistent/kvd_index_dir", NULL, &idx),
                     KVD_ERR_NOT_FOUND);

    test_dir_t d;
    dir_make(&d);
    kvd_index_config_t cfg = {.map_size_bytes = 8 * MIB,
                              .map_size_max_bytes = 4 * MIB};
    assert_int_equal(kvd_index_open(d.path, &cfg, &idx), KVD_ERR_INVALID);
    assert_true(idx == untouched);

    /* A file that is not an LMDB environment is reported as corrupt. */
    char p[300];
    snprintf(p, sizeof(p), "%s/%s", d.path, KVD_INDEX_FILE_NAME);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    for (int i = 0; i < 4096; i++) {
        fputc('x', f);
    }
    fclose(f);
    assert_int_equal(kvd_index_open(d.path, NULL, &idx), KVD_ERR_CORRUPT);
    dir_remove(&d);
}

static void test_lookup_prefix(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_t *idx = index_open_or_fail(&d, NULL);

    /* Chain ids 0..7 in namespace 1: stored 0,1,2 and 4,5 (gap at 3). */
    uint32_t stored[] = {0, 1, 2, 4, 5};
    for (size_t i = 0; i < 5; i++) {
        assert_int_equal(put_range(idx, 1, stored[i], 1, 2), KVD_OK);
    }
    /* The same hashes under another namespace must not match. */
    assert_int_equal(put_range(idx, 2, 3, 1, 2), KVD_OK);

    kvd_block_hash_t chain[8];
    for (uint32_t i = 0; i < 8; i++) {
        chain[i] = make_hash(i);
    }
    kvd_namespace_t ns1 = make_ns(1), ns2 = make_ns(2), ns3 = make_ns(3);
    kvd_index_entry_t out[8];
    size_t matched = 99;

    assert_int_equal(
        kvd_index_lookup_prefix(idx, &ns1, chain, 8, out, &matched), KVD_OK);
    assert_int_equal(matched, 3); /* the gap ends it; 4 and 5 not served */
    for (uint32_t i = 0; i < 3; i++) {
        kvd_index_entry_t want = make_entry(1, i, 2);
        assert_true(entry_equal(&out[i], &want));
    }
    assert_int_equal(
        kvd_index_lookup_prefix(idx, &ns1, chain, 2, out, &matched), KVD_OK);
    assert_int_equal(matched, 2); /* full */
    assert_int_equal(
        kvd_index_lookup_prefix(idx, &ns1, chain + 3, 5, out, &matched),
        KVD_OK);
    assert_int_equal(matched, 0); /* first missing */
    assert_int_equal(
        kvd_index_lookup_prefix(idx, &ns1, chain + 4, 4, NULL, &matched),
        KVD_OK);
    assert_int_equal(matched, 2); /* counting only */
    assert_int_equal(
        kvd_index_lookup_prefix(idx, &ns2, chain + 3, 1, out, &matched),
        KVD_OK);
    assert_int_equal(matched, 1);
    assert_int_equal(
        kvd_index_lookup_prefix(idx, &ns3, chain, 8, out, &matched), KVD_OK);
    assert_int_equal(matched, 0);
    assert_int_equal(
        kvd_index_lookup_prefix(idx, &ns1, chain, 0, out, &matched), KVD_OK);
    assert_int_equal(matched, 0);
    assert_int_equal(kvd_index_lookup_prefix(idx, &ns1, NULL, 1, out, &matched),
                     KVD_ERR_INVALID);
    assert_int_equal(
        kvd_index_lookup_prefix(idx, NULL, chain, 1, out, &matched),
        KVD_ERR_INVALID);
    assert_int_equal(kvd_index_lookup_prefix(idx, &ns1, chain, 1, out, NULL),
                     KVD_ERR_INVALID);

    kvd_index_close(idx);
    dir_remove(&d);
}

static void test_batch_of_10k_is_one_transaction(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_t *idx = index_open_or_fail(&d, NULL);

    /* A failure injected at the commit of the batch must drop all 10k: had
     * the batch been split, the earlier parts would have stayed. */
    assert_int_equal(kvd_failpoint_set("index.put=EIO@1", NULL, 0), KVD_OK);
    assert_int_equal(put_range(idx, 1, 0, 10000, 1), KVD_ERR_IO);
    assert_int_equal(kvd_failpoint_count("index.put"), 1);
    kvd_failpoint_clear();
    assert_int_equal(count_of(idx), 0);

    assert_int_equal(put_range(idx, 1, 0, 10000, 1), KVD_OK);
    assert_int_equal(count_of(idx), 10000);
    expect_range(idx, 1, 0, 10000, 1);

    kvd_index_close(idx);
    dir_remove(&d);
}

static void test_delete_batch(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_t *idx = index_open_or_fail(&d, NULL);
    assert_int_equal(put_range(idx, 1, 0, 100, 0), KVD_OK);

    kvd_store_key_t keys[5] = {make_key(1, 3), make_key(1, 50), make_key(1, 99),
                               make_key(1, 500), make_key(2, 3)};
    size_t deleted = 77;
    assert_int_equal(kvd_index_delete_batch(idx, keys, 5, &deleted), KVD_OK);
    assert_int_equal(deleted, 3); /* absent keys are not an error */
    kvd_index_entry_t got;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(kvd_index_get(idx, &keys[i], &got), KVD_ERR_NOT_FOUND);
    }
    assert_int_equal(count_of(idx), 97);
    expect_range(idx, 1, 4, 46, 0);
    assert_int_equal(kvd_index_delete_batch(idx, keys, 5, NULL), KVD_OK);

    /* A failed delete batch deletes nothing. */
    kvd_store_key_t k10 = make_key(1, 10);
    assert_int_equal(kvd_failpoint_set("index.delete=ENOSPC", NULL, 0), KVD_OK);
    deleted = 77;
    assert_int_equal(kvd_index_delete_batch(idx, &k10, 1, &deleted),
                     KVD_ERR_NOSPACE);
    assert_int_equal(deleted, 77);
    kvd_failpoint_clear();
    expect_range(idx, 1, 10, 1, 0);
    assert_int_equal(kvd_index_delete_batch(idx, NULL, 1, NULL),
                     KVD_ERR_INVALID);

    kvd_index_close(idx);
    dir_remove(&d);
}

static void test_drop_namespace_removes_only_it(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_t *idx = index_open_or_fail(&d, NULL);

    /* Namespaces 1, 2, 3 are adjacent in key order; 2 is in the middle and
     * spans many pages. */
    assert_int_equal(put_range(idx, 1, 0, 300, 1), KVD_OK);
    assert_int_equal(put_range(idx, 2, 0, 3000, 2), KVD_OK);
    assert_int_equal(put_range(idx, 3, 0, 300, 3), KVD_OK);

    kvd_namespace_t ns2 = make_ns(2), ns9 = make_ns(9);
    uint64_t dropped = 0;
    assert_int_equal(kvd_failpoint_set("index.delete=EIO", NULL, 0), KVD_OK);
    assert_int_equal(kvd_index_drop_namespace(idx, &ns2, &dropped), KVD_ERR_IO);
    kvd_failpoint_clear();
    assert_int_equal(count_of(idx), 3600);

    assert_int_equal(kvd_index_drop_namespace(idx, &ns2, &dropped), KVD_OK);
    assert_int_equal(dropped, 3000);
    assert_int_equal(count_of(idx), 600);
    expect_range(idx, 1, 0, 300, 1);
    expect_range(idx, 3, 0, 300, 3);
    kvd_store_key_t k = make_key(2, 7);
    kvd_index_entry_t got;
    assert_int_equal(kvd_index_get(idx, &k, &got), KVD_ERR_NOT_FOUND);

    assert_int_equal(kvd_index_drop_namespace(idx, &ns9, &dropped), KVD_OK);
    assert_int_equal(dropped, 0);
    /* Dropping everything leaves an empty, usable index. */
    kvd_namespace_t ns1 = make_ns(1), ns3 = make_ns(3);
    assert_int_equal(kvd_index_drop_namespace(idx, &ns3, NULL), KVD_OK);
    assert_int_equal(kvd_index_drop_namespace(idx, &ns1, &dropped), KVD_OK);
    assert_int_equal(dropped, 300);
    assert_int_equal(count_of(idx), 0);
    assert_int_equal(put_range(idx, 2, 0, 5, 4), KVD_OK);
    expect_range(idx, 2, 0, 5, 4);
    assert_int_equal(kvd_index_drop_namespace(idx, NULL, NULL),
                     KVD_ERR_INVALID);

    kvd_index_close(idx);
    dir_remove(&d);
}

/* Reads everything back with kvd_index_scan in pages of `page`. */
static size_t scan_all(kvd_index_t *idx, kvd_index_entry_t *all, size_t cap,
                       size_t page, uint64_t *corrupt_out)
{
    size_t total = 0;
    uint64_t corrupt = 0;
    const kvd_store_key_t *after = NULL;
    for (;;) {
        size_t n = 0;
        uint64_t c = 0;
        assert_true(total + page <= cap);
        assert_int_equal(kvd_index_scan(idx, after, all + total, page, &n, &c),
                         KVD_OK);
        corrupt += c;
        total += n;
        if (n < page) {
            break;
        }
        after = &all[total - 1].key;
    }
    *corrupt_out = corrupt;
    return total;
}

static void test_reopen_keeps_everything(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_t *idx = index_open_or_fail(&d, NULL);
    assert_int_equal(put_range(idx, 4, 0, 1000, 5), KVD_OK);
    assert_int_equal(put_range(idx, 1, 0, 10, 6), KVD_OK);
    kvd_index_close(idx);

    idx = index_open_or_fail(&d, NULL);
    assert_int_equal(count_of(idx), 1010);
    expect_range(idx, 4, 0, 1000, 5);
    expect_range(idx, 1, 0, 10, 6);

    /* Scan pages through all of it, in key order, each record exact. */
    size_t cap = 1100;
    kvd_index_entry_t *all = calloc(cap, sizeof(*all));
    assert_non_null(all);
    uint64_t corrupt = 1;
    assert_int_equal(scan_all(idx, all, cap, 64, &corrupt), 1010);
    assert_int_equal(corrupt, 0);
    for (size_t i = 0; i < 1010; i++) {
        if (i > 0) {
            assert_true(memcmp(&all[i - 1].key, &all[i].key,
                               sizeof(kvd_store_key_t)) < 0);
        }
        uint32_t id =
            (uint32_t)all[i].key.hash.bytes[2] << 8 | all[i].key.hash.bytes[3];
        uint8_t tag = all[i].key.ns.bytes[0];
        assert_true(entry_gen(&all[i], tag, id) == (tag == 4 ? 5 : 6));
    }
    size_t n = 0;
    assert_int_equal(kvd_index_scan(idx, NULL, all, 0, &n, NULL),
                     KVD_ERR_INVALID);
    free(all);
    kvd_index_close(idx);
    dir_remove(&d);
}

/* Child of the crash test: never returns. Exit codes tell the parent which
 * step failed; being killed is the expected end. */
#define CRASH_A 500
#define CRASH_B 50u
static void crash_child(const char *dir, int ready_fd)
{
    kvd_index_t *idx = NULL;
    alarm(60); /* never outlive a broken parent */
    if (kvd_index_open(dir, NULL, &idx) != KVD_OK) {
        _exit(10);
    }
    if (put_range(idx, 1, 0, CRASH_A, 1) != KVD_OK) {
        _exit(11);
    }
    if (kvd_index_sync(idx) != KVD_OK) {
        _exit(12);
    }
    if (write(ready_fd, "r", 1) != 1) {
        _exit(13);
    }
    /* Batch g: new keys (ns 2, g*CRASH_B ..) and a rewrite of the shared
     * keys (ns 3, 0..CRASH_B) with generation g. */
    kvd_index_entry_t v[2 * CRASH_B];
    for (uint32_t g = 1;; g++) {
        for (uint32_t i = 0; i < CRASH_B; i++) {
            v[i] = make_entry(2, g * CRASH_B + i, g);
            v[CRASH_B + i] = make_entry(3, i, g);
        }
        if (kvd_index_put_batch(idx, v, sizeof(v) / sizeof(v[0])) != KVD_OK) {
            _exit(14);
        }
    }
}

static void crash_check(kvd_index_t *idx)
{
    kvd_index_entry_t got;
    expect_range(idx, 1, 0, CRASH_A, 1);

    /* The shared keys all carry the same generation G (or none exist), and
     * exactly the batches 1..G of new keys exist. */
    int64_t g_last = -1;
    for (uint32_t i = 0; i < CRASH_B; i++) {
        kvd_store_key_t k = make_key(3, i);
        kvd_status_t st = kvd_index_get(idx, &k, &got);
        int64_t g = 0;
        if (st == KVD_OK) {
            g = entry_gen(&got, 3, i);
            assert_true(g > 0);
        } else {
            assert_int_equal(st, KVD_ERR_NOT_FOUND);
        }
        if (i == 0) {
            g_last = g;
        }
        assert_true(g == g_last);
    }
    uint64_t n = count_of(idx);
    uint64_t want =
        CRASH_A + (g_last > 0 ? CRASH_B + (uint64_t)g_last * CRASH_B : 0);
    assert_true(n == want);
    for (uint32_t g = 1; g <= (uint32_t)g_last; g++) {
        expect_range(idx, 2, g * CRASH_B, CRASH_B, g);
    }

    /* Every record decodes. */
    size_t cap = (size_t)n + 64;
    kvd_index_entry_t *all = calloc(cap, sizeof(*all));
    assert_non_null(all);
    uint64_t corrupt = 1;
    assert_int_equal(scan_all(idx, all, cap, 64, &corrupt), n);
    assert_int_equal(corrupt, 0);
    free(all);
}

static void test_crash_keeps_synced_and_whole_batches(void **state)
{
    (void)state;
    /* Different kill points: early, in the middle of many batches. */
    const long delays_us[] = {0, 3000, 20000};
    for (size_t round = 0; round < 3; round++) {
        test_dir_t d;
        dir_make(&d);
        int fds[2];
        assert_int_equal(pipe(fds), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(fds[0]);
            crash_child(d.path, fds[1]);
        }
        close(fds[1]);
        char c = 0;
        assert_int_equal(read(fds[0], &c, 1), 1);
        close(fds[0]);
        struct timespec ts = {0, delays_us[round] * 1000};
        nanosleep(&ts, NULL);
        assert_int_equal(kill(pid, SIGKILL), 0);
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

        kvd_index_t *idx = index_open_or_fail(&d, NULL);
        crash_check(idx);
        /* The writer lock the child died holding is recovered. */
        assert_int_equal(put_range(idx, 5, 0, 10, 7), KVD_OK);
        kvd_index_close(idx);
        idx = index_open_or_fail(&d, NULL);
        expect_range(idx, 5, 0, 10, 7);
        kvd_index_close(idx);
        dir_remove(&d);
    }
}

static void test_map_grows_transparently(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_config_t cfg = {.map_size_bytes = 1 * MIB,
                              .map_size_max_bytes = 256 * MIB};
    kvd_index_t *idx = index_open_or_fail(&d, &cfg);
    uint64_t size0 = 0, size1 = 0;
    assert_int_equal(kvd_index_query_map_size(idx, &size0), KVD_OK);
    assert_int_equal(size0, 1 * MIB);

    /* ~30k random-key records need several MiB of half-full pages. */
    for (uint32_t b = 0; b < 30; b++) {
        assert_int_equal(put_range(idx, 1, b * 1000, 1000, b), KVD_OK);
    }
    assert_int_equal(kvd_index_query_map_size(idx, &size1), KVD_OK);
    assert_true(size1 >= 4 * MIB);
    assert_int_equal(count_of(idx), 30000);
    for (uint32_t b = 0; b < 30; b++) {
        expect_range(idx, 1, b * 1000, 1000, b);
    }
    kvd_index_close(idx);

    /* Reopening with the small configured size keeps the grown map. */
    idx = index_open_or_fail(&d, &cfg);
    assert_int_equal(count_of(idx), 30000);
    assert_int_equal(put_range(idx, 2, 0, 1000, 1), KVD_OK);
    expect_range(idx, 1, 29000, 1000, 29);
    kvd_index_close(idx);
    dir_remove(&d);
}

static void test_map_cap_gives_nospace_and_no_change(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_config_t cfg = {.map_size_bytes = 1 * MIB,
                              .map_size_max_bytes = 2 * MIB};
    kvd_index_t *idx = index_open_or_fail(&d, &cfg);

    uint32_t b = 0;
    kvd_status_t st = KVD_OK;
    for (; b < 100 && st == KVD_OK; b++) {
        st = put_range(idx, 1, b * 500, 500, 1);
    }
    assert_int_equal(st, KVD_ERR_NOSPACE);
    uint32_t good = b - 1; /* batches 0..good-1 committed */
    assert_true(good >= 2);
    uint64_t size = 0;
    assert_int_equal(kvd_index_query_map_size(idx, &size), KVD_OK);
    assert_int_equal(size, 2 * MIB);

    /* The failed batch left nothing behind; the rest is intact. */
    assert_int_equal(count_of(idx), (uint64_t)good * 500);
    kvd_store_key_t k = make_key(1, good * 500);
    kvd_index_entry_t got;
    assert_int_equal(kvd_index_get(idx, &k, &got), KVD_ERR_NOT_FOUND);
    expect_range(idx, 1, 0, good * 500, 1);

    /* Still usable: a small delete fits in the pages earlier commits
     * freed, and its room takes new records. */
    kvd_store_key_t keys[20];
    for (uint32_t i = 0; i < 20; i++) {
        keys[i] = make_key(1, i);
    }
    size_t deleted = 0;
    assert_int_equal(kvd_index_delete_batch(idx, keys, 20, &deleted), KVD_OK);
    assert_int_equal(deleted, 20);
    assert_int_equal(put_range(idx, 2, 0, 10, 2), KVD_OK);
    expect_range(idx, 2, 0, 10, 2);
    expect_range(idx, 1, 20, good * 500 - 20, 1);
    assert_int_equal(count_of(idx), (uint64_t)good * 500 - 10);
    kvd_index_close(idx);
    dir_remove(&d);
}

static void test_corrupt_records_are_reported(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_t *idx = index_open_or_fail(&d, NULL);
    kvd_log_level_t old = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_OFF); /* the errors below are expected */

    assert_int_equal(put_range(idx, 1, 0, 4, 1), KVD_OK);
    kvd_index_entry_t e = make_entry(1, 1, 1), got;
    uint8_t rec[KVD_INDEX_RECORD_BYTES], bad[KVD_INDEX_RECORD_BYTES];
    assert_int_equal(kvd_index_record_pack(&e, rec), KVD_OK);
    assert_int_equal(rec[0], KVD_INDEX_RECORD_VERSION);
    assert_int_equal(kvd_index_record_unpack(&e.key, rec, sizeof(rec), &got),
                     KVD_OK);
    assert_true(entry_equal(&got, &e));

    /* One flipped bit anywhere is caught. */
    for (size_t i = 0; i < sizeof(rec); i++) {
        memcpy(bad, rec, sizeof(rec));
        bad[i] ^= 0x10;
        assert_int_equal(
            kvd_index_record_unpack(&e.key, bad, sizeof(bad), &got),
            KVD_ERR_CORRUPT);
    }
    /* A valid record under another key, wrong lengths, other versions. */
    kvd_store_key_t other = make_key(1, 2);
    assert_int_equal(kvd_index_record_unpack(&other, rec, sizeof(rec), &got),
                     KVD_ERR_CORRUPT);
    assert_int_equal(kvd_index_record_unpack(&e.key, rec, 63, &got),
                     KVD_ERR_CORRUPT);
    assert_int_equal(kvd_index_record_unpack(&e.key, rec, 0, &got),
                     KVD_ERR_CORRUPT);
    assert_int_equal(kvd_index_record_unpack(&e.key, NULL, 64, &got),
                     KVD_ERR_INVALID);

    /* Stored on disk: get reports it; lookup stops before it; scan skips
     * and counts it. */
    memcpy(bad, rec, sizeof(rec));
    bad[20] ^= 1; /* the offset: the most dangerous field to get wrong */
    assert_int_equal(kvd_index_put_raw(idx, &e.key, bad, sizeof(bad)), KVD_OK);
    assert_int_equal(kvd_index_get(idx, &e.key, &got), KVD_ERR_CORRUPT);
    kvd_store_key_t k3 = make_key(1, 3);
    assert_int_equal(kvd_index_put_raw(idx, &k3, rec, 10), KVD_OK);
    assert_int_equal(kvd_index_get(idx, &k3, &got), KVD_ERR_CORRUPT);

    kvd_block_hash_t chain[4] = {make_hash(0), make_hash(1), make_hash(2),
                                 make_hash(3)};
    kvd_namespace_t ns1 = make_ns(1);
    kvd_index_entry_t out[4];
    size_t matched = 9;
    assert_int_equal(
        kvd_index_lookup_prefix(idx, &ns1, chain, 4, out, &matched), KVD_OK);
    assert_int_equal(matched, 1);
    kvd_index_entry_t all[8];
    size_t n = 0;
    uint64_t corrupt = 0;
    assert_int_equal(kvd_index_scan(idx, NULL, all, 8, &n, &corrupt), KVD_OK);
    assert_int_equal(n, 2);
    assert_int_equal(corrupt, 2);
    assert_int_equal(count_of(idx), 4);

    /* A good put repairs it. */
    assert_int_equal(kvd_index_put_batch(idx, &e, 1), KVD_OK);
    assert_int_equal(kvd_index_get(idx, &e.key, &got), KVD_OK);
    assert_true(entry_equal(&got, &e));

    kvd_log_set_level(old);
    kvd_index_close(idx);
    dir_remove(&d);
}

static void test_failpoint_put_leaves_index_unchanged(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_t *idx = index_open_or_fail(&d, NULL);
    kvd_log_level_t old = kvd_log_get_level();
    kvd_log_set_level(KVD_LOG_LEVEL_OFF);

    assert_int_equal(put_range(idx, 1, 0, 100, 1), KVD_OK);
    /* The failing batch rewrites existing keys and adds new ones. */
    assert_int_equal(kvd_failpoint_set("index.put=ENOMEM", NULL, 0), KVD_OK);
    assert_int_equal(put_range(idx, 1, 50, 100, 2), KVD_ERR_NOMEM);
    kvd_failpoint_clear();
    assert_int_equal(count_of(idx), 100);
    expect_range(idx, 1, 0, 100, 1);

    /* The third evaluation fails: the first two batches stay. */
    assert_int_equal(kvd_failpoint_set("index.put=EIO@3", NULL, 0), KVD_OK);
    assert_int_equal(put_range(idx, 2, 0, 10, 1), KVD_OK);
    assert_int_equal(put_range(idx, 2, 10, 10, 1), KVD_OK);
    assert_int_equal(put_range(idx, 2, 20, 10, 1), KVD_ERR_IO);
    kvd_failpoint_clear();
    assert_int_equal(count_of(idx), 120);
    assert_int_equal(put_range(idx, 2, 20, 10, 1), KVD_OK);
    expect_range(idx, 2, 0, 30, 1);

    kvd_log_set_level(old);
    kvd_index_close(idx);
    dir_remove(&d);
}

/* Concurrent readers: the writer rewrites one chain of CHAIN keys with a
 * new generation per batch (and adds fresh keys, so the map grows under
 * the readers); a reader's lookup must see the whole chain from one
 * generation, never a mix. */
#define CHAIN 64
#define NUM_READERS 3

typedef struct reader_ctx {
    pthread_t thread;
    kvd_index_t *idx;
    atomic_int *stop;
    uint64_t lookups;
    int failures;
} reader_ctx_t;

static void *reader_main(void *arg)
{
    reader_ctx_t *r = arg;
    kvd_block_hash_t chain[CHAIN];
    kvd_index_entry_t out[CHAIN];
    kvd_namespace_t ns = make_ns(1);
    int64_t last_gen = 0;

    for (uint32_t i = 0; i < CHAIN; i++) {
        chain[i] = make_hash(i);
    }
    while (!atomic_load(r->stop)) {
        size_t matched = 0;
        if (kvd_index_lookup_prefix(r->idx, &ns, chain, CHAIN, out, &matched) !=
                KVD_OK ||
            matched != CHAIN) {
            r->failures++;
            continue;
        }
        int64_t g = entry_gen(&out[0], 1, 0);
        for (uint32_t i = 1; i < CHAIN; i++) {
            if (entry_gen(&out[i], 1, i) != g) {
                r->failures++;
                break;
            }
        }
        /* Snapshots only move forward. */
        if (g < last_gen) {
            r->failures++;
        }
        last_gen = g;
        r->lookups++;
    }
    return NULL;
}

static void test_concurrent_readers_see_consistent_snapshots(void **state)
{
    (void)state;
    test_dir_t d;
    dir_make(&d);
    kvd_index_config_t cfg = {.map_size_bytes = 1 * MIB};
    kvd_index_t *idx = index_open_or_fail(&d, &cfg);
    assert_int_equal(put_range(idx, 1, 0, CHAIN, 1), KVD_OK);

    atomic_int stop = 0;
    reader_ctx_t readers[NUM_READERS];
    for (int i = 0; i < NUM_READERS; i++) {
        readers[i] = (reader_ctx_t){.idx = idx, .stop = &stop};
        assert_int_equal(
            pthread_create(&readers[i].thread, NULL, reader_main, &readers[i]),
            0);
    }
    kvd_index_entry_t v[CHAIN + 200];
    for (uint32_t g = 2; g < 2 + CONCURRENT_BATCHES; g++) {
        for (uint32_t i = 0; i < CHAIN; i++) {
            v[i] = make_entry(1, i, g);
        }
        for (uint32_t i = 0; i < 200; i++) {
            v[CHAIN + i] = make_entry(2, g * 200 + i, g);
        }
        assert_int_equal(kvd_index_put_batch(idx, v, CHAIN + 200), KVD_OK);
    }
    atomic_store(&stop, 1);
    uint64_t lookups = 0;
    for (int i = 0; i < NUM_READERS; i++) {
        assert_int_equal(pthread_join(readers[i].thread, NULL), 0);
        assert_int_equal(readers[i].failures, 0);
        lookups += readers[i].lookups;
    }
    assert_true(lookups > 0);
    uint64_t size = 0;
    assert_int_equal(kvd_index_query_map_size(idx, &size), KVD_OK);
    assert_true(size > 1 * MIB); /* it grew while readers ran */
    expect_range(idx, 1, 0, CHAIN, 1 + CONCURRENT_BATCHES);
    kvd_index_close(idx);
    dir_remove(&d);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip_every_field),
        cmocka_unit_test(test_sync_commits_mode),
        cmocka_unit_test(test_open_rejects_bad_arguments),
        cmocka_unit_test(test_lookup_prefix),
        cmocka_unit_test(test_batch_of_10k_is_one_transaction),
        cmocka_unit_test(test_delete_batch),
        cmocka_unit_test(test_drop_namespace_removes_only_it),
        cmocka_unit_test(test_reopen_keeps_everything),
        cmocka_unit_test(test_crash_keeps_synced_and_whole_batches),
        cmocka_unit_test(test_map_grows_transparently),
        cmocka_unit_test(test_map_cap_gives_nospace_and_no_change),
        cmocka_unit_test(test_corrupt_records_are_reported),
        cmocka_unit_test(test_failpoint_put_leaves_index_unchanged),
        cmocka_unit_test(test_concurrent_readers_see_consistent_snapshots),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
