/*
 * Cluster benchmark (issue "Cluster and disaggregation"): kvdepotd nodes
 * and one etcd on this machine, UCX over TCP on loopback
 * (UCX_NET_DEVICES=lo, UCX_TLS=tcp unless set), measured in one run:
 *
 *   fetch   remote fetch of 2 MiB objects between two daemons: OBJECTS
 *           objects saved through node A (keys chosen so that A is their
 *           home, so nothing moves before the lookup), then looked up
 *           through node B in chains of CHAIN_LEN; B asks A for them in one
 *           batch and pulls them over UCX into its arena before answering
 *           (in parts of cluster.fetch_part, the daemons' default, unless
 *           KVDEPOT_CLUSTER_FETCH_PART in the environment says otherwise:
 *           0 measures whole objects by rendezvous).
 *           Bytes per second of lookups, everything included (gRPC from
 *           the client to B, LOOKUP and FETCH to A, checksums, commits).
 *           Right before the timed lookups, one lookup of a tenth as many
 *           other objects goes through B untimed, as ucx_perftest runs a
 *           tenth of its iterations untimed before its clock starts (its
 *           warm-up); its rate is printed as the first lookup after idle.
 *           Node A and node B run on a CPU of their own each, as on two
 *           hosts, and so do ucx_perftest's server and client.
 *           Peer: ucx_perftest ucp_am_bw with 2 MiB messages over the
 *           same transport, run between the kvdepot passes; ucp_put_bw and
 *           one plain memcpy of the same bytes (cold memory) are reported
 *           too, and ucp_am_bw once more with -e: endpoints in UCX's
 *           error-handling mode, as kvdepot's must be (a dead node fails
 *           its transfers), which on TCP in UCX 1.13 moves rendezvous data
 *           through a bounce buffer instead of put_zcopy (second
 *           headline). ucx_perftest sends one 2 MiB buffer again and again, so
 *           its data stays in the caches; kvdepot moves OBJECTS distinct
 *           objects (256 MiB) and hashes each on arrival. Headline:
 *           median of the per-pass ratios to am_bw.
 *   reroute three daemons, R=2: a chain saved through A and pushed to its
 *           homes; A is SIGKILLed; the time until a lookup through C
 *           matches the whole chain again, and until A leaves C's view
 *           (its etcd lease, cluster.lease_ttl=2s, ends).
 *
 * Environment: KVDEPOTD (default: the daemon this tree built), ETCD
 * (default: etcd on PATH), UCX_PERFTEST (default: ucx_perftest on PATH).
 */
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench/bench_proc_int.h"
#include "cluster/placement.h"
#include "kvdepot/store.h"
#include "tests/support/kvd_metric.h"

#define OBJ (2u << 20)
#define OBJECTS 128u
#define CHAIN_LEN 32u
#define WARMUP_OBJECTS ((OBJECTS + 9) / 10) /* one untimed chain */
#define PASSES 5
#define REROUTE_CHAIN 8u
#define REROUTE_OBJ (256u << 10)
#define START_TIMEOUT_S 20.0

enum { A1, B1, A2, B2, C2, NODES };

typedef struct node {
    const char *id, *cluster, *replicas;
    int cpu; /* the only CPU it runs on, or -1 */
    char dir[160], ready[200], sock[200];
    pid_t pid;
    kvd_store_t *client;
} node_t;

typedef struct bench {
    char dir[64];
    pid_t etcd_pid;
    char etcd[64];
    node_t n[NODES];
    kvd_namespace_t ns;
    uint32_t next_key;
    int side_cpu[2]; /* the two ends of a transfer, or -1 */
} bench_t;

static char headlines[3][200];
static size_t num_headlines;

static const char *env_or(const char *k, const char *d)
{
    const char *v = getenv(k);
    return v != NULL && v[0] != '\0' ? v : d;
}

