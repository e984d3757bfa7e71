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
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <microhttpd.h>

#include "common/config_int.h"
#include "common/log_int.h"
#include "cluster/membership.h"
#include "cluster/remote.h"
#include "store/arena.h"
#include "server/rpc_int.h"
#include "server/server_int.h"

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

static void tier(mbuf_t *b, const char *name, const kvd_store_tier_stats_t *t)
{
    mb(b, "kvdepot_tier_capacity_bytes{tier=\"%s\"} %llu\n", name,
       (unsigned long long)t->capacity_bytes);
    mb(b, "kvdepot_tier_bytes{tier=\"%s\"} %llu\n", name,
       (unsigned long long)t->bytes);
    mb(b, "kvdepot_tier_objects{tier=\"%s\"} %llu\n", name,
       (unsigned long long)t->objects);
    mb(b, "kvdepot_tier_hits_total{tier=\"%s\"} %llu\n", name,
       (unsigned long long)t->hits);
    mb(b, "kvdepot_tier_misses_total{tier=\"%s\"} %llu\n", name,
       (unsigned long long)t->misses);
    mb(b, "kvdepot_tier_evictions_total{tier=\"%s\"} %llu\n", name,
       (unsigned long long)t->evictions);
    mb(b, "kvdepot_tier_read_bytes_total{tier=\"%s\"} %llu\n", name,
       (unsigned long long)t->bytes_read);
    mb(b, "kvdepot_tier_written_bytes_total{tier=\"%s\"} %llu\n", name,
       (unsigned long long)t->bytes_written);
    mb(b, "kvdepot_tier_errors_total{tier=\"%s\"} %llu\n", name,
       (unsigned long long)t->errors);
}

/* The cluster's view and data plane (nothing when the daemon is alone). */
static void metrics_cluster(mbuf_t *b, kvd_server_t *server)
{
    kvd_membership_stats_t cs;
    kvd_remote_stats_t rs;
    if (!kvd_server_cluster(server, &cs, &rs)) {
        return;
    }
    mb(b,
       "# HELP kvdepot_cluster_stale 1 while etcd is unreachable and the "
       "view of the other nodes may be out of date.\n"
       "# TYPE kvdepot_cluster_stale gauge\nkvdepot_cluster_stale %d\n"
       "# TYPE kvdepot_cluster_registered gauge\n"
       "kvdepot_cluster_registered %d\n"
       "# TYPE kvdepot_cluster_nodes gauge\nkvdepot_cluster_nodes %zu\n"
       "# TYPE kvdepot_cluster_registrations_total counter\n"
       "kvdepot_cluster_registrations_total %llu\n"
       "# TYPE kvdepot_cluster_ignored_total counter\n"
       "kvdepot_cluster_ignored_total %llu\n",
       cs.stale ? 1 : 0, cs.registered ? 1 : 0, cs.num_nodes,
       (unsigned long long)cs.reconnects, (unsigned long long)cs.ignored);
    const struct {
        const char *name, *help;
        uint64_t v;
    } c[] = {
        {"remote_lookups", "Lookups that asked other nodes.", rs.lookups},
        {"remote_hits", "Keys found on other nodes and fetched here.",
         rs.remote_hits},
        {"remote_lookup_errors",
         "Batches to other nodes that failed (then asked elsewhere).",
         rs.lookup_errors},
        {"pushes", "Saved keys offered to their home nodes.", rs.pushes},
        {"push_errors",
         "Keys whose offer to a home failed (each retry counts).",
         rs.push_errors},
        {"pulls", "Offered keys fetched here.", rs.pulls},
        {"pull_errors",
         "Offered keys that could not be fetched (each retry counts).",
         rs.pull_errors},
        {"retries",
         "Failed pushes and pulls queued again (at most 3 times, after "
         "0.5, 1 and 2 s).",
         rs.retries},
        {"queue_dropped",
         "Pushes or pulls given up: the queue (or the retry list) was "
         "full, or every retry failed.",
         rs.dropped},
        {"repairs",
         "Repair scans started (a node joined, the view fresh again).",
         rs.repairs},
        {"repair_offers", "Objects offered to their homes by repairs.",
         rs.repair_offers},
        {"suspect_skips", "Keys not asked of a node whose last call failed.",
         rs.suspect_skips},
        {"fetched_bytes", "Bytes fetched from other nodes.",
         rs.peer.bytes_fetched},
        {"served_bytes", "Bytes sent to other nodes.", rs.peer.bytes_served},
        {"checksum_errors", "Objects that arrived corrupt (not cached).",
         rs.peer.checksum_errors},
        {"peer_errors", "Peer endpoints failed by the transport.",
         rs.peer.peer_errors},
        {"timeouts", "Peer calls that reached their deadline.",
         rs.peer.timeouts},
        {"auth_rejected", "Peer messages with the wrong cluster token.",
         rs.peer.auth_rejected},
        {"malformed", "Peer messages that did not decode.", rs.peer.malformed},
        {"stalled", "Peer endpoints failed for moving nothing for stall_ms.",
         rs.peer.stalled},
        {"address_refused",
         "FETCHes refused for naming a reply address no member published.",
         rs.peer.address_refused},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        mb(b,
           "# HELP kvdepot_cluster_%s_total %s\n"
           "# TYPE kvdepot_cluster_%s_total counter\n"
           "kvdepot_cluster_%s_total %llu\n",
           c[i].name, c[i].help, c[i].name, c[i].name,
           (unsigned long long)c[i].v);
    }
}

