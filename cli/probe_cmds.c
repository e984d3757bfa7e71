/*
 * `kvdepot ping` and `kvdepot lookup`: the two questions an operator asks
 * a kvdepotd before looking further. `ping` times one Admin ping round
 * trip and prints the daemon's version and node id (is it up, is it the
 * one I think). `lookup` answers "why no hit?": it hashes a prompt's
 * tokens into block keys exactly as the leader does (kvd_block_hash_chain
 * from the root of a seed, extras {lora_name} on every block and
 * {lora_name, cache_salt} on the first, as vLLM keys them), looks the
 * chain up (kvd_store_lookup, the leases given back at once), and prints
 * how many leading blocks and tokens match and where each block is. Keys
 * past the first miss are looked up one by one, so the output also shows
 * blocks that are stored but unreachable behind a missing one (an evicted
 * first block, say). The tokens come as ids, or as text that the model's
 * tokenizer turns into ids (lookup_text.c).
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "cli/daemon_int.h"
#include "client/client.h"
#include "common/time_int.h"

/* At most this many tokens (a 1M-token prompt, 64k blocks of 16). */
#define LOOKUP_MAX_TOKENS (1u << 20)
#define LOOKUP_MAX_TEXT (16u << 20)
/* The most hashes one Lookup call carries (the protocol's bound). */
#define LOOKUP_MAX_BLOCKS 65536u

void kvd_cli_ping_usage(FILE *out)
{
    fprintf(out,
            "usage: kvdepot ping [--address unix:PATH] [--timeout DURATION]\n\n"
            "One Admin ping round trip to a running kvdepotd: prints "
            "\"ok <latency>\", the\ndaemon's version and node id. Exit 0 "
            "when it answered, 1 when not.\n\n" KVD_CLI_CONN_HELP);
}

int kvd_cli_ping_run(int argc, char **argv)
{
    static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                         KVD_CLI_CONN_LONGOPTS,
                                         {NULL, 0, NULL, 0}};
    kvd_cli_conn_t conn;
    if (!kvd_cli_conn_init(&conn, "ping")) {
        return KVD_CLI_EXIT_FAILURE;
    }
    int rc = kvd_cli_conn_getopt(&conn, argc, argv, "h", opts,
                                 kvd_cli_ping_usage, NULL, NULL);
    if (rc < 0 && optind != argc) {
        fprintf(stderr, "kvdepot ping: unexpected argument %s\n", argv[optind]);
        rc = KVD_CLI_EXIT_USAGE;
    }
    if (rc >= 0) {
        kvd_cli_conn_cleanup(&conn);
        return rc;
    }
    kvd_store_t *store = NULL;
    rc = KVD_CLI_EXIT_FAILURE;
    if (kvd_cli_conn_open(&conn, &store)) {
        char version[80] = "", node[160] = "";
        uint64_t t0 = kvd_time_now_ns();
        kvd_status_t st = kvd_client_ping(kvd_client_of(store), version,
                                          sizeof version, node, sizeof node);
        uint64_t ns = kvd_time_now_ns() - t0;
        if (st == KVD_OK) {
            printf("ok %.3f ms  kvdepotd %s, node %s, at %s\n",
                   (double)ns / 1e6, version[0] != '\0' ? version : "?",
                   node[0] != '\0' ? node : "(none)", conn.address);
            rc = KVD_CLI_EXIT_OK;
        } else {
            fprintf(stderr,
                    "kvdepot ping: the daemon at %s did not answer: "
                    "%s\n",
                    conn.address, kvd_status_str(st));
        }
    }
    kvd_store_close(store);
    kvd_cli_conn_cleanup(&conn);
    return rc;
}