static int etcd_start(bench_t *b)
{
    int cport = free_port(), pport = free_port();
    char client[64], peer[64], cluster[96], data[96], log[96];
    snprintf(client, sizeof client, "http://127.0.0.1:%d", cport);
    snprintf(peer, sizeof peer, "http://127.0.0.1:%d", pport);
    snprintf(cluster, sizeof cluster, "b=%s", peer);
    snprintf(data, sizeof data, "%s/etcd", b->dir);
    snprintf(log, sizeof log, "%s/etcd.log", b->dir);
    snprintf(b->etcd, sizeof b->etcd, "cluster.etcd=127.0.0.1:%d", cport);
    char *argv[] = {(char *)env_or("ETCD", "etcd"),
                    "--name",
                    "b",
                    "--data-dir",
                    data,
                    "--listen-client-urls",
                    client,
                    "--advertise-client-urls",
                    client,
                    "--listen-peer-urls",
                    peer,
                    "--initial-advertise-peer-urls",
                    peer,
                    "--initial-cluster",
                    cluster,
                    "--log-level",
                    "warn",
                    "--logger",
                    "zap",
                    NULL};
    b->etcd_pid = child_spawn(argv, log);
    return b->etcd_pid < 0 ? -1 : 0;
}

static int node_start(bench_t *b, node_t *n, const char *bin)
{
    snprintf(n->dir, sizeof n->dir, "%s/%s-%s", b->dir, n->cluster, n->id);
    snprintf(n->ready, sizeof n->ready, "%s/ready", n->dir);
    snprintf(n->sock, sizeof n->sock, "%s/d.sock", n->dir);
    if (mkdir(n->dir, 0700) != 0) {
        return -1;
    }
    char sock[240], id[64], cl[64], rep[64], log[220];
    snprintf(sock, sizeof sock, "server.unix_socket=%s", n->sock);
    snprintf(id, sizeof id, "server.node_id=%s", n->id);
    snprintf(cl, sizeof cl, "cluster.name=%s", n->cluster);
    snprintf(rep, sizeof rep, "cluster.replicas=%s", n->replicas);
    snprintf(log, sizeof log, "%s/daemon.log", n->dir);
    char *argv[] = {(char *)bin,
                    "--set",
                    sock,
                    "--set",
                    id,
                    "--set",
                    b->etcd,
                    "--set",
                    cl,
                    "--set",
                    rep,
                    "--set",
                    "cluster.lease_ttl=2s",
                    "--set",
                    "cluster.timeout=5s",
                    "--set",
                    "store.arena_size=768m",
                    "--set",
                    "store.arena_prefault=true",
                    "--set",
                    "server.metrics_address=127.0.0.1:0",
                    "--set",
                    "log.level=warn",
                    "--ready-file",
                    n->ready,
                    NULL};
    n->pid = child_spawn_on(n->cpu, argv, log);
    return n->pid < 0 ? -1 : 0;
}

static int node_client(node_t *n)
{
    kvd_config_t *cfg = NULL;
    char addr[220], err[256] = "";
    snprintf(addr, sizeof addr, "unix:%s", n->sock);
    if (kvd_config_create(&cfg) != KVD_OK ||
        kvd_config_set(cfg, "store.mode", "daemon") != KVD_OK ||
        kvd_config_set(cfg, "store.address", addr) != KVD_OK ||
        kvd_config_set(cfg, "store.timeout", "10s") != KVD_OK ||
        kvd_store_open(cfg, &n->client, err, sizeof err) != KVD_OK) {
        fprintf(stderr, "bench_cluster: client of %s: %s\n", n->id, err);
        kvd_config_destroy(cfg);
        return -1;
    }
    kvd_config_destroy(cfg);
    return 0;
}

/* What backs node `n`'s arena, from its /metrics. */
static const char *arena_pages(const node_t *n)
{
    static const char *const kinds[] = {"plain", "thp", "hugetlb"};
    for (size_t i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "kvdepot_arena_pages{backing=\"%s\"}",
                 kinds[i]);
        if (kvd_metric_read(n->ready, name) == 1) {
            return kinds[i];
        }
    }
    return "unknown";
}