/* Uptime, the store's tiers and arenas, its leases and error counters. */
static void metrics_store(mbuf_t *b, kvd_server_t *server,
                          const kvd_store_stats_t *st,
                          const kvd_service_stats_t *sv)
{
    mb(b,
       "# HELP kvdepot_uptime_seconds Time since the daemon started.\n"
       "# TYPE kvdepot_uptime_seconds gauge\n"
       "kvdepot_uptime_seconds %.3f\n",
       (double)sv->uptime_ms / 1000.0);
    mb(b, "# HELP kvdepot_tier_capacity_bytes Configured size per tier.\n"
          "# TYPE kvdepot_tier_capacity_bytes gauge\n"
          "# TYPE kvdepot_tier_bytes gauge\n"
          "# TYPE kvdepot_tier_objects gauge\n"
          "# TYPE kvdepot_tier_hits_total counter\n"
          "# TYPE kvdepot_tier_misses_total counter\n"
          "# TYPE kvdepot_tier_evictions_total counter\n"
          "# TYPE kvdepot_tier_read_bytes_total counter\n"
          "# TYPE kvdepot_tier_written_bytes_total counter\n"
          "# TYPE kvdepot_tier_errors_total counter\n");
    tier(b, "host", &st->host);
    tier(b, "disk", &st->disk);
    kvd_server_arena_t arenas[KVD_ARENA_PARTS_MAX + 1];
    size_t na = kvd_server_arenas(server, arenas, KVD_ARENA_PARTS_MAX + 1);
    mb(b, "# HELP kvdepot_arena_bytes Size of each host arena: the main one "
          "and each tenant's (server.tenant_arenas).\n"
          "# TYPE kvdepot_arena_bytes gauge\n"
          "# HELP kvdepot_arena_free_bytes Bytes of an arena in chunks no "
          "object size holds (0: its saves evict).\n"
          "# TYPE kvdepot_arena_free_bytes gauge\n");
    for (size_t i = 0; i < na; i++) {
        mb(b, "kvdepot_arena_bytes{arena=\"%s\"} %llu\n", arenas[i].name,
           (unsigned long long)arenas[i].bytes);
        mb(b, "kvdepot_arena_free_bytes{arena=\"%s\"} %llu\n", arenas[i].name,
           (unsigned long long)arenas[i].free_bytes);
    }
    kvd_arena_backing_t pages = kvd_server_arena_backing(server);
    mb(b,
       "# HELP kvdepot_arena_pages What backs the arena's memory, 1 for the "
       "one in use: 4 KiB pages (plain), shared memory on 2 MiB transparent "
       "huge pages (thp), a hugetlb pool (hugetlb).\n"
       "# TYPE kvdepot_arena_pages gauge\n"
       "kvdepot_arena_pages{backing=\"plain\"} %d\n"
       "kvdepot_arena_pages{backing=\"thp\"} %d\n"
       "kvdepot_arena_pages{backing=\"hugetlb\"} %d\n",
       pages == KVD_ARENA_BACKING_PLAIN, pages == KVD_ARENA_BACKING_THP,
       pages == KVD_ARENA_BACKING_HUGETLB);
    mb(b, "# TYPE kvdepot_store_leases gauge\nkvdepot_store_leases %llu\n",
       (unsigned long long)st->leases);
    mb(b,
       "# TYPE kvdepot_checksum_errors_total counter\n"
       "kvdepot_checksum_errors_total %llu\n",
       (unsigned long long)st->checksum_errors);
    mb(b,
       "# TYPE kvdepot_dropped_writes_total counter\n"
       "kvdepot_dropped_writes_total %llu\n",
       (unsigned long long)st->dropped_writes);
}

