/*
 * kvdepotd's HTTP endpoint (libmicrohttpd, its own polling thread):
 *   /metrics  Prometheus text exposition format 0.0.4;
 *   /healthz  200 while the process serves HTTP at all;
 *   /readyz   200 when the daemon takes calls, 503 otherwise.
 * Anything else is 404; any method but GET/HEAD is 405.
 *
 * The listener shares the process's file descriptors with the hand-off
 * socket and gRPC, so it is bounded: server.metrics_max_connections
 * connections at once (MHD closes one more as it accepts it), 5 s of
 * idleness, 16 KiB for a request's line and headers (MHD answers a longer
 * one with 414 or 431), and poll rather than select so a descriptor above
 * 1023 still works (not epoll: libmicrohttpd 0.9.75's epoll loop never
 * accepted again once the connection limit had been reached). Without the
 * bound, 1,000 idle connections took every descriptor of a daemon with the
 * usual soft limit of 1,024 and new engines could no longer hand off or call.
 * MHD's own messages go through the rate-limited log.
 *
 * The /metrics body follows the Prometheus conventions a scraper and
 * promtool check: every family has one HELP and one TYPE line and all its
 * samples right after them (a family is written whole by one call below),
 * counters end in _total, units are base units (_bytes, _seconds). Every
 * series a dashboard or alert may name exists from the start: error
 * counters by status are written at 0, the cluster's at 0 on a daemon that
 * is alone. Label values come from the code and the settings (tiers,
 * methods, statuses, arena and tenant names), never from a request, so the
 * number of series is bounded by the configuration (docs/daemon.md,
 * "Metrics"). The family list there is checked against this output by
 * tests/python/test_daemon_metrics.py.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "cluster/membership.h"
#include "cluster/remote.h"
#include "store/arena.h"
#include "server/rpc_int.h"
#include "server/server_int.h"

/* The git commit CMake found at configure time (server/CMakeLists.txt). */
#ifndef KVD_BUILD_COMMIT
#define KVD_BUILD_COMMIT "unknown"
#endif

struct kvd_metrics {
    struct MHD_Daemon *d;
    kvd_server_t *server;
};

/* A growing text buffer; on allocation failure it stays failed. */
typedef struct mbuf {
    char *p;
    size_t len, cap;
    bool failed;
} mbuf_t;