void kvd_cli_lookup_usage(FILE *out)
{
    fprintf(
        out,
        "usage: kvdepot lookup --namespace HEX32 (--tokens 1,2,3 | "
        "--token-file FILE |\n"
        "                      --text TEXT --tokenizer NAME | --text-file "
        "FILE --tokenizer NAME)\n"
        "                      [--block-size N] [--lora NAME] [--salt "
        "S] [--seed TEXT]\n"
        "                      [--json | --evict | --pin | --unpin] "
        "[--address unix:PATH]\n"
        "                      [--timeout DURATION]\n\n"
        "Why no hit? Hashes the tokens into block keys as the leader "
        "does (vLLM's\nsha256_cbor chain), looks them up in a running "
        "kvdepotd, prints how many\nleading blocks and tokens match and "
        "the tier of every block (blocks stored\nbehind a missing one "
        "are shown too: a load never reaches them). The leases\nare "
        "given back at once; the daemon counts the lookups in its hits "
        "and misses.\n"
        "The namespace is in the engine's log at start: \"kvdepot: "
        "vLLM ..., namespace <hex>\".\n\n"
        "  -n, --namespace HEX32  the namespace digest (32 hex digits)\n"
        "      --tokens LIST      token ids, separated by commas or "
        "spaces\n"
        "      --token-file FILE  token ids in a file (commas, "
        "whitespace, [ ] allowed:\n"
        "                         a JSON list works)\n"
        "      --text TEXT, --text-file FILE  the prompt as text, turned "
        "into token ids\n"
        "                         by --tokenizer (runs $KVDEPOT_PYTHON, "
        "default python3,\n"
        "                         -m kvdepot.tokens: needs the kvdepot "
        "package and transformers)\n"
        "      --tokenizer NAME   the model's tokenizer: a Hugging Face "
        "name or directory\n"
        "      --chat             the text is one user message of a chat "
        "request (the\n"
        "                         tokenizer's chat template, as "
        "/v1/chat/completions)\n"
        "      --no-special-tokens  no BOS or other special tokens (a "
        "request with\n"
        "                         add_special_tokens false)\n"
        "      --block-size N     tokens per block, the engine's (default "
        "16)\n"
        "      --lora NAME        the LoRA adapter's name, if the "
        "request used one\n"
        "      --salt S           the request's cache_salt (first block "
        "only)\n"
        "      --seed TEXT        the chain's root seed (default "
        "\"" KVD_BLOCK_HASH_DEFAULT_SEED "\")\n"
        "      --json             one JSON object\n"
        "      --evict            then remove the prompt's stored blocks "
        "from the daemon\n"
        "                         (clear by prefix: the next request "
        "computes them)\n"
        "      --pin, --unpin     then keep the prompt's blocks in the "
        "daemon's arena\n"
        "                         (never evicted; bounded by "
        "store.pin_max_bytes),\n"
        "                         or let them go again\n" KVD_CLI_CONN_HELP);
}

typedef struct lookup_args {
    const char *ns_hex, *tokens, *token_file, *lora, *salt, *seed;
    const char *text, *text_file, *tokenizer;
    size_t block_size;
    bool json, chat, no_special;
    enum { LOOKUP_SHOW, LOOKUP_EVICT, LOOKUP_PIN, LOOKUP_UNPIN } act;
    int n_acts; /* --evict, --pin, --unpin given */
} lookup_args_t;

enum {
    LOOKUP_OPT_TOKENS = 256,
    LOOKUP_OPT_TOKEN_FILE,
    LOOKUP_OPT_BLOCK_SIZE,
    LOOKUP_OPT_LORA,
    LOOKUP_OPT_SALT,
    LOOKUP_OPT_SEED,
    LOOKUP_OPT_JSON,
    LOOKUP_OPT_EVICT,
    LOOKUP_OPT_PIN,
    LOOKUP_OPT_UNPIN,
    LOOKUP_OPT_TEXT,
    LOOKUP_OPT_TEXT_FILE,
    LOOKUP_OPT_TOKENIZER,
    LOOKUP_OPT_CHAT,
    LOOKUP_OPT_NO_SPECIAL
};

