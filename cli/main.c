/*
 * `kvdepot`: the command-line tool. This file only dispatches: the first
 * argument names a subcommand, looked up in one table, and everything
 * after it belongs to that subcommand. Adding a subcommand is one row here
 * and one file beside this one (contract in cli_int.h).
 *
 * `kvdepot`, `kvdepot --help` and `kvdepot help` print the command list;
 * `kvdepot help <command>` and `kvdepot <command> --help` print that
 * command's help. A missing or unknown subcommand prints the list on
 * stderr and exits 2, like any other command-line error.
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli_int.h"
#include "kvdepot/common.h"

static const kvd_cli_command_t kvd_cli_commands[] = {
    {"codec-eval", "error and size of each KV codec on your own K/V (.npy)",
     kvd_cli_codec_eval_run, kvd_cli_codec_eval_usage},
    {"ping", "is kvdepotd up: one round trip, its version and node id",
     kvd_cli_ping_run, kvd_cli_ping_usage},
    {"stats", "a running kvdepotd's figures per tier (--json)",
     kvd_cli_stats_run, kvd_cli_stats_usage},
    {"put", "store a file as one object in kvdepotd", kvd_cli_put_run,
     kvd_cli_put_usage},
    {"get", "load one object from kvdepotd into a file", kvd_cli_get_run,
     kvd_cli_get_usage},
    {"ls", "what kvdepotd stores, per namespace and tenant", kvd_cli_ls_run,
     kvd_cli_ls_usage},
    {"lookup", "why no hit: hash a prompt's tokens and look the blocks up",
     kvd_cli_lookup_run, kvd_cli_lookup_usage},
    {"evict", "remove objects or a whole namespace from kvdepotd",
     kvd_cli_evict_run, kvd_cli_evict_usage},
    {"drain", "refuse new saves before a restart (on|off)", kvd_cli_drain_run,
     kvd_cli_drain_usage},
    {"cluster", "the daemon's view of its cluster: cluster nodes",
     kvd_cli_cluster_run, kvd_cli_cluster_usage},
    {"config", "the settings a running kvdepotd started with",
     kvd_cli_config_run, kvd_cli_config_usage},
    {"bench", "put/get load on kvdepotd from N clients", kvd_cli_bench_run,
     kvd_cli_bench_usage},
};

#define KVD_CLI_NUM_COMMANDS                                                   \
    (sizeof(kvd_cli_commands) / sizeof(kvd_cli_commands[0]))

static void kvd_cli_usage(FILE *out)
{
    fprintf(out, "usage: kvdepot <command> [options]\n"
                 "       kvdepot help <command>\n"
                 "       kvdepot --version\n"
                 "\n"
                 "commands:\n");
    for (size_t i = 0; i < KVD_CLI_NUM_COMMANDS; i++) {
        fprintf(out, "  %-12s %s\n", kvd_cli_commands[i].name,
                kvd_cli_commands[i].summary);
    }
    fprintf(out, "  %-12s %s\n", "help", "show the help of a command");
    fprintf(out, "\nExit status: 0 success, 1 the command failed, 2 bad "
                 "command line.\n");
}

static const kvd_cli_command_t *kvd_cli_command_find(const char *name)
{
    for (size_t i = 0; i < KVD_CLI_NUM_COMMANDS; i++) {
        if (strcmp(kvd_cli_commands[i].name, name) == 0) {
            return &kvd_cli_commands[i];
        }
    }
    return NULL;
}

static int kvd_cli_help(int argc, char **argv)
{
    if (argc < 2) {
        kvd_cli_usage(stdout);
        return KVD_CLI_EXIT_OK;
    }
    const kvd_cli_command_t *cmd = kvd_cli_command_find(argv[1]);
    if (cmd == NULL || argc > 2) {
        fprintf(stderr, "kvdepot help: %s '%s'\n\n",
                cmd == NULL ? "unknown command" : "unexpected argument",
                cmd == NULL ? argv[1] : argv[2]);
        kvd_cli_usage(stderr);
        return KVD_CLI_EXIT_USAGE;
    }
    cmd->usage(stdout);
    return KVD_CLI_EXIT_OK;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        kvd_cli_usage(stderr);
        return KVD_CLI_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
        kvd_cli_usage(stdout);
        return KVD_CLI_EXIT_OK;
    }
    if (strcmp(name, "--version") == 0) {
        printf("kvdepot %s\n", kvd_version());
        return KVD_CLI_EXIT_OK;
    }
    if (strcmp(name, "help") == 0) {
        return kvd_cli_help(argc - 1, argv + 1);
    }
    const kvd_cli_command_t *cmd = kvd_cli_command_find(name);
    if (cmd == NULL) {
        fprintf(stderr, "kvdepot: unknown command '%s'\n\n", name);
        kvd_cli_usage(stderr);
        return KVD_CLI_EXIT_USAGE;
    }
    return cmd->run(argc - 1, argv + 1);
}