__attribute__((format(printf, 2, 3))) static void mb(mbuf_t *b, const char *fmt,
                                                     ...)
{
    if (b->failed) {
        return;
    }
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL,
                          b->p ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if (b->p != NULL && (size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 8192;
        while (cap < b->len + (size_t)n + 1) {
            cap *= 2;
        }
        char *p = realloc(b->p, cap);
        if (p == NULL) {
            b->failed = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

/* One family's HELP and TYPE lines. Each family below is written whole by
 * one call site, header first, so every family appears once, contiguous. */
static void family(mbuf_t *b, const char *name, const char *type,
                   const char *help)
{
    mb(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A family of one sample without labels. */
static void single(mbuf_t *b, const char *name, const char *type,
                   const char *help, uint64_t v)
{
    family(b, name, type, help);
    mb(b, "%s %llu\n", name, (unsigned long long)v);
}

/* The process's start as Unix time, the way Prometheus's client libraries
 * give process_start_time_seconds: the start time of /proc/self/stat
 * (clock ticks after boot, field 22) plus the boot time of /proc/stat.
 * Read once; 0 when either is unreadable. */
static double metrics_start_time;

static void metrics_start_time_read(void)
{
    char buf[1024];
    unsigned long long ticks = 0, btime = 0;
    FILE *f = fopen("/proc/self/stat", "re");
    size_t n = f != NULL ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f != NULL) {
        fclose(f);
    }
    buf[n] = '\0';
    /* The command name may hold spaces and parentheses: count from the
     * last ')'; the state is field 3, so the start time is the 20th. */
    char *p = strrchr(buf, ')');
    for (int field = 2; p != NULL && field < 22; field++) {
        p = strchr(p + 1, ' ');
    }
    if (p == NULL || sscanf(p + 1, "%llu", &ticks) != 1) {
        return;
    }
    char line[256];
    f = fopen("/proc/stat", "re");
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "btime %llu", &btime) == 1) {
            break;
        }
    }
    if (f != NULL) {
        fclose(f);
    }
    long hz = sysconf(_SC_CLK_TCK);
    if (btime != 0 && hz > 0) {
        metrics_start_time = (double)btime + (double)ticks / (double)hz;
    }
}

/* The build, the process and the daemon's state. */
static void metrics_process(mbuf_t *b, kvd_server_t *server,
                            const kvd_service_stats_t *sv)
{
    family(b, "kvdepot_build_info", "gauge",
           "Always 1: the libkvdepot version and the git commit the daemon "
           "was built from (unknown: built outside a git checkout).");
    mb(b, "kvdepot_build_info{version=\"%s\",commit=\"%s\"} 1\n", kvd_version(),
       KVD_BUILD_COMMIT);
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    (void)pthread_once(&once, metrics_start_time_read);
    double start = metrics_start_time;
    if (start == 0) { /* no /proc: the service started with the process */
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        start = (double)now.tv_sec + (double)now.tv_nsec / 1e9 -
                (double)sv->uptime_ms / 1000.0;
    }
    family(b, "process_start_time_seconds", "gauge",
           "Start time of the process since the Unix epoch.");
    mb(b, "process_start_time_seconds %.3f\n", start);
    single(b, "kvdepot_up", "gauge",
           "1 while the daemon takes calls (0: starting, stopping or "
           "draining).",
           kvd_server_ready(server) ? 1 : 0);
    family(b, "kvdepot_uptime_seconds", "gauge",
           "Time since the daemon started.");
    mb(b, "kvdepot_uptime_seconds %.3f\n", (double)sv->uptime_ms / 1000.0);
}

/* The cluster's view and data plane; zeros when the daemon is alone
 * (cluster.etcd empty), so that every series exists on every daemon. */
static void metrics_cluster(mbuf_t *b, kvd_server_t *server)
{
    kvd_membership_stats_t cs;
    kvd_remote_stats_t rs;
    memset(&cs, 0, sizeof cs);
    memset(&rs, 0, sizeof rs);
    if (!kvd_server_cluster(server, &cs, &rs)) {
        memset(&cs, 0, sizeof cs);
        memset(&rs, 0, sizeof rs);
    }
    single(b, "kvdepot_cluster_stale", "gauge",
           "1 while etcd is unreachable and the view of the other nodes may "
           "be out of date.",
           cs.stale ? 1 : 0);
    single(b, "kvdepot_cluster_registered", "gauge",
           "1 while this node's registration is in etcd (0: not in a "
           "cluster, or not registered yet).",
           cs.registered ? 1 : 0);
    single(b, "kvdepot_cluster_nodes", "gauge",
           "Nodes in this daemon's view of the cluster, itself included (0: "
           "not in a cluster).",
           cs.num_nodes);
    single(b, "kvdepot_cluster_registrations_total", "counter",
           "Times this node registered in etcd again (its lease was lost).",
           cs.reconnects);
    single(b, "kvdepot_cluster_ignored_total", "counter",
           "Registrations of other nodes that did not decode or fit (left out "
           "of the view).",
           cs.ignored);
    const struct {
        const char *name, *help;
        uint64_t v;
    } c[] = {
        {"kvdepot_cluster_remote_lookups_total",
         "Lookups that asked other nodes.", rs.lookups},
        {"kvdepot_cluster_remote_hits_total",
         "Keys found on other nodes and fetched here.", rs.remote_hits},
        {"kvdepot_cluster_remote_lookup_errors_total",
         "Batches to other nodes that failed (then asked elsewhere).",
         rs.lookup_errors},
        {"kvdepot_cluster_pushes_total",
         "Saved keys offered to their home nodes.", rs.pushes},
        {"kvdepot_cluster_push_errors_total",
         "Keys whose offer to a home failed (each retry counts).",
         rs.push_errors},
        {"kvdepot_cluster_pulls_total", "Offered keys fetched here.", rs.pulls},
        {"kvdepot_cluster_pull_errors_total",
         "Offered keys that could not be fetched (each retry counts).",
         rs.pull_errors},
        {"kvdepot_cluster_retries_total",
         "Failed pushes and pulls queued again (at most 3 times, after "
         "0.5, 1 and 2 s).",
         rs.retries},
        {"kvdepot_cluster_queue_dropped_total",
         "Pushes or pulls given up: the queue (or the retry list) was "
         "full, or every retry failed.",
         rs.dropped},
        {"kvdepot_cluster_repairs_total",
         "Repair scans started (a node joined, the view fresh again).",
         rs.repairs},
        {"kvdepot_cluster_repair_offers_total",
         "Objects offered to their homes by repairs.", rs.repair_offers},
        {"kvdepot_cluster_suspect_skips_total",
         "Keys not asked of a node whose last call failed.", rs.suspect_skips},
        {"kvdepot_cluster_fetched_bytes_total",
         "Bytes fetched from other nodes.", rs.peer.bytes_fetched},
        {"kvdepot_cluster_served_bytes_total", "Bytes sent to other nodes.",
         rs.peer.bytes_served},
        {"kvdepot_cluster_checksum_errors_total",
         "Objects that arrived corrupt (not cached).", rs.peer.checksum_errors},
        {"kvdepot_cluster_peer_errors_total",
         "Peer endpoints failed by the transport.", rs.peer.peer_errors},
        {"kvdepot_cluster_timeouts_total",
         "Peer calls that reached their deadline.", rs.peer.timeouts},
        {"kvdepot_cluster_auth_rejected_total",
         "Peer messages with the wrong cluster token.", rs.peer.auth_rejected},
        {"kvdepot_cluster_malformed_total",
         "Peer messages that did not decode.", rs.peer.malformed},
        {"kvdepot_cluster_stalled_total",
         "Peer endpoints failed for moving nothing for stall_ms.",
         rs.peer.stalled},
        {"kvdepot_cluster_address_refused_total",
         "FETCHes refused for naming a reply address no member published.",
         rs.peer.address_refused},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        single(b, c[i].name, "counter", c[i].help, c[i].v);
    }
}

/* The store's figures per tier, one family at a time. */
static void metrics_tiers(mbuf_t *b, const kvd_store_stats_t *st)
{
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } f[] = {
        {"kvdepot_tier_capacity_bytes", "gauge", "Configured size per tier.",
         offsetof(kvd_store_tier_stats_t, capacity_bytes)},
        {"kvdepot_tier_bytes", "gauge",
         "Bytes of the objects each tier holds (reserved included).",
         offsetof(kvd_store_tier_stats_t, bytes)},
        {"kvdepot_tier_objects", "gauge", "Objects each tier holds.",
         offsetof(kvd_store_tier_stats_t, objects)},
        {"kvdepot_tier_hits_total", "counter",
         "Keys lookups matched in each tier.",
         offsetof(kvd_store_tier_stats_t, hits)},
        {"kvdepot_tier_misses_total", "counter",
         "Lookups whose matched prefix ended in this tier's turn (a host miss "
         "goes on to the disk tier).",
         offsetof(kvd_store_tier_stats_t, misses)},
        {"kvdepot_tier_evictions_total", "counter",
         "Objects evicted from each tier to make room.",
         offsetof(kvd_store_tier_stats_t, evictions)},
        {"kvdepot_tier_read_bytes_total", "counter",
         "Bytes read out of each tier by moves between the tiers (host: "
         "written to NVMe; disk: promoted into the arena).",
         offsetof(kvd_store_tier_stats_t, bytes_read)},
        {"kvdepot_tier_written_bytes_total", "counter",
         "Bytes written into each tier by moves between the tiers (host: "
         "promoted from NVMe; disk: written from the arena).",
         offsetof(kvd_store_tier_stats_t, bytes_written)},
        {"kvdepot_tier_errors_total", "counter",
         "I/O and checksum errors per tier.",
         offsetof(kvd_store_tier_stats_t, errors)},
    };
    const struct {
        const char *name;
        const kvd_store_tier_stats_t *t;
    } tiers[] = {{"host", &st->host}, {"disk", &st->disk}};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        family(b, f[i].name, f[i].type, f[i].help);
        for (size_t k = 0; k < 2; k++) {
            uint64_t v;
            memcpy(&v, (const char *)tiers[k].t + f[i].off, sizeof v);
            mb(b, "%s{tier=\"%s\"} %llu\n", f[i].name, tiers[k].name,
               (unsigned long long)v);
        }
    }
}