static bool lookup_option(void *ctx, int ch, const char *arg)
{
    lookup_args_t *a = ctx;
    switch (ch) {
    case 'n': a->ns_hex = arg; return true;
    case LOOKUP_OPT_TOKENS: a->tokens = arg; return true;
    case LOOKUP_OPT_TOKEN_FILE: a->token_file = arg; return true;
    case LOOKUP_OPT_LORA: a->lora = arg; return true;
    case LOOKUP_OPT_SALT: a->salt = arg; return true;
    case LOOKUP_OPT_SEED: a->seed = arg; return true;
    case LOOKUP_OPT_JSON: a->json = true; return true;
    case LOOKUP_OPT_TEXT: a->text = arg; return true;
    case LOOKUP_OPT_TEXT_FILE: a->text_file = arg; return true;
    case LOOKUP_OPT_TOKENIZER: a->tokenizer = arg; return true;
    case LOOKUP_OPT_CHAT: a->chat = true; return true;
    case LOOKUP_OPT_NO_SPECIAL: a->no_special = true; return true;
    case LOOKUP_OPT_EVICT:
        a->act = LOOKUP_EVICT;
        a->n_acts++;
        return true;
    case LOOKUP_OPT_PIN:
        a->act = LOOKUP_PIN;
        a->n_acts++;
        return true;
    case LOOKUP_OPT_UNPIN:
        a->act = LOOKUP_UNPIN;
        a->n_acts++;
        return true;
    case LOOKUP_OPT_BLOCK_SIZE: {
        char *end = NULL;
        errno = 0;
        unsigned long v = strtoul(arg, &end, 10);
        if (errno != 0 || end == arg || *end != '\0' || arg[0] == '-' ||
            v == 0 || v > 65536) {
            fprintf(stderr,
                    "kvdepot lookup: --block-size '%s': need an integer in "
                    "1..65536\n",
                    arg);
            return false;
        }
        a->block_size = v;
        return true;
    }
    default: fprintf(stderr, "kvdepot lookup: unknown option\n"); return false;
    }
}

/* Parses token ids separated by commas, whitespace or [ ] into a malloc'd
 * array. `what` names the source in messages. */
static bool tokens_parse(const char *text, const char *what, uint32_t **out,
                         size_t *n_out)
{
    size_t cap = 1024, n = 0;
    uint32_t *t = malloc(cap * sizeof *t);
    if (t == NULL) {
        fprintf(stderr, "kvdepot lookup: out of memory\n");
        return false;
    }
    for (const char *p = text; *p != '\0';) {
        if (strchr(", \t\r\n[]", *p) != NULL) {
            p++;
            continue;
        }
        char *end = NULL;
        errno = 0;
        unsigned long long v =
            *p >= '0' && *p <= '9' ? strtoull(p, &end, 10) : 0;
        if (end == NULL || end == p || errno != 0 || v > UINT32_MAX ||
            (*end != '\0' && strchr(", \t\r\n[]", *end) == NULL)) {
            size_t len = strcspn(p, ", \t\r\n[]");
            fprintf(stderr,
                    "kvdepot lookup: %s: '%.*s' (token %zu) is not a token "
                    "id (an integer in 0..4294967295)\n",
                    what, (int)(len > 40 ? 40 : len), p, n + 1);
            free(t);
            return false;
        }
        if (n == LOOKUP_MAX_TOKENS) {
            fprintf(stderr, "kvdepot lookup: %s: more than %u tokens\n", what,
                    LOOKUP_MAX_TOKENS);
            free(t);
            return false;
        }
        if (n == cap) {
            cap *= 2;
            uint32_t *g = realloc(t, cap * sizeof *t);
            if (g == NULL) {
                fprintf(stderr, "kvdepot lookup: out of memory\n");
                free(t);
                return false;
            }
            t = g;
        }
        t[n++] = (uint32_t)v;
        p = end;
    }
    *out = t;
    *n_out = n;
    return true;
}

/* Reads FILE whole (at most LOOKUP_MAX_TEXT bytes, no NUL) into a
 * malloc'd string; `opt` names the option in messages. */