/* Waits until `n` sees `want` nodes in its cluster. */
static int wait_view(const node_t *n, double want)
{
    for (double end = now_s() + START_TIMEOUT_S; now_s() < end;) {
        if (kvd_metric_read(n->ready, "kvdepot_cluster_nodes") == want) {
            return 0;
        }
        usleep(20000);
    }
    fprintf(stderr, "bench_cluster: %s does not see %.0f nodes\n", n->id, want);
    return -1;
}

/* A new key whose one home (R=1) among {a, b} is `home`. */
static kvd_block_hash_t key_homed(bench_t *b, const char *home,
                                  const char *other)
{
    kvd_member_t m[2];
    memset(m, 0, sizeof m);
    snprintf(m[0].node_id, sizeof m[0].node_id, "%s", home);
    snprintf(m[1].node_id, sizeof m[1].node_id, "%s", other);
    m[0].capacity_bytes = m[1].capacity_bytes = 1; /* equal nodes */
    for (;;) {
        kvd_store_key_t k;
        k.ns = b->ns;
        memset(&k.hash, 0, sizeof k.hash);
        uint32_t id = b->next_key++;
        memcpy(k.hash.bytes, &id, sizeof id);
        k.hash.bytes[31] = 0xb0;
        size_t idx = 9;
        if (kvd_placement_homes(&k, m, 2, 1, &idx) == 1 && idx == 0) {
            return k.hash;
        }
    }
}

static void fill(uint8_t *p, size_t n, const kvd_block_hash_t *h)
{
    uint64_t x = 0;
    memcpy(&x, h->bytes, sizeof x);
    x |= 1;
    for (size_t i = 0; i + 8 <= n; i += 8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        memcpy(p + i, &x, 8);
    }
}

static int save_batch(bench_t *b, kvd_store_t *s, const kvd_block_hash_t *h,
                      size_t n, size_t size)
{
    kvd_store_reservation_t *r = calloc(n, sizeof *r);
    kvd_store_key_t *keys = calloc(n, sizeof *keys);
    int rc = r != NULL && keys != NULL &&
                     kvd_store_reserve(s, &b->ns, h, n, size, 0, r) == KVD_OK
                 ? 0
                 : -1;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        uint8_t *dst = r[i].status == KVD_OK
                           ? kvd_store_arena_ptr(s, r[i].arena_offset, size)
                           : NULL;
        if (dst == NULL) {
            fprintf(stderr, "bench_cluster: reserve: %s\n",
                    kvd_status_str(r[i].status));
            rc = -1;
            break;
        }
        fill(dst, size, &h[i]);
        keys[i].ns = b->ns;
        keys[i].hash = h[i];
    }
    if (rc == 0 && kvd_store_commit(s, keys, n, NULL) != KVD_OK) {
        rc = -1;
    }
    free(r);
    free(keys);
    return rc;
}

/* Saves `n` objects in reservations of at most CHAIN_LEN (an engine's
 * step; one reservation of everything would pass the daemon's per-caller
 * cap, server.max_reserved_bytes: a quarter of the arena). */
static int save(bench_t *b, kvd_store_t *s, const kvd_block_hash_t *h, size_t n,
                size_t size)
{
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < n; i += CHAIN_LEN) {
        size_t k = n - i < CHAIN_LEN ? n - i : CHAIN_LEN;
        rc = save_batch(b, s, h + i, k, size);
    }
    return rc;
}

static void drop(bench_t *b, kvd_store_t *s, const kvd_block_hash_t *h,
                 size_t n)
{
    kvd_store_key_t *keys = calloc(n, sizeof *keys);
    for (size_t i = 0; keys != NULL && i < n; i++) {
        keys[i].ns = b->ns;
        keys[i].hash = h[i];
    }
    if (keys != NULL) {
        (void)kvd_store_delete(s, keys, n, NULL);
    }
    free(keys);
}

/* Looks `n` keys up through `s`; returns how many matched, checking the
 * bytes when `check`. */