/* Each arena's size and free bytes, and what backs the memory. */
static void metrics_arenas(mbuf_t *b, kvd_server_t *server)
{
    kvd_server_arena_t arenas[KVD_ARENA_PARTS_MAX + 1];
    size_t na = kvd_server_arenas(server, arenas, KVD_ARENA_PARTS_MAX + 1);
    family(b, "kvdepot_arena_bytes", "gauge",
           "Size of each host arena: the main one and each tenant's "
           "(server.tenant_arenas).");
    for (size_t i = 0; i < na; i++) {
        mb(b, "kvdepot_arena_bytes{arena=\"%s\"} %llu\n", arenas[i].name,
           (unsigned long long)arenas[i].bytes);
    }
    family(b, "kvdepot_arena_free_bytes", "gauge",
           "Bytes of an arena in chunks no object size holds (0: its saves "
           "evict).");
    for (size_t i = 0; i < na; i++) {
        mb(b, "kvdepot_arena_free_bytes{arena=\"%s\"} %llu\n", arenas[i].name,
           (unsigned long long)arenas[i].free_bytes);
    }
    kvd_arena_backing_t pages = kvd_server_arena_backing(server);
    family(b, "kvdepot_arena_pages", "gauge",
           "What backs the arena's memory, 1 for the one in use: 4 KiB pages "
           "(plain), shared memory on 2 MiB transparent huge pages (thp), a "
           "hugetlb pool (hugetlb).");
    mb(b,
       "kvdepot_arena_pages{backing=\"plain\"} %d\n"
       "kvdepot_arena_pages{backing=\"thp\"} %d\n"
       "kvdepot_arena_pages{backing=\"hugetlb\"} %d\n",
       pages == KVD_ARENA_BACKING_PLAIN, pages == KVD_ARENA_BACKING_THP,
       pages == KVD_ARENA_BACKING_HUGETLB);
}