static char *file_read(const char *opt, const char *path, size_t *len_out)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "kvdepot lookup: %s %s: %s\n", opt, path,
                strerror(errno));
        return NULL;
    }
    char *text = malloc(LOOKUP_MAX_TEXT + 1);
    size_t len = text != NULL ? fread(text, 1, LOOKUP_MAX_TEXT + 1, f) : 0;
    bool ok = false;
    if (text == NULL) {
        fprintf(stderr, "kvdepot lookup: out of memory\n");
    } else if (ferror(f)) {
        fprintf(stderr, "kvdepot lookup: %s %s: read error\n", opt, path);
    } else if (len > LOOKUP_MAX_TEXT) {
        fprintf(stderr, "kvdepot lookup: %s %s: larger than %u MiB\n", opt,
                path, LOOKUP_MAX_TEXT >> 20);
    } else if (memchr(text, '\0', len) != NULL) {
        fprintf(stderr, "kvdepot lookup: %s %s: not a text file\n", opt, path);
    } else {
        text[len] = '\0';
        *len_out = len;
        ok = true;
    }
    fclose(f);
    if (!ok) {
        free(text);
        return NULL;
    }
    return text;
}

/* The prompt's token ids from whichever of --tokens, --token-file, --text
 * and --text-file was given. Returns -1 on success, else the exit code. */
static int tokens_get(const lookup_args_t *a, uint32_t **tokens,
                      size_t *n_tokens)
{
    if (a->tokens != NULL) {
        return tokens_parse(a->tokens, "--tokens", tokens, n_tokens)
                   ? -1
                   : KVD_CLI_EXIT_USAGE;
    }
    size_t len = 0;
    char *text =
        a->text_file != NULL    ? file_read("--text-file", a->text_file, &len)
        : a->token_file != NULL ? file_read("--token-file", a->token_file, &len)
                                : strdup(a->text);
    if (text == NULL) {
        return KVD_CLI_EXIT_FAILURE;
    }
    if (a->text != NULL) {
        len = strlen(text);
    }
    bool ok;
    if (a->token_file != NULL) {
        ok = tokens_parse(text, a->token_file, tokens, n_tokens);
    } else {
        char *ids = kvd_cli_tokenize(a->tokenizer, text, len, !a->no_special,
                                     a->chat, LOOKUP_MAX_TEXT);
        ok = ids != NULL &&
             tokens_parse(ids, "the tokenizer's output", tokens, n_tokens);
        free(ids);
    }
    free(text);
    return ok ? -1 : KVD_CLI_EXIT_FAILURE;
}

static const char *tier_name(uint32_t tier)
{
    return tier == KVD_STORE_TIER_HOST   ? "host"
           : tier == KVD_STORE_TIER_DISK ? "disk"
                                         : "missing";
}

/* Looks the chain up, then each key past the first miss alone; tiers[i]
 * gets each block's tier (KVD_STORE_TIER_NONE: stored nowhere). Every
 * lease is given back before returning. */
static kvd_status_t lookup_tiers(kvd_store_t *store, const kvd_namespace_t *ns,
                                 const kvd_block_hash_t *hashes, size_t n,
                                 uint32_t *tiers, size_t *matched_out)
{
    kvd_store_lease_t *leases = calloc(n + 1, sizeof *leases);
    if (leases == NULL) {
        return KVD_ERR_NOMEM;
    }
    size_t matched = 0;
    kvd_status_t st = kvd_store_lookup(store, ns, hashes, n, leases, &matched);
    if (st == KVD_OK) {
        for (size_t i = 0; i < n; i++) {
            tiers[i] = i < matched ? leases[i].tier : KVD_STORE_TIER_NONE;
        }
        (void)kvd_store_release(store, leases, matched);
        *matched_out = matched;
    }
    for (size_t i = matched + 1; st == KVD_OK && i < n; i++) {
        size_t one = 0;
        st = kvd_store_lookup(store, ns, &hashes[i], 1, leases, &one);
        if (st == KVD_OK && one == 1) {
            tiers[i] = leases[0].tier;
            (void)kvd_store_release(store, leases, 1);
        }
    }
    free(leases);
    return st;
}

