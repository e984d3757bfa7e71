/*
 * `kvdepot cluster nodes`: the kvdepot cluster as the daemon sees it
 * (Admin cluster_nodes, protocol revision 7): every live node etcd lists,
 * its advertised addresses, capacity and version, and whether the view may
 * be out of date (etcd not answering lately). A warning goes to stderr for
 * a stale view or a daemon whose own registration is missing; the exit is
 * still 0 (the command answered), so scripts read `stale` in --json.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "cli/daemon_int.h"
#include "client/client.h"

void kvd_cli_cluster_usage(FILE *out)
{
    fprintf(out,
            "usage: kvdepot cluster nodes [--json] [--address unix:PATH] "
            "[--timeout DURATION]\n\n"
            "The daemon's view of its kvdepot cluster (cluster.etcd): the "
            "live nodes,\ntheir gRPC address, whether they advertise UCX, "
            "capacity, version and\nprotocol revision. A view etcd has not "
            "refreshed lately is marked stale\n(with a warning on stderr): "
            "it may miss nodes that joined or list nodes\nthat left. A "
            "daemon without cluster.etcd says it runs alone.\n\n"
            "      --json             one JSON object\n" KVD_CLI_CONN_HELP);
}

static bool cluster_option(void *ctx, int ch, const char *arg)
{
    (void)arg;
    if (ch == 'j') {
        *(bool *)ctx = true;
        return true;
    }
    return false;
}

static void cluster_json(const kvd_cli_conn_t *conn,
                         const kvd_client_cluster_t *cl)
{
    printf("{\"address\":");
    kvd_cli_json_string(conn->address);
    printf(",\"clustered\":%s", cl->clustered ? "true" : "false");
    if (cl->clustered) {
        printf(",\"self\":");
        kvd_cli_json_string(cl->self);
        printf(",\"stale\":%s,\"registered\":%s,\"generation\":%" PRIu64
               ",\"reconnects\":%" PRIu64 ",\"truncated\":%s",
               cl->stale ? "true" : "false", cl->registered ? "true" : "false",
               cl->generation, cl->reconnects,
               cl->truncated ? "true" : "false");
    }
    printf(",\"nodes\":[");
    for (size_t i = 0; i < cl->num_nodes; i++) {
        const kvd_client_node_t *n = &cl->nodes[i];
        printf("%s{\"node_id\":", i == 0 ? "" : ",");
        kvd_cli_json_string(n->node_id);
        printf(",\"grpc_address\":");
        kvd_cli_json_string(n->grpc_address);
        printf(",\"ucx\":%s,\"capacity_bytes\":%" PRIu64 ",\"version\":",
               n->ucx ? "true" : "false", n->capacity_bytes);
        kvd_cli_json_string(n->version);
        printf(",\"protocol_revision\":%" PRIu32 "}", n->protocol_revision);
    }
    printf("]}\n");
}

static void cluster_text(const kvd_cli_conn_t *conn,
                         const kvd_client_cluster_t *cl)
{
    if (!cl->clustered) {
        printf("kvdepotd at %s runs alone (no cluster.etcd)\n", conn->address);
        return;
    }
    printf("kvdepotd at %s (node %s): %zu node(s), view generation %" PRIu64
           "%s\n\n",
           conn->address, cl->self, cl->num_nodes, cl->generation,
           cl->stale ? ", STALE" : "");
    printf("%-24s %-24s %-4s %12s  %-10s %s\n", "node", "grpc address", "ucx",
           "capacity", "version", "revision");
    for (size_t i = 0; i < cl->num_nodes; i++) {
        const kvd_client_node_t *n = &cl->nodes[i];
        char cap[32];
        kvd_cli_size_format(n->capacity_bytes, cap, sizeof cap);
        printf("%-24s %-24s %-4s %12s  %-10s %" PRIu32 "%s\n", n->node_id,
               n->grpc_address[0] != '\0' ? n->grpc_address : "-",
               n->ucx ? "yes" : "no", cap, n->version, n->protocol_revision,
               strcmp(n->node_id, cl->self) == 0 ? "  (this one)" : "");
    }
    if (cl->truncated) {
        printf("(more nodes than one reply lists)\n");
    }
}

static int cluster_nodes(kvd_cli_conn_t *conn, bool json)
{
    kvd_store_t *store = NULL;
    if (!kvd_cli_conn_open(conn, &store)) {
        return KVD_CLI_EXIT_FAILURE;
    }
    kvd_client_cluster_t cl;
    kvd_status_t st = kvd_client_cluster_nodes(kvd_client_of(store), &cl);
    int rc = KVD_CLI_EXIT_FAILURE;
    if (st == KVD_OK) {
        if (json) {
            cluster_json(conn, &cl);
        } else {
            cluster_text(conn, &cl);
        }
        if (cl.clustered && cl.stale) {
            fprintf(stderr,
                    "kvdepot cluster: warning: the view is stale: etcd has "
                    "not answered the daemon lately; nodes may have joined "
                    "or left since\n");
        }
        if (cl.clustered && !cl.registered) {
            fprintf(stderr,
                    "kvdepot cluster: warning: this daemon is not "
                    "registered in etcd: the other nodes do not see it\n");
        }
        rc = KVD_CLI_EXIT_OK;
    } else {
        fprintf(stderr, "kvdepot cluster: the daemon at %s: %s%s\n",
                conn->address, kvd_status_str(st),
                st == KVD_ERR_UNSUPPORTED ? " (a kvdepotd before protocol "
                                            "revision 7: it cannot list its "
                                            "cluster)"
                : st == KVD_ERR_AUTH      ? " (this needs an operator's "
                                            "credentials)"
                                          : "");
    }
    free(cl.nodes);
    kvd_store_close(store);
    return rc;
}

int kvd_cli_cluster_run(int argc, char **argv)
{
    static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
                                         {"help", no_argument, NULL, 'h'},
                                         KVD_CLI_CONN_LONGOPTS,
                                         {NULL, 0, NULL, 0}};
    if (argc < 2 || strcmp(argv[1], "nodes") != 0) {
        if (argc >= 2 &&
            (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
            kvd_cli_cluster_usage(stdout);
            return KVD_CLI_EXIT_OK;
        }
        fprintf(stderr, "kvdepot cluster: want a subcommand: nodes\n");
        kvd_cli_cluster_usage(stderr);
        return KVD_CLI_EXIT_USAGE;
    }
    kvd_cli_conn_t conn;
    bool json = false;
    if (!kvd_cli_conn_init(&conn, "cluster")) {
        return KVD_CLI_EXIT_FAILURE;
    }
    int rc = kvd_cli_conn_getopt(&conn, argc - 1, argv + 1, "h", opts,
                                 kvd_cli_cluster_usage, cluster_option, &json);
    if (rc < 0 && optind != argc - 1) {
        fprintf(stderr, "kvdepot cluster: unexpected argument %s\n",
                argv[optind + 1]);
        kvd_cli_cluster_usage(stderr);
        rc = KVD_CLI_EXIT_USAGE;
    }
    if (rc < 0) {
        rc = cluster_nodes(&conn, json);
    }
    kvd_cli_conn_cleanup(&conn);
    return rc;
}