/* The store's leases, write queue and error counters. */
static void metrics_store(mbuf_t *b, const kvd_store_stats_t *st)
{
    single(b, "kvdepot_store_leases", "gauge",
           "Store leases held now, both tiers (the service's, flushes' and "
           "the cluster's).",
           st->leases);
    single(b, "kvdepot_store_writes_pending", "gauge",
           "NVMe writes queued or in flight.", st->writes_pending);
    single(b, "kvdepot_admission_rejects_total", "counter",
           "Objects evicted from the arena without being written to NVMe "
           "(the admission filter).",
           st->admission_rejects);
    single(b, "kvdepot_checksum_errors_total", "counter",
           "Stored objects whose bytes failed their checksum when read (not "
           "served).",
           st->checksum_errors);
    single(b, "kvdepot_dropped_writes_total", "counter",
           "NVMe write-backs lost to errors or lack of space (those objects "
           "stay in the arena only).",
           st->dropped_writes);
}

/* Usage per tenant of the settings, and "(none)" for objects saved with
 * no tenant. At most KVD_SERVER_TENANTS_MAX tenants, in practice the
 * handful configured: label values come from the settings only, never
 * from requests, so a client cannot add series. */
static void metrics_tenants(mbuf_t *b, kvd_server_t *server)
{
    kvd_server_tenant_t *t = malloc(KVD_SERVER_TENANTS_MAX * sizeof *t);
    if (t == NULL) {
        b->failed = true;
        return;
    }
    size_t n = kvd_server_tenants(server, t, KVD_SERVER_TENANTS_MAX);
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } f[] = {
        {"kvdepot_tenant_objects", "gauge", "Objects each tenant's saves hold.",
         offsetof(kvd_store_tier_stats_t, objects)},
        {"kvdepot_tenant_bytes", "gauge",
         "Bytes of the objects each tenant's saves hold (reserved included).",
         offsetof(kvd_store_tier_stats_t, bytes)},
        {"kvdepot_tenant_evictions_total", "counter",
         "Objects of each tenant evicted to make room.",
         offsetof(kvd_store_tier_stats_t, evictions)},
    };
    static const char *const tier[2] = {"host", "disk"};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        family(b, f[i].name, f[i].type, f[i].help);
        for (size_t k = 0; k < n; k++) {
            const kvd_store_tier_stats_t *ts[2] = {&t[k].usage.host,
                                                   &t[k].usage.disk};
            for (int j = 0; j < 2; j++) {
                uint64_t v;
                memcpy(&v, (const char *)ts[j] + f[i].off, sizeof v);
                mb(b, "%s{tenant=\"%s\",tier=\"%s\"} %llu\n", f[i].name,
                   t[k].name, tier[j], (unsigned long long)v);
            }
        }
    }
    for (int hit = 1; hit >= 0; hit--) {
        const char *name =
            hit ? "kvdepot_tenant_hits_total" : "kvdepot_tenant_misses_total";
        family(b, name, "counter",
               hit ? "Keys the lookups of callers bound to each tenant matched "
                     "per tier (not counted for (none))."
                   : "Lookups of callers bound to each tenant whose matched "
                     "prefix ended in this tier's turn (not counted for "
                     "(none)).");
        for (size_t k = 0; k < n; k++) {
            for (int j = 0; j < 2 && t[k].has_lookups; j++) {
                mb(b, "%s{tenant=\"%s\",tier=\"%s\"} %llu\n", name, t[k].name,
                   tier[j],
                   (unsigned long long)(hit ? t[k].hits[j] : t[k].misses[j]));
            }
        }
    }
    family(b, "kvdepot_tenant_capacity_bytes", "gauge",
           "Host bytes each tenant may fill: its arena (its own or the main "
           "one), capped by its quota.");
    for (size_t k = 0; k < n; k++) {
        mb(b, "kvdepot_tenant_capacity_bytes{tenant=\"%s\"} %llu\n", t[k].name,
           (unsigned long long)t[k].usage.host.capacity_bytes);
    }
    free(t);
}