static void lookup_print(const lookup_args_t *a, const kvd_cli_conn_t *conn,
                         const char *node, size_t n_tokens,
                         const kvd_block_hash_t *hashes, const uint32_t *tiers,
                         size_t n, size_t matched)
{
    size_t behind = 0;
    for (size_t i = matched; i < n; i++) {
        behind += tiers[i] != KVD_STORE_TIER_NONE;
    }
    char hex[2 * KVD_SHA256_BYTES + 1];
    if (a->json) {
        printf("{\"address\":\"%s\",\"node\":", conn->address);
        kvd_cli_json_string(node);
        printf(",\"namespace\":\"%s\",\"tokens\":%zu,"
               "\"block_size\":%zu,\"blocks\":%zu,\"matched_blocks\":%zu,"
               "\"matched_tokens\":%zu,\"stored_behind_miss\":%zu,"
               "\"block_list\":[",
               a->ns_hex, n_tokens, a->block_size, n, matched,
               matched * a->block_size, behind);
        for (size_t i = 0; i < n; i++) {
            kvd_cli_hex_format(hashes[i].bytes, KVD_SHA256_BYTES, hex);
            printf("%s{\"index\":%zu,\"hash\":\"%s\",\"tier\":\"%s\","
                   "\"reachable\":%s}",
                   i == 0 ? "" : ",", i, hex, tier_name(tiers[i]),
                   i < matched ? "true" : "false");
        }
        printf("]}\n");
        return;
    }
    printf("kvdepotd at %s (node %s), namespace %s\n", conn->address,
           node[0] != '\0' ? node : "(none)", a->ns_hex);
    printf("%zu tokens, block size %zu: %zu full blocks", n_tokens,
           a->block_size, n);
    if (n_tokens % a->block_size != 0) {
        printf(" (the last %zu tokens fill no block and are never stored)",
               n_tokens % a->block_size);
    }
    printf("\nhit: %zu of %zu blocks, %zu of %zu tokens\n", matched, n,
           matched * a->block_size, n_tokens);
    if (behind > 0) {
        printf("%zu block(s) after the first miss are stored but "
               "unreachable: a load stops at block %zu\n",
               behind, matched);
    }
    printf("\n%-6s %-17s %-8s %s\n", "block", "tokens", "tier", "hash");
    for (size_t i = 0; i < n; i++) {
        char range[40];
        snprintf(range, sizeof range, "%zu-%zu", i * a->block_size,
                 (i + 1) * a->block_size - 1);
        kvd_cli_hex_format(hashes[i].bytes, KVD_SHA256_BYTES, hex);
        printf("%-6zu %-17s %-8s %s%s\n", i, range, tier_name(tiers[i]), hex,
               i >= matched && tiers[i] != KVD_STORE_TIER_NONE
                   ? "  (behind a miss)"
                   : "");
    }
}

/* Checks the arguments, reads the tokens and hashes them into *hashes_out
 * (malloc'd). Returns -1 to go on, else the exit code. */