static size_t lookup(bench_t *b, kvd_store_t *s, const kvd_block_hash_t *h,
                     size_t n, size_t size, bool check)
{
    kvd_store_lease_t l[CHAIN_LEN];
    size_t m = 0;
    if (n > CHAIN_LEN || kvd_store_lookup(s, &b->ns, h, n, l, &m) != KVD_OK) {
        return 0;
    }
    uint8_t *want = check ? malloc(size) : NULL;
    for (size_t i = 0; want != NULL && i < m; i++) {
        fill(want, size, &h[i]);
        const void *got = kvd_store_arena_ptr(s, l[i].arena_offset, size);
        if (l[i].tier != KVD_STORE_TIER_HOST || got == NULL ||
            memcmp(got, want, size) != 0) {
            fprintf(stderr, "bench_cluster: wrong bytes for key %zu\n", i);
            m = i;
            break;
        }
    }
    free(want);
    if (m > 0) {
        (void)kvd_store_release(s, l, m);
    }
    return m;
}

/* ucx_perftest server and client on 127.0.0.1, with endpoints in UCX's
 * error-handling mode (-e, as kvdepot's: a dead peer fails its transfers)
 * when `err_handling`; MiB/s, or -1. */
static double perftest(const bench_t *b, const char *test, bool err_handling)
{
    const char *bin = env_or("UCX_PERFTEST", "ucx_perftest");
    char port[16], size[16], log_s[96], log_c[96];
    snprintf(port, sizeof port, "%d", free_port());
    snprintf(size, sizeof size, "%u", OBJ);
    snprintf(log_s, sizeof log_s, "%s/perftest-server.log", b->dir);
    snprintf(log_c, sizeof log_c, "%s/perftest-client.log", b->dir);
    char *sv[] = {(char *)bin, "-p", port, err_handling ? "-e" : NULL, NULL};
    pid_t server = child_spawn_on(b->side_cpu[0], sv, log_s);
    usleep(300000);
    char *cv[] = {(char *)bin,
                  "127.0.0.1",
                  "-p",
                  port,
                  "-t",
                  (char *)test,
                  "-s",
                  size,
                  "-n",
                  "256",
                  err_handling ? "-e" : NULL,
                  NULL};
    pid_t client = child_spawn_on(b->side_cpu[1], cv, log_c);
    int st = 0;
    if (client < 0 || waitpid(client, &st, 0) != client || !WIFEXITED(st) ||
        WEXITSTATUS(st) != 0) {
        fprintf(stderr, "bench_cluster: ucx_perftest %s failed (see %s)\n",
                test, log_c);
        if (server > 0) {
            kill(server, SIGKILL);
            waitpid(server, NULL, 0);
        }
        return -1;
    }
    (void)waitpid(server, NULL, 0);
    FILE *f = fopen(log_c, "r");
    char line[512];
    double bw = -1;
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        double v[8];
        if (sscanf(line, "Final: %lf %lf %lf %lf %lf %lf %lf %lf", &v[0], &v[1],
                   &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) == 8) {
            bw = v[5]; /* overall bandwidth, MB/s (2^20) */
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    return bw;
}

/* memcpy of the same bytes, from and to memory the caches do not hold
 * (OBJECTS * OBJ each way); MiB/s. */
static double memcpy_pass(void)
{
    size_t n = (size_t)OBJECTS * OBJ;
    uint8_t *src = malloc(n), *dst = malloc(n);
    double mibs = -1;
    if (src != NULL && dst != NULL) {
        memset(src, 1, n);
        memset(dst, 2, n);
        double t0 = now_s();
        for (size_t off = 0; off < n; off += OBJ) {
            memcpy(dst + off, src + off, OBJ);
        }
        mibs = (double)n / (now_s() - t0) / (1u << 20);
        if (dst[n - 1] != 1) {
            mibs = -1;
        }
    }
    free(src);
    free(dst);
    return mibs;
}

/* One fetch pass: OBJECTS objects saved through A, then looked up through
 * B in chains of CHAIN_LEN, timed; MiB/s, or -1. Before the timed
 * lookups, WARMUP_OBJECTS others are looked up through B untimed (their
 * rate goes to `*warm`), as ucx_perftest warms its connection up with a
 * tenth of its iterations before it starts its clock: the daemons have
 * been idle since the last pass (the peer's runs), and the first transfer
 * after idle pays for it (TCP restarts its window after an idle period;
 * threads, caches and page tables wake cold). */
static double fetch_pass(bench_t *b, double *warm)
{
    static kvd_block_hash_t h[OBJECTS + WARMUP_OBJECTS];
    for (size_t i = 0; i < OBJECTS + WARMUP_OBJECTS; i++) {
        h[i] = key_homed(b, "node-a", "node-b");
    }
    if (save(b, b->n[A1].client, h, OBJECTS + WARMUP_OBJECTS, OBJ) != 0) {
        return -1;
    }
    double w0 = now_s();
    size_t warmed =
        lookup(b, b->n[B1].client, h + OBJECTS, WARMUP_OBJECTS, OBJ, false);
    *warm = (double)WARMUP_OBJECTS * OBJ / (now_s() - w0) / (1u << 20);
    double t0 = now_s();
    size_t got = 0;
    for (size_t c = 0; c < OBJECTS; c += CHAIN_LEN) {
        got += lookup(b, b->n[B1].client, h + c, CHAIN_LEN, OBJ, false);
    }
    double secs = now_s() - t0;
    size_t checked = 0;
    for (size_t c = 0; c < OBJECTS; c += CHAIN_LEN) {
        checked += lookup(b, b->n[B1].client, h + c, CHAIN_LEN, OBJ, true);
    }
    drop(b, b->n[B1].client, h, OBJECTS + WARMUP_OBJECTS);
    drop(b, b->n[A1].client, h, OBJECTS + WARMUP_OBJECTS);
    if (got != OBJECTS || checked != OBJECTS || warmed != WARMUP_OBJECTS) {
        fprintf(stderr,
                "bench_cluster: fetched %zu, checked %zu of %u (warm-up: "
                "%zu of %u)\n",
                got, checked, OBJECTS, warmed, WARMUP_OBJECTS);
        return -1;
    }
    return (double)OBJECTS * OBJ / secs / (1u << 20);
}

static int reroute(bench_t *b, double *reroute_ms, double *leave_ms)
{
    kvd_block_hash_t h[REROUTE_CHAIN];
    for (size_t i = 0; i < REROUTE_CHAIN; i++) {
        memset(&h[i], 0, sizeof h[i]);
        h[i].bytes[0] = 0xee;
        h[i].bytes[1] = (uint8_t)i;
    }
    if (save(b, b->n[A2].client, h, REROUTE_CHAIN, REROUTE_OBJ) != 0) {
        return -1;
    }
    /* The pushes to the homes (each key has one or two besides A). */
    double pulls = 0;
    for (double end = now_s() + 10; now_s() < end; usleep(20000)) {
        pulls = kvd_metric_read(b->n[B2].ready, "kvdepot_cluster_pulls_total") +
                kvd_metric_read(b->n[C2].ready, "kvdepot_cluster_pulls_total");
        if (pulls >= REROUTE_CHAIN) {
            break;
        }
    }
    if (kill(b->n[A2].pid, SIGKILL) != 0) {
        return -1;
    }
    double t0 = now_s();
    (void)waitpid(b->n[A2].pid, NULL, 0);
    b->n[A2].pid = -1;
    *reroute_ms = -1;
    for (double end = t0 + 30; now_s() < end;) {
        if (lookup(b, b->n[C2].client, h, REROUTE_CHAIN, REROUTE_OBJ, true) ==
            REROUTE_CHAIN) {
            *reroute_ms = (now_s() - t0) * 1e3;
            break;
        }
    }
    *leave_ms = -1;
    for (double end = t0 + 30; now_s() < end; usleep(10000)) {
        if (kvd_metric_read(b->n[C2].ready, "kvdepot_cluster_nodes") == 2) {
            *leave_ms = (now_s() - t0) * 1e3;
            break;
        }
    }
    double rerouted = kvd_metric_read(
        b->n[C2].ready, "kvdepot_cluster_remote_lookup_errors_total");
    printf("reroute: %.0f pulls before the kill; C's batches to dead nodes: "
           "%.0f\n",
           pulls, rerouted);
    return *reroute_ms >= 0 ? 0 : -1;
}

static int rm_cb(const char *p, const struct stat *sb, int flag,
                 struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* Pins the two ends of a transfer (node A and node B of the fetch, the
 * ucx_perftest server and client) to a CPU of their own each, as on two
 * hosts: left to the scheduler, a thread woken by a message from the other
 * end tends to be placed on the CPU of the thread that woke it, and then
 * both polling progress threads share one CPU. ucx_perftest's processes
 * never sleep, so they stay apart anyway. */
static void pick_side_cpus(bench_t *b)
{
    b->side_cpu[0] = b->side_cpu[1] = -1;
    cpu_set_t mine;
    if (sched_getaffinity(0, sizeof mine, &mine) == 0 &&
        CPU_COUNT(&mine) >= 2) {
        for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++) {
            if (CPU_ISSET(c, &mine)) {
                b->side_cpu[k++] = c;
            }
        }
    }
}

/* etcd and the five daemons, each ready and seeing its cluster, then a
 * client on each. */
static int cluster_start(bench_t *b)
{
    static const struct {
        const char *id, *cluster, *replicas;
    } spec[NODES] = {{"node-a", "fetch", "1"},
                     {"node-b", "fetch", "1"},
                     {"node-a", "reroute", "2"},
                     {"node-b", "reroute", "2"},
                     {"node-c", "reroute", "2"}};
    const char *bin = env_or("KVDEPOTD", KVD_BENCH_KVDEPOTD);
    /* Every child starts before this process opens a client: gRPC does not
     * survive fork() (ucx_perftest, started later, only execs). */
    if (etcd_start(b) != 0) {
        return -1;
    }
    for (int i = 0; i < NODES; i++) {
        b->n[i].id = spec[i].id;
        b->n[i].cluster = spec[i].cluster;
        b->n[i].replicas = spec[i].replicas;
        b->n[i].cpu = i == A1 ? b->side_cpu[0] : i == B1 ? b->side_cpu[1] : -1;
        if (node_start(b, &b->n[i], bin) != 0) {
            return -1;
        }
    }
    for (int i = 0; i < NODES; i++) {
        if (daemon_wait_ready(b->n[i].pid, b->n[i].ready, START_TIMEOUT_S) !=
            0) {
            b->n[i].pid = -1;
            return -1;
        }
    }
    if (wait_view(&b->n[A1], 2) != 0 || wait_view(&b->n[B1], 2) != 0 ||
        wait_view(&b->n[A2], 3) != 0 || wait_view(&b->n[C2], 3) != 0) {
        return -1;
    }
    for (int i = 0; i < NODES; i++) {
        if (node_client(&b->n[i]) != 0) {
            return -1;
        }
    }
    return 0;
}

/* PASSES fetch passes, each against ucx_perftest and memcpy measured in
 * the same pass; prints them and their medians, and adds the headlines. */
static int fetch_passes(bench_t *b)
{
    double warm[PASSES];
    (void)fetch_pass(b, &warm[0]); /* endpoints, arena pages */
    double kvd[PASSES], am[PASSES], am_e[PASSES], put[PASSES], mc[PASSES];
    double ratio[PASSES], ratio_e[PASSES];
    for (int p = 0; p < PASSES; p++) {
        am[p] = perftest(b, "ucp_am_bw", false);
        kvd[p] = fetch_pass(b, &warm[p]);
        am_e[p] = perftest(b, "ucp_am_bw", true);
        put[p] = perftest(b, "ucp_put_bw", false);
        mc[p] = memcpy_pass();
        if (am[p] <= 0 || kvd[p] <= 0 || am_e[p] <= 0 || put[p] <= 0 ||
            mc[p] <= 0) {
            return -1;
        }
        ratio[p] = kvd[p] / am[p];
        ratio_e[p] = kvd[p] / am_e[p];
        printf("pass %d: kvdepot fetch %.0f MiB/s (its untimed warm-up %.0f), "
               "ucx_perftest am_bw %.0f MiB/s (with -e %.0f), put_bw %.0f "
               "MiB/s, memcpy %.0f MiB/s, ratio %.2f (%.2f to -e)\n",
               p + 1, kvd[p], warm[p], am[p], am_e[p], put[p], mc[p], ratio[p],
               ratio_e[p]);
    }
    printf("fetch: kvdepot %.0f MiB/s (the first lookup after idle, "
           "untimed warm-up of %u objects: %.0f MiB/s), ucp_am_bw %.0f MiB/s "
           "(error handling -e: %.0f MiB/s), ucp_put_bw %.0f MiB/s, one "
           "memcpy of the same bytes %.0f MiB/s (medians)\n",
           median(kvd, PASSES), WARMUP_OBJECTS, median(warm, PASSES),
           median(am, PASSES), median(am_e, PASSES), median(put, PASSES),
           median(mc, PASSES));
    snprintf(headlines[num_headlines++], sizeof headlines[0],
             "BENCH cluster: fetch_vs_ucx_am_bw = %.3g (target >= 0.8)",
             median(ratio, PASSES));
    snprintf(headlines[num_headlines++], sizeof headlines[0],
             "BENCH cluster: fetch_vs_ucx_am_bw_err_handling = %.3g (target "
             ">= 0.8)",
             median(ratio_e, PASSES));
    return 0;
}

int main(void)
{
    bench_prog = "bench_cluster";
    static bench_t b;
    setenv("UCX_NET_DEVICES", env_or("UCX_NET_DEVICES", "lo"), 1);
    setenv("UCX_TLS", env_or("UCX_TLS", "tcp"), 1);
    snprintf(b.dir, sizeof b.dir, "/tmp/kvd_bench_cluster_XXXXXX");
    if (mkdtemp(b.dir) == NULL) {
        perror("bench_cluster: mkdtemp");
        return 1;
    }
    memset(b.ns.bytes, 0x42, sizeof b.ns.bytes);
    int rc = 1;
    pick_side_cpus(&b);
    if (cluster_start(&b) != 0) {
        goto out;
    }

    printf("bench_cluster: %u objects of %u KiB, chains of %u, %d passes; "
           "UCX_TLS=%s UCX_NET_DEVICES=%s; arenas on %s pages; the two "
           "ends on CPUs %d and %d\n",
           OBJECTS, OBJ >> 10, CHAIN_LEN, PASSES, getenv("UCX_TLS"),
           getenv("UCX_NET_DEVICES"), arena_pages(&b.n[A1]), b.side_cpu[0],
           b.side_cpu[1]);
    if (fetch_passes(&b) != 0) {
        goto out;
    }
    double reroute_ms = -1, leave_ms = -1;
    if (reroute(&b, &reroute_ms, &leave_ms) != 0) {
        goto out;
    }
    printf("reroute: first full lookup through C %.1f ms after SIGKILL of A; "
           "A left C's view after %.0f ms (lease TTL 2 s)\n",
           reroute_ms, leave_ms);
    snprintf(headlines[num_headlines++], sizeof headlines[0],
             "BENCH cluster: sigkill_to_rerouted_lookup_ms = %.3g (target <= "
             "1000)",
             reroute_ms);
    rc = 0;
out:
    for (int i = 0; i < NODES; i++) {
        kvd_store_close(b.n[i].client);
    }
    for (int i = 0; i < NODES; i++) {
        if (b.n[i].pid > 0 && child_stop(b.n[i].pid) != 0) {
            fprintf(stderr, "bench_cluster: %s/%s did not stop cleanly\n",
                    b.n[i].cluster, b.n[i].id);
            rc = 1;
        }
    }
    if (b.etcd_pid > 0) {
        kill(b.etcd_pid, SIGKILL);
        waitpid(b.etcd_pid, NULL, 0);
    }
    if (rc == 0) {
        (void)nftw(b.dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    } else {
        fprintf(stderr, "bench_cluster: logs kept in %s\n", b.dir);
    }
    for (size_t i = 0; i < num_headlines; i++) {
        printf("%s\n", headlines[i]);
    }
    return rc;
}