/* The service's leases, reservations and errors by status (every status,
 * 0 until it happens, so that rates and alerts have a series to read). */
static void metrics_service(mbuf_t *b, const kvd_service_stats_t *sv)
{
    single(b, "kvdepot_leases", "gauge", "Lease ids held by clients now.",
           sv->leases);
    single(b, "kvdepot_leased_blocks", "gauge",
           "Blocks under the lease ids clients hold now.", sv->leased_blocks);
    single(b, "kvdepot_reservations", "gauge",
           "Reservation ids open now (slots reserved for saves not yet "
           "committed).",
           sv->reservations);
    single(b, "kvdepot_sessions", "gauge",
           "Arena hand-off sessions open now (local clients that map the "
           "arena).",
           sv->sessions);
    single(b, "kvdepot_quarantined_bytes", "gauge",
           "Object bytes of expired leases and reservations kept for the "
           "session that made them (docs/reliability.md).",
           sv->quarantined_bytes);
    single(b, "kvdepot_leases_expired_total", "counter",
           "Lease ids reclaimed at their deadline (server.lease_ttl).",
           sv->leases_expired);
    single(b, "kvdepot_leases_refused_total", "counter",
           "Blocks not leased: the tenant held server.tenant_max_leased "
           "already.",
           sv->leases_refused);
    single(b, "kvdepot_reservations_expired_total", "counter",
           "Reservation ids aborted at their deadline "
           "(server.reservation_ttl).",
           sv->reservations_expired);
    single(b, "kvdepot_commit_checksum_errors_total", "counter",
           "Commits whose bytes did not match the checksum the client sent.",
           sv->commit_checksum_errors);
    family(b, "kvdepot_errors_total", "counter",
           "Failed or refused calls by status.");
    for (int k = 1; k < KVD_SERVICE_ERROR_KINDS; k++) {
        const char *name = kvd_status_str((kvd_status_t)-k);
        if (strncmp(name, "KVD_ERR_UNKNOWN", 15) == 0) {
            continue; /* no such status */
        }
        size_t nl = strcspn(name, ":");
        mb(b, "kvdepot_errors_total{status=\"%.*s\"} %llu\n", (int)nl, name,
           (unsigned long long)sv->errors_by_status[k]);
    }
}