static int lookup_prepare(lookup_args_t *a, kvd_namespace_t *ns,
                          size_t *n_tokens, kvd_block_hash_t **hashes_out,
                          size_t *n_out)
{
    if (a->n_acts > 1 || (a->json && a->n_acts > 0)) {
        fprintf(stderr, "kvdepot lookup: %s\n",
                a->n_acts > 1 ? "one of --evict, --pin and --unpin"
                              : "--evict, --pin and --unpin print text; leave "
                                "out --json");
        kvd_cli_lookup_usage(stderr);
        return KVD_CLI_EXIT_USAGE;
    }
    int sources = (a->tokens != NULL) + (a->token_file != NULL) +
                  (a->text != NULL) + (a->text_file != NULL);
    bool by_text = a->text != NULL || a->text_file != NULL;
    const char *why =
        a->ns_hex == NULL ? "--namespace is required"
        : sources != 1    ? "give exactly one of --tokens, --token-file, "
                            "--text and --text-file"
        : by_text && a->tokenizer == NULL
            ? "--text and --text-file need --tokenizer"
        : !by_text && (a->tokenizer != NULL || a->chat || a->no_special)
            ? "--tokenizer, --chat and --no-special-tokens "
              "go with --text or --text-file"
            : NULL;
    if (why != NULL) {
        fprintf(stderr, "kvdepot lookup: %s\n", why);
        kvd_cli_lookup_usage(stderr);
        return KVD_CLI_EXIT_USAGE;
    }
    if (!kvd_cli_hex_parse("lookup", "--namespace", a->ns_hex, ns->bytes,
                           sizeof ns->bytes)) {
        return KVD_CLI_EXIT_USAGE;
    }
    uint32_t *tokens = NULL;
    int rc = tokens_get(a, &tokens, n_tokens);
    if (rc >= 0) {
        return rc;
    }
    size_t n = *n_tokens / a->block_size;
    if (n == 0) {
        fprintf(stderr,
                "kvdepot lookup: %zu tokens fill no block of %zu: nothing "
                "is stored for them\n",
                *n_tokens, a->block_size);
        free(tokens);
        return KVD_CLI_EXIT_FAILURE;
    }
    if (n > LOOKUP_MAX_BLOCKS) {
        fprintf(stderr,
                "kvdepot lookup: %zu blocks: at most %u in one lookup (use "
                "a larger --block-size or fewer tokens)\n",
                n, LOOKUP_MAX_BLOCKS);
        free(tokens);
        return KVD_CLI_EXIT_USAGE;
    }
    kvd_block_hash_t root;
    kvd_block_hash_t *hashes = malloc(n * sizeof *hashes);
    kvd_block_extras_t extras = {.lora_name = a->lora};
    kvd_block_extras_t first = {.lora_name = a->lora, .cache_salt = a->salt};
    kvd_status_t st =
        hashes == NULL ? KVD_ERR_NOMEM : kvd_block_hash_seed(a->seed, &root);
    if (st == KVD_OK) {
        st = kvd_block_hash_chain(&root, tokens, *n_tokens, a->block_size,
                                  &first, &extras, hashes, n, n_out);
    }
    free(tokens);
    if (st != KVD_OK) {
        fprintf(stderr, "kvdepot lookup: hashing the tokens: %s\n",
                kvd_status_str(st));
        free(hashes);
        return KVD_CLI_EXIT_FAILURE;
    }
    *hashes_out = hashes;
    return -1;
}

/* --evict: deletes the prompt's stored blocks (clear by prefix); a block
 * an engine is loading right now is skipped (KVD_ERR_BUSY): exit 1.
 * --pin / --unpin: pins or unpins them in the arena (those on NVMe only
 * are not in it: counted apart). */
static int lookup_act(const lookup_args_t *a, kvd_store_t *store,
                      const kvd_cli_conn_t *conn, const kvd_namespace_t *ns,
                      const kvd_block_hash_t *hashes, const uint32_t *tiers,
                      size_t n)
{
    kvd_store_key_t *keys = calloc(n, sizeof *keys);
    if (keys == NULL) {
        fprintf(stderr, "kvdepot lookup: out of memory\n");
        return KVD_CLI_EXIT_FAILURE;
    }
    size_t k = 0, deleted = 0;
    for (size_t i = 0; i < n; i++) {
        if (tiers[i] != KVD_STORE_TIER_NONE) {
            keys[k].ns = *ns;
            keys[k++].hash = hashes[i];
        }
    }
    size_t missing = 0;
    kvd_status_t st = KVD_OK;
    const char *verb = a->act == LOOKUP_EVICT ? "evicted"
                       : a->act == LOOKUP_PIN ? "pinned"
                                              : "unpinned";
    if (k > 0 && a->act == LOOKUP_EVICT) {
        st = kvd_store_delete(store, keys, k, &deleted);
    } else if (k > 0) {
        st = kvd_store_pin(store, keys, k, a->act == LOOKUP_PIN, &deleted,
                           &missing);
    }
    free(keys);
    printf("\n%s %zu of the prompt's %zu stored block(s)", verb, deleted, k);
    if (missing > 0) {
        printf(" (%zu on NVMe only, not in the arena)", missing);
    }
    printf("\n");
    if (st != KVD_OK) {
        fprintf(stderr, "kvdepot lookup: %s at %s: %s%s\n",
                a->act == LOOKUP_EVICT ? "evicting" : "pinning", conn->address,
                kvd_status_str(st),
                st == KVD_ERR_BUSY    ? " (an engine holds some of them now; "
                                        "run it again)"
                : st == KVD_ERR_QUOTA ? " (the daemon's store.pin_max_bytes "
                                        "is reached: unpin others first)"
                : st == KVD_ERR_UNSUPPORTED
                    ? " (a kvdepotd before protocol revision 7)"
                    : "");
        return KVD_CLI_EXIT_FAILURE;
    }
    return KVD_CLI_EXIT_OK;
}