/* The service's leases, reservations and errors by status. */
static void metrics_service(mbuf_t *b, const kvd_service_stats_t *sv)
{
    mb(b,
       "# HELP kvdepot_leases Lease ids held by clients now.\n"
       "# TYPE kvdepot_leases gauge\nkvdepot_leases %llu\n"
       "# TYPE kvdepot_leased_blocks gauge\nkvdepot_leased_blocks %llu\n"
       "# TYPE kvdepot_reservations gauge\nkvdepot_reservations %llu\n"
       "# TYPE kvdepot_leases_expired_total counter\n"
       "kvdepot_leases_expired_total %llu\n"
       "# HELP kvdepot_leases_refused_total Blocks not leased: the tenant "
       "held server.tenant_max_leased already.\n"
       "# TYPE kvdepot_leases_refused_total counter\n"
       "kvdepot_leases_refused_total %llu\n"
       "# TYPE kvdepot_reservations_expired_total counter\n"
       "kvdepot_reservations_expired_total %llu\n"
       "# TYPE kvdepot_commit_checksum_errors_total counter\n"
       "kvdepot_commit_checksum_errors_total %llu\n",
       (unsigned long long)sv->leases, (unsigned long long)sv->leased_blocks,
       (unsigned long long)sv->reservations,
       (unsigned long long)sv->leases_expired,
       (unsigned long long)sv->leases_refused,
       (unsigned long long)sv->reservations_expired,
       (unsigned long long)sv->commit_checksum_errors);
    mb(b, "# HELP kvdepot_errors_total Failed or refused calls by status.\n"
          "# TYPE kvdepot_errors_total counter\n");
    for (int k = 1; k < KVD_SERVICE_ERROR_KINDS; k++) {
        if (sv->errors_by_status[k] == 0) {
            continue;
        }
        const char *name = kvd_status_str((kvd_status_t)-k);
        size_t nl = strcspn(name, ":");
        mb(b, "kvdepot_errors_total{status=\"%.*s\"} %llu\n", (int)nl, name,
           (unsigned long long)sv->errors_by_status[k]);
    }
}

/* Latency histograms and errors per method. */
static void metrics_methods(mbuf_t *b, const kvd_service_stats_t *sv)
{
    mb(b, "# HELP kvdepot_rpc_latency_seconds Service time per method.\n"
          "# TYPE kvdepot_rpc_latency_seconds histogram\n");
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
    mb(b, "# TYPE kvdepot_rpc_errors_total counter\n");
    for (int m = 0; m < KVD_RPC_COUNT; m++) {
        mb(b, "kvdepot_rpc_errors_total{method=\"%s\"} %llu\n",
           kvd_rpc_method_name((kvd_rpc_method_t)m),
           (unsigned long long)sv->methods[m].errors);
    }
}

char *kvd_metrics_render(kvd_server_t *server)
{
    kvd_store_stats_t st;
    kvd_service_stats_t sv;
    kvd_server_collect(server, &st, &sv);
    mbuf_t b = {0};
    mb(&b,
       "# HELP kvdepot_up 1 while the daemon takes calls.\n"
       "# TYPE kvdepot_up gauge\nkvdepot_up %d\n",
       kvd_server_ready(server) ? 1 : 0);
    metrics_cluster(&b, server);
    metrics_store(&b, server, &st, &sv);
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