/* Latency histograms and errors per method. */
static void metrics_methods(mbuf_t *b, const kvd_service_stats_t *sv)
{
    family(b, "kvdepot_rpc_latency_seconds", "histogram",
           "Service time per method, from the request's arrival at the "
           "service to its response.");
    for (int m = 0; m < KVD_RPC_COUNT; m++) {
        const kvd_service_method_stats_t *ms = &sv->methods[m];
        const char *name = kvd_rpc_method_name((kvd_rpc_method_t)m);
        for (int i = 0; i < KVD_SERVICE_LATENCY_BUCKETS; i++) {
            uint64_t le = kvd_service_latency_bounds_us[i];
            if (le == UINT64_MAX) {
                mb(b,
                   "kvdepot_rpc_latency_seconds_bucket{method=\"%s\",le=\"+"
                   "Inf\"} %llu\n",
                   name, (unsigned long long)ms->latency_buckets[i]);
            } else {
                mb(b,
                   "kvdepot_rpc_latency_seconds_bucket{method=\"%s\",le=\""
                   "%g\"} %llu\n",
                   name, (double)le / 1e6,
                   (unsigned long long)ms->latency_buckets[i]);
            }
        }
        mb(b, "kvdepot_rpc_latency_seconds_sum{method=\"%s\"} %.6f\n", name,
           (double)ms->latency_sum_us / 1e6);
        mb(b, "kvdepot_rpc_latency_seconds_count{method=\"%s\"} %llu\n", name,
           (unsigned long long)ms->calls);
    }
    family(b, "kvdepot_rpc_errors_total", "counter",
           "Calls per method that failed (any status but OK).");
    for (int m = 0; m < KVD_RPC_COUNT; m++) {
        mb(b, "kvdepot_rpc_errors_total{method=\"%s\"} %llu\n",
           kvd_rpc_method_name((kvd_rpc_method_t)m),
           (unsigned long long)sv->methods[m].errors);
    }
}

/* Usage of the namespaces holding the most bytes (KVD_SERVER_NS_TOP),
 * from a scan of the store refreshed at most every 30 s. Namespace labels
 * come from clients, so only a bounded top list becomes series. */