int kvd_cli_lookup_run(int argc, char **argv)
{
    static const struct option opts[] = {
        {"namespace", required_argument, NULL, 'n'},
        {"tokens", required_argument, NULL, LOOKUP_OPT_TOKENS},
        {"token-file", required_argument, NULL, LOOKUP_OPT_TOKEN_FILE},
        {"block-size", required_argument, NULL, LOOKUP_OPT_BLOCK_SIZE},
        {"lora", required_argument, NULL, LOOKUP_OPT_LORA},
        {"salt", required_argument, NULL, LOOKUP_OPT_SALT},
        {"seed", required_argument, NULL, LOOKUP_OPT_SEED},
        {"json", no_argument, NULL, LOOKUP_OPT_JSON},
        {"evict", no_argument, NULL, LOOKUP_OPT_EVICT},
        {"pin", no_argument, NULL, LOOKUP_OPT_PIN},
        {"unpin", no_argument, NULL, LOOKUP_OPT_UNPIN},
        {"text", required_argument, NULL, LOOKUP_OPT_TEXT},
        {"text-file", required_argument, NULL, LOOKUP_OPT_TEXT_FILE},
        {"tokenizer", required_argument, NULL, LOOKUP_OPT_TOKENIZER},
        {"chat", no_argument, NULL, LOOKUP_OPT_CHAT},
        {"no-special-tokens", no_argument, NULL, LOOKUP_OPT_NO_SPECIAL},
        {"help", no_argument, NULL, 'h'},
        KVD_CLI_CONN_LONGOPTS,
        {NULL, 0, NULL, 0}};
    lookup_args_t a = {.block_size = 16, .seed = KVD_BLOCK_HASH_DEFAULT_SEED};
    kvd_cli_conn_t conn;
    if (!kvd_cli_conn_init(&conn, "lookup")) {
        return KVD_CLI_EXIT_FAILURE;
    }
    int rc = kvd_cli_conn_getopt(&conn, argc, argv, "n:h", opts,
                                 kvd_cli_lookup_usage, lookup_option, &a);
    if (rc < 0 && optind != argc) {
        fprintf(stderr, "kvdepot lookup: unexpected argument %s\n",
                argv[optind]);
        rc = KVD_CLI_EXIT_USAGE;
    }
    kvd_namespace_t ns;
    kvd_block_hash_t *hashes = NULL;
    size_t n_tokens = 0, n = 0;
    if (rc < 0) {
        rc = lookup_prepare(&a, &ns, &n_tokens, &hashes, &n);
    }
    if (rc >= 0) {
        kvd_cli_conn_cleanup(&conn);
        return rc;
    }
    kvd_store_t *store = NULL;
    uint32_t *tiers = calloc(n, sizeof *tiers);
    rc = KVD_CLI_EXIT_FAILURE;
    if (tiers == NULL) {
        fprintf(stderr, "kvdepot lookup: out of memory\n");
    } else if (kvd_cli_conn_open(&conn, &store)) {
        size_t matched = 0;
        /* The node answering: in a cluster, blocks other nodes held are
         * fetched to it before it answers, so the tiers are its own. */
        char version[80] = "", node[160] = "";
        (void)kvd_client_ping(kvd_client_of(store), version, sizeof version,
                              node, sizeof node);
        kvd_status_t st = lookup_tiers(store, &ns, hashes, n, tiers, &matched);
        if (st == KVD_OK) {
            lookup_print(&a, &conn, node, n_tokens, hashes, tiers, n, matched);
            rc = a.act != LOOKUP_SHOW
                     ? lookup_act(&a, store, &conn, &ns, hashes, tiers, n)
                     : KVD_CLI_EXIT_OK;
        } else {
            fprintf(stderr, "kvdepot lookup: the daemon at %s: %s\n",
                    conn.address, kvd_status_str(st));
        }
    }
    kvd_store_close(store);
    free(tiers);
    free(hashes);
    kvd_cli_conn_cleanup(&conn);
    return rc;
}
