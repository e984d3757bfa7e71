/*
 * Internal contract between the `kvdepot` tool's dispatcher (main.c) and
 * its subcommands (one file each). A subcommand is a row of the table in
 * main.c: a name, a one-line summary, an entry point and a usage printer.
 *
 * Exit codes are the same for every subcommand: 0 success, 1 the work
 * failed (bad input file, I/O, out of memory), 2 the command line was
 * wrong (unknown option, bad value); the message goes to stderr prefixed
 * with "kvdepot <subcommand>: ".
 *
 * Threading: the tool is single-threaded, except `bench`, whose client
 * threads each use their own store (bench_cmd.c).
 */
#ifndef KVD_CLI_CLI_INT_H
#define KVD_CLI_CLI_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#define KVD_CLI_EXIT_OK 0
#define KVD_CLI_EXIT_FAILURE 1
#define KVD_CLI_EXIT_USAGE 2

typedef struct kvd_cli_command {
    const char *name;
    const char *summary;
    /* argv[0] is the subcommand's name; returns a KVD_CLI_EXIT_* code. */
    int (*run)(int argc, char **argv);
    /* Full help text, written to `out`. */
    void (*usage)(FILE *out);
} kvd_cli_command_t;

/* codec_eval.c: error and size of every codec on the user's vectors. */
int kvd_cli_codec_eval_run(int argc, char **argv);
void kvd_cli_codec_eval_usage(FILE *out);

/* daemon_cmds.c: a running kvdepotd's figures, and one object in or out. */
int kvd_cli_stats_run(int argc, char **argv);
void kvd_cli_stats_usage(FILE *out);
int kvd_cli_put_run(int argc, char **argv);
void kvd_cli_put_usage(FILE *out);
int kvd_cli_get_run(int argc, char **argv);
void kvd_cli_get_usage(FILE *out);

/* admin_cmds.c: a daemon's contents, removing objects, draining. */
int kvd_cli_ls_run(int argc, char **argv);
void kvd_cli_ls_usage(FILE *out);
int kvd_cli_evict_run(int argc, char **argv);
void kvd_cli_evict_usage(FILE *out);
int kvd_cli_drain_run(int argc, char **argv);
void kvd_cli_drain_usage(FILE *out);
int kvd_cli_config_run(int argc, char **argv);
void kvd_cli_config_usage(FILE *out);

/* cluster_cmds.c: the daemon's view of its cluster. */
int kvd_cli_cluster_run(int argc, char **argv);
void kvd_cli_cluster_usage(FILE *out);

/* probe_cmds.c: is the daemon up, and why a prompt finds no hit. */
int kvd_cli_ping_run(int argc, char **argv);
void kvd_cli_ping_usage(FILE *out);
int kvd_cli_lookup_run(int argc, char **argv);
void kvd_cli_lookup_usage(FILE *out);

/* lookup_text.c: the token ids of a text, by `$KVDEPOT_PYTHON -m
 * kvdepot.tokens --tokenizer NAME`: a malloc'd JSON list of at most max_out
 * bytes, or NULL after printing why. special: the tokenizer's special
 * tokens (BOS) as an engine adds them; chat: the text as one user message
 * through the tokenizer's chat template. */
char *kvd_cli_tokenize(const char *tokenizer, const char *text, size_t len,
                       bool special, bool chat, size_t max_out);

/* bench_cmd.c: put/get load on a kvdepotd from N client threads. */
int kvd_cli_bench_run(int argc, char **argv);
void kvd_cli_bench_usage(FILE *out);

#endif /* KVD_CLI_CLI_INT_H */