static void metrics_namespaces(mbuf_t *b, kvd_server_t *server)
{
    kvd_service_ns_usage_t top[KVD_SERVER_NS_TOP];
    size_t all = 0;
    uint64_t age_ms = 0;
    size_t n = kvd_server_namespaces(server, top, &all, &age_ms);
    single(b, "kvdepot_namespaces", "gauge",
           "Namespaces holding objects (counted up to 4096), from the scan "
           "behind kvdepot_namespace_*.",
           all);
    family(b, "kvdepot_namespace_scan_age_seconds", "gauge",
           "Age of the store scan behind kvdepot_namespace_* (made at most "
           "every 30 s).");
    mb(b, "kvdepot_namespace_scan_age_seconds %.3f\n", (double)age_ms / 1e3);
    char hex[2 * KVD_NAMESPACE_BYTES + 1];
    char tenant[80];
    family(b, "kvdepot_namespace_objects", "gauge",
           "Objects per tier of the 20 namespaces holding the most bytes "
           "(namespace: the stored digest, a tenant's own copy for its "
           "objects; tenant: the settings' name, (none) without one).");
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            family(b, "kvdepot_namespace_bytes", "gauge",
                   "Bytes of the objects of the 20 namespaces holding the "
                   "most, both tiers.");
        }
        for (size_t i = 0; i < n; i++) {
            for (size_t k = 0; k < KVD_NAMESPACE_BYTES; k++) {
                snprintf(hex + 2 * k, 3, "%02x", top[i].ns.bytes[k]);
            }
            if (top[i].tenant_name != NULL && top[i].tenant_name[0] != '\0') {
                snprintf(tenant, sizeof tenant, "%s", top[i].tenant_name);
            } else if (top[i].tenant == 0) {
                snprintf(tenant, sizeof tenant, "(none)");
            } else {
                snprintf(tenant, sizeof tenant, "id %u", top[i].tenant);
            }
            if (pass == 0) {
                mb(b,
                   "kvdepot_namespace_objects{namespace=\"%s\",tenant=\"%s\","
                   "tier=\"host\"} %llu\n"
                   "kvdepot_namespace_objects{namespace=\"%s\",tenant=\"%s\","
                   "tier=\"disk\"} %llu\n",
                   hex, tenant, (unsigned long long)top[i].host_objects, hex,
                   tenant, (unsigned long long)top[i].disk_objects);
            } else {
                mb(b,
                   "kvdepot_namespace_bytes{namespace=\"%s\",tenant=\"%s\"} "
                   "%llu\n",
                   hex, tenant, (unsigned long long)top[i].bytes);
            }
        }
    }
}

char *kvd_metrics_render(kvd_server_t *server)
{
    kvd_store_stats_t st;
    kvd_service_stats_t sv;
    kvd_server_collect(server, &st, &sv);
    mbuf_t b = {0};
    metrics_process(&b, server, &sv);
    metrics_cluster(&b, server);
    metrics_tiers(&b, &st);
    metrics_arenas(&b, server);
    metrics_store(&b, &st);
    metrics_tenants(&b, server);
    metrics_namespaces(&b, server);
    metrics_service(&b, &sv);
    metrics_methods(&b, &sv);
    if (b.failed) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

static enum MHD_Result metrics_reply(struct MHD_Connection *conn, unsigned code,
                                     char *body, bool owned, const char *type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(body), body,
        owned ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (r == NULL) {
        if (owned) {
            free(body);
        }
        return MHD_NO;
    }
    (void)MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result metrics_handler(void *cls, struct MHD_Connection *conn,
                                       const char *url, const char *method,
                                       const char *version,
                                       const char *upload_data,
                                       size_t *upload_data_size, void **state)
{
    (void)version;
    (void)upload_data;
    (void)upload_data_size;
    (void)state;
    kvd_metrics_t *m = cls;
    static const char text[] = "text/plain; charset=utf-8";
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        return metrics_reply(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                             (char *)"method not allowed\n", false, text);
    }
    if (strcmp(url, "/metrics") == 0) {
        char *body = kvd_metrics_render(m->server);
        if (body == NULL) {
            return metrics_reply(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
                                 (char *)"out of memory\n", false, text);
        }
        return metrics_reply(conn, MHD_HTTP_OK, body, true,
                             "text/plain; version=0.0.4; charset=utf-8");
    }
    if (strcmp(url, "/healthz") == 0) {
        return metrics_reply(conn, MHD_HTTP_OK, (char *)"ok\n", false, text);
    }
    if (strcmp(url, "/readyz") == 0) {
        bool ready = kvd_server_ready(m->server);
        /* A stale cluster view is reported, not failed: the daemon keeps
         * serving its local cache while etcd is unreachable. */
        kvd_membership_stats_t cs;
        bool stale = kvd_server_cluster(m->server, &cs, NULL) && cs.stale;
        const char *body = !ready  ? "not ready\n"
                           : stale ? "ready (cluster view stale: etcd "
                                     "unreachable)\n"
                                   : "ready\n";
        return metrics_reply(conn,
                             ready ? MHD_HTTP_OK : MHD_HTTP_SERVICE_UNAVAILABLE,
                             (char *)body, false, text);
    }
    return metrics_reply(conn, MHD_HTTP_NOT_FOUND, (char *)"not found\n", false,
                         text);
}

/* MHD's error messages (a refused connection, a request too large) at
 * warn, at most one a second. */
static void metrics_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[256];
    (void)vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = '\0';
    KVD_LOG_RATELIMITED(KVD_LOG_LEVEL_WARN, 1000, "kvdepotd: metrics: %s", msg);
}

kvd_status_t kvd_metrics_address_parse(const char *address,
                                       struct sockaddr_storage *sa_out,
                                       char *err, size_t err_len)
{
    char host[INET6_ADDRSTRLEN + 1];
    int port = 0;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *v4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)&ss;
    if (address == NULL ||
        !kvd_rpc_address_split(address, host, sizeof host, &port)) {
        kvd_config_err(err, err_len,
                       "server.metrics_address \"%s\": want IPv4:port or "
                       "[IPv6]:port (port 0-65535)",
                       address != NULL ? address : "");
        return KVD_ERR_INVALID;
    }
    if (address[0] != '[' && inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
    } else if (address[0] == '[' &&
               inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
    } else {
        /* No name lookup: the listener binds one numeric address. */
        kvd_config_err(err, err_len,
                       "server.metrics_address \"%s\": want a numeric "
                       "address (127.0.0.1:9464, [::1]:9464), not a name",
                       address);
        return KVD_ERR_INVALID;
    }
    *sa_out = ss;
    return KVD_OK;
}

kvd_status_t kvd_metrics_start(kvd_server_t *server, const char *address,
                               int max_connections, kvd_metrics_t **metrics_out,
                               int *port_out, char *err, size_t err_len)
{
    struct sockaddr_storage sa;
    kvd_status_t s = kvd_metrics_address_parse(address, &sa, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    bool v6 = sa.ss_family == AF_INET6;
    kvd_metrics_t *m = calloc(1, sizeof *m);
    if (m == NULL) {
        return KVD_ERR_NOMEM;
    }
    m->server = server;
    m->d = MHD_start_daemon(
        MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG |
            (v6 ? MHD_USE_IPv6 : 0),
        0, NULL, NULL, metrics_handler, m, MHD_OPTION_EXTERNAL_LOGGER,
        metrics_log, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, 5u, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)16384, MHD_OPTION_END);
    if (m->d == NULL) {
        kvd_config_err(err, err_len, "server.metrics_address %s: cannot listen",
                       address);
        free(m);
        return KVD_ERR_UNREACHABLE;
    }
    const union MHD_DaemonInfo *info =
        MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
    *port_out = info != NULL ? info->port : 0;
    KVD_LOG_INFO("kvdepotd: metrics on %s (port %d)", address, *port_out);
    *metrics_out = m;
    return KVD_OK;
}

void kvd_metrics_stop(kvd_metrics_t *m)
{
    if (m != NULL) {
        MHD_stop_daemon(m->d);
        free(m);
    }
}
