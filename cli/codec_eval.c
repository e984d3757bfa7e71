/*
 * `kvdepot codec-eval`: how much a KV codec loses, and how much it saves,
 * on the user's own K or V. Codec error depends on the data far more than
 * on anything else (outlier channels, per-token magnitude spread), so the
 * tool reads a dump of real vectors (.npy, [N, D], float16 or float32) and
 * falls back to Gaussian vectors only when none is given.
 *
 * The vectors go through exactly what the store runs: they are rounded to
 * float16 (the engine cache dtype), grouped into engine blocks of
 * block_size tokens x heads (vector n is token n / heads, head n % heads,
 * the order of a [tokens, heads, D] dump flattened to [N, D]), and each
 * block is encoded and decoded with kvd_ref_plane_encode/decode. A last
 * block with fewer tokens is encoded as the partial block it would be in
 * the store. Errors are measured against the float16-rounded input, so raw
 * reads exactly 0 and no codec is blamed for the float32->float16 step.
 *
 * KIVI and int8 quantize K per channel and V per token, so they get a row
 * per plane; every other codec treats both planes alike and gets one row.
 * Everything is deterministic for a given --seed (Gaussian draw and the
 * TurboQuant rotation).
 */
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli_int.h"
#include "cli/npy_int.h"
#include "kernels/ref/ref.h"
#include "kvdepot/kernels.h"

#define KVD_EVAL_DEFAULT_VECTORS 4096
#define KVD_EVAL_DEFAULT_DIM 128
#define KVD_EVAL_DEFAULT_BLOCK 16
/* Bounds the float16 copy of the input to 2 GiB. */
#define KVD_EVAL_MAX_ELEMS ((uint64_t)1 << 30)
#define KVD_EVAL_ALL_CODECS (-1)
#define KVD_EVAL_BOTH_PLANES (-1)

typedef struct kvd_eval_opts {
    const char *input; /* NULL: Gaussian */
    uint64_t vectors;  /* 0: default / whole file */
    uint64_t dim;      /* 0: default / from the file */
    uint64_t seed;
    uint64_t block_size;
    uint64_t heads;
    int codec; /* kvd_codec_t or KVD_EVAL_ALL_CODECS */
    int plane; /* kvd_plane_t or KVD_EVAL_BOTH_PLANES */
} kvd_eval_opts_t;

/* The vectors under test, float16 bits, [vector][channel]. */
typedef struct kvd_eval_input {
    uint16_t *x16;
    size_t num_vectors;
    size_t dim;
} kvd_eval_input_t;

typedef struct kvd_eval_result {
    double rel_mse;
    double mean_cos;
    double bytes_per_vector;
    double ratio_vs_fp16;
} kvd_eval_result_t;

void kvd_cli_codec_eval_usage(FILE *out)
{
    fprintf(out,
            "usage: kvdepot codec-eval [--input FILE.npy] [--dim D] "
            "[--vectors N]\n"
            "                          [--seed S] [--codec NAME|all] "
            "[--plane k|v]\n"
            "                          [--block-size B] [--heads H]\n"
            "\n"
            "Encodes and decodes vectors with every KV codec (or one) the "
            "way the store\n"
            "does, and prints per codec: relative MSE, mean cosine "
            "similarity, stored\n"
            "bytes per vector (data + metadata) and the compression ratio "
            "against fp16.\n"
            "\n"
            "  -i, --input FILE    .npy of shape [N, D], dtype '<f2' or "
            "'<f4' (a dump of a\n"
            "                      model's K or V, [tokens, heads, D] "
            "flattened to [N, D]);\n"
            "                      converted to fp16 first. Without it, "
            "N(0,1) vectors.\n"
            "  -d, --dim D         channels per vector (default %d; with "
            "--input, must\n"
            "                      match the file)\n"
            "  -n, --vectors N     number of vectors (default %d; with "
            "--input, the first\n"
            "                      N rows, default all)\n"
            "  -s, --seed S        Gaussian draw and TurboQuant rotation "
            "seed (default 0)\n"
            "  -c, --codec NAME    raw, fp8_e4m3, int8, kivi4, kivi2, tq4, "
            "tq3, tq2 or all\n"
            "                      (default all)\n"
            "  -p, --plane k|v     evaluate as K or V only (default both; "
            "KIVI and int8 differ)\n"
            "  -b, --block-size B  tokens per engine block (default %d)\n"
            "  -H, --heads H       heads per token: N must be a multiple "
            "(default 1)\n"
            "  -h, --help          this text\n"
            "\n"
            "relMSE = sum |x - x'|^2 / sum |x|^2 over all vectors, against "
            "the fp16 input.\n"
            "Mean cosine counts an all-zero vector as 1 if it decodes to "
            "zero, else 0.\n"
            "Bytes per vector are a full block's data and metadata regions "
            "(16-byte\n"
            "aligned) divided by block_size x heads.\n"
            "\n"
            "Exit status: 0 success, 1 unreadable or unusable input, 2 bad "
            "command line.\n",
            KVD_EVAL_DEFAULT_DIM, KVD_EVAL_DEFAULT_VECTORS,
            KVD_EVAL_DEFAULT_BLOCK);
}

static bool eval_parse_u64(const char *opt, const char *text, uint64_t min,
                           uint64_t max, uint64_t *value_out)
{
    uint64_t v = 0;
    const char *p = text;
    if (*p == '\0') {
        goto bad;
    }
    for (; *p != '\0'; p++) {
        if (*p < '0' || *p > '9') {
            goto bad;
        }
        uint64_t digit = (uint64_t)(*p - '0');
        if (v > (UINT64_MAX - digit) / 10) {
            goto bad;
        }
        v = v * 10 + digit;
    }
    if (v < min || v > max) {
        goto bad;
    }
    *value_out = v;
    return true;

bad:
    fprintf(stderr,
            "kvdepot codec-eval: %s '%s': need an integer in %" PRIu64
            "..%" PRIu64 "\n",
            opt, text, min, max);
    return false;
}

static bool eval_parse_codec(const char *text, int *codec_out)
{
    if (strcmp(text, "all") == 0) {
        *codec_out = KVD_EVAL_ALL_CODECS;
        return true;
    }
    kvd_codec_t c;
    if (kvd_codec_parse(text, &c) != KVD_OK) {
        fprintf(stderr,
                "kvdepot codec-eval: unknown codec '%s' (raw, fp8_e4m3, "
                "int8, kivi4, kivi2, tq4, tq3, tq2 or all)\n",
                text);
        return false;
    }
    *codec_out = (int)c;
    return true;
}

static bool eval_parse_plane(const char *text, int *plane_out)
{
    if (strcmp(text, "k") == 0 || strcmp(text, "K") == 0) {
        *plane_out = KVD_PLANE_K;
    } else if (strcmp(text, "v") == 0 || strcmp(text, "V") == 0) {
        *plane_out = KVD_PLANE_V;
    } else {
        fprintf(stderr, "kvdepot codec-eval: --plane '%s': need k or v\n",
                text);
        return false;
    }
    return true;
}

/* Returns -1 to go on, or the exit code (help printed, or a usage error). */
static int eval_parse_args(int argc, char **argv, kvd_eval_opts_t *o)
{
    static const struct option longopts[] = {
        {"input", required_argument, NULL, 'i'},
        {"dim", required_argument, NULL, 'd'},
        {"vectors", required_argument, NULL, 'n'},
        {"seed", required_argument, NULL, 's'},
        {"codec", required_argument, NULL, 'c'},
        {"plane", required_argument, NULL, 'p'},
        {"block-size", required_argument, NULL, 'b'},
        {"heads", required_argument, NULL, 'H'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof(*o));
    o->block_size = KVD_EVAL_DEFAULT_BLOCK;
    o->heads = 1;
    o->codec = KVD_EVAL_ALL_CODECS;
    o->plane = KVD_EVAL_BOTH_PLANES;

    /* getopt keeps its state in globals; reset it for this argv. */
    optind = 1;
    opterr = 0;
    int ch;
    bool ok = true;
    while (ok && (ch = getopt_long(argc, argv, ":i:d:n:s:c:p:b:H:h", longopts,
                                   NULL)) != -1) {
        switch (ch) {
        case 'i': o->input = optarg; break;
        case 'd': ok = eval_parse_u64("--dim", optarg, 1, 1024, &o->dim); break;
        case 'n':
            ok = eval_parse_u64("--vectors", optarg, 1, KVD_EVAL_MAX_ELEMS,
                                &o->vectors);
            break;
        case 's':
            ok = eval_parse_u64("--seed", optarg, 0, UINT64_MAX, &o->seed);
            break;
        case 'c': ok = eval_parse_codec(optarg, &o->codec); break;
        case 'p': ok = eval_parse_plane(optarg, &o->plane); break;
        case 'b':
            ok =
                eval_parse_u64("--block-size", optarg, 1, 4096, &o->block_size);
            break;
        case 'H':
            ok = eval_parse_u64("--heads", optarg, 1, 1024, &o->heads);
            break;
        case 'h': kvd_cli_codec_eval_usage(stdout); return KVD_CLI_EXIT_OK;
        case ':':
            fprintf(stderr, "kvdepot codec-eval: %s needs a value\n",
                    argv[optind - 1]);
            ok = false;
            break;
        default:
            fprintf(stderr, "kvdepot codec-eval: unknown option '%s'\n",
                    argv[optind - 1]);
            ok = false;
            break;
        }
    }
    if (ok && optind < argc) {
        fprintf(stderr, "kvdepot codec-eval: unexpected argument '%s'\n",
                argv[optind]);
        ok = false;
    }
    if (!ok) {
        fprintf(stderr, "Try 'kvdepot help codec-eval'.\n");
        return KVD_CLI_EXIT_USAGE;
    }
    return -1;
}

/* splitmix64: tiny, seedable and the same on every platform. */
static uint64_t eval_rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in (0, 1]: never 0, so log() below stays finite. */
static double eval_rng_unit(uint64_t *state)
{
    return (double)((eval_rng_next(state) >> 11) + 1) * 0x1.0p-53;
}

static int eval_input_gaussian(const kvd_eval_opts_t *o, kvd_eval_input_t *in)
{
    in->dim = o->dim ? o->dim : KVD_EVAL_DEFAULT_DIM;
    in->num_vectors = o->vectors ? o->vectors : KVD_EVAL_DEFAULT_VECTORS;
    if ((uint64_t)in->num_vectors * in->dim > KVD_EVAL_MAX_ELEMS) {
        fprintf(stderr,
                "kvdepot codec-eval: %zu vectors x %zu channels is more "
                "than %" PRIu64 " elements\n",
                in->num_vectors, in->dim, KVD_EVAL_MAX_ELEMS);
        return KVD_CLI_EXIT_USAGE;
    }
    size_t n = in->num_vectors * in->dim;
    in->x16 = malloc(n * sizeof(uint16_t));
    if (in->x16 == NULL) {
        fprintf(stderr, "kvdepot codec-eval: out of memory\n");
        return KVD_CLI_EXIT_FAILURE;
    }
    uint64_t state = o->seed;
    /* Box-Muller, both outputs used. */
    for (size_t i = 0; i < n; i += 2) {
        double r = sqrt(-2.0 * log(eval_rng_unit(&state)));
        double a = 2.0 * M_PI * eval_rng_unit(&state);
        in->x16[i] = kvd_float_to_half((float)(r * cos(a)));
        if (i + 1 < n) {
            in->x16[i + 1] = kvd_float_to_half((float)(r * sin(a)));
        }
    }
    return -1;
}

/* Converts the file's rows to float16 and refuses values that are not
 * finite there: they would make every codec's error meaningless. */
static int eval_input_convert(const char *path, const kvd_npy_array_t *a,
                              kvd_eval_input_t *in)
{
    size_t n = in->num_vectors * in->dim;
    in->x16 = malloc(n * sizeof(uint16_t));
    if (in->x16 == NULL) {
        fprintf(stderr, "kvdepot codec-eval: out of memory\n");
        return KVD_CLI_EXIT_FAILURE;
    }
    const unsigned char *src = a->data;
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        if (a->elem_bytes == 2) {
            memcpy(&h, src + i * 2, sizeof(h));
        } else {
            float f;
            memcpy(&f, src + i * 4, sizeof(f));
            h = kvd_float_to_half(f);
        }
        if ((h & 0x7c00u) == 0x7c00u) {
            fprintf(stderr,
                    "kvdepot codec-eval: %s: element [%zu, %zu] is %s in "
                    "float16%s\n",
                    path, i / in->dim, i % in->dim,
                    (h & 0x03ffu) ? "NaN" : "infinite",
                    a->elem_bytes == 4 && (h & 0x03ffu) == 0
                        ? " (|x| > 65504 overflows float16)"
                        : "");
            return KVD_CLI_EXIT_FAILURE;
        }
        in->x16[i] = h;
    }
    return -1;
}

static int eval_input_npy(const kvd_eval_opts_t *o, kvd_eval_input_t *in)
{
    void *buf = NULL;
    size_t len = 0;
    char err[256];
    int rc = KVD_CLI_EXIT_FAILURE;

    if (kvd_npy_file_load(o->input, &buf, &len, err, sizeof(err)) != KVD_OK) {
        fprintf(stderr, "kvdepot codec-eval: %s\n", err);
        return KVD_CLI_EXIT_FAILURE;
    }
    kvd_npy_array_t a;
    if (kvd_npy_parse(buf, len, &a, err, sizeof(err)) != KVD_OK) {
        fprintf(stderr, "kvdepot codec-eval: %s: %s\n", o->input, err);
        goto out;
    }
    if (a.cols > 1024) {
        fprintf(stderr,
                "kvdepot codec-eval: %s: %" PRIu64 " channels per vector, "
                "the store takes head_dim 1..1024\n",
                o->input, a.cols);
        goto out;
    }
    if (o->dim != 0 && o->dim != a.cols) {
        fprintf(stderr,
                "kvdepot codec-eval: %s: --dim %" PRIu64 " but the file "
                "has %" PRIu64 " channels per vector\n",
                o->input, o->dim, a.cols);
        goto out;
    }
    if (o->vectors > a.rows) {
        fprintf(stderr,
                "kvdepot codec-eval: %s: --vectors %" PRIu64 " but the "
                "file has %" PRIu64 "\n",
                o->input, o->vectors, a.rows);
        goto out;
    }
    in->dim = (size_t)a.cols;
    in->num_vectors = o->vectors ? (size_t)o->vectors : (size_t)a.rows;
    if ((uint64_t)in->num_vectors * in->dim > KVD_EVAL_MAX_ELEMS) {
        fprintf(stderr,
                "kvdepot codec-eval: %s: %zu vectors x %zu channels is more "
                "than %" PRIu64 " elements; pass --vectors\n",
                o->input, in->num_vectors, in->dim, KVD_EVAL_MAX_ELEMS);
        goto out;
    }
    rc = eval_input_convert(o->input, &a, in);
    if (rc < 0) {
        printf("input: %s, %s, %zu vectors x %zu channels\n", o->input,
               a.elem_bytes == 2 ? "float16" : "float32 converted to float16",
               in->num_vectors, in->dim);
    }

out:
    free(buf);
    return rc;
}

/* Accumulates the error of one decoded vector against its input. */
typedef struct kvd_eval_acc {
    double err_sq;  /* sum |x - y|^2 */
    double sig_sq;  /* sum |x|^2 */
    double cos_sum; /* sum of per-vector cosines */
    size_t count;
} kvd_eval_acc_t;

static void eval_acc_vector(kvd_eval_acc_t *acc, const uint16_t *x,
                            const uint16_t *y, size_t dim)
{
    double xx = 0, yy = 0, xy = 0, ee = 0;
    for (size_t c = 0; c < dim; c++) {
        double a = kvd_half_to_float(x[c]);
        double b = kvd_half_to_float(y[c]);
        xx += a * a;
        yy += b * b;
        xy += a * b;
        ee += (a - b) * (a - b);
    }
    acc->err_sq += ee;
    acc->sig_sq += xx;
    if (xx == 0) {
        acc->cos_sum += yy == 0 ? 1.0 : 0.0;
    } else if (yy != 0) {
        acc->cos_sum += xy / sqrt(xx * yy);
    }
    acc->count++;
}

/* Scratch for one block: input and output in [head][token][channel], and
 * the plane's two regions (16-byte aligned, as the kernels require). */
typedef struct kvd_eval_block {
    uint16_t *src;
    uint16_t *dst;
    void *data;
    void *meta;
} kvd_eval_block_t;

static void eval_block_cleanup(kvd_eval_block_t *b)
{
    free(b->src);
    free(b->dst);
    free(b->data);
    free(b->meta);
}

static kvd_status_t eval_block_init(kvd_eval_block_t *b,
                                    const kvd_object_format_t *fmt,
                                    unsigned plane)
{
    size_t elems = (size_t)fmt->num_heads * fmt->block_size * fmt->head_dim;
    size_t io_bytes = (elems * sizeof(uint16_t) + 15) & ~(size_t)15;
    /* A codec without metadata still gets a valid 16-byte pointer. */
    size_t meta_bytes = kvd_object_plane_meta_bytes(fmt, plane);
    memset(b, 0, sizeof(*b));
    b->src = aligned_alloc(16, io_bytes);
    b->dst = aligned_alloc(16, io_bytes);
    b->data = aligned_alloc(16, kvd_object_plane_data_bytes(fmt, plane));
    b->meta = aligned_alloc(16, meta_bytes ? meta_bytes : 16);
    if (b->src == NULL || b->dst == NULL || b->data == NULL ||
        b->meta == NULL) {
        eval_block_cleanup(b);
        return KVD_ERR_NOMEM;
    }
    return KVD_OK;
}

/* Copies block `blk` of the input into b->src ([h][t][c], zero past the
 * valid tokens) and returns how many tokens are valid. */
static uint32_t eval_block_fill(const kvd_eval_input_t *in,
                                const kvd_object_format_t *fmt, size_t blk,
                                kvd_eval_block_t *b)
{
    size_t heads = fmt->num_heads, bs = fmt->block_size, d = in->dim;
    size_t tokens = in->num_vectors / heads;
    size_t first = blk * bs;
    uint32_t valid = (uint32_t)(tokens - first < bs ? tokens - first : bs);
    memset(b->src, 0, heads * bs * d * sizeof(uint16_t));
    for (size_t h = 0; h < heads; h++) {
        for (size_t t = 0; t < valid; t++) {
            memcpy(b->src + (h * bs + t) * d,
                   in->x16 + ((first + t) * heads + h) * d,
                   d * sizeof(uint16_t));
        }
    }
    return valid;
}

/*
 * Runs every block of the input through `codec` on `plane`. A format the
 * store would refuse (KIVI V with head_dim % 32 != 0, TurboQuant outside
 * 64/128/256) returns KVD_ERR_UNSUPPORTED/INVALID with the reason in `why`.
 */
static kvd_status_t eval_codec(const kvd_eval_input_t *in,
                               const kvd_eval_opts_t *o, kvd_codec_t codec,
                               unsigned plane, kvd_eval_result_t *result_out,
                               char *why, size_t why_len)
{
    kvd_object_format_t fmt = {
        .dtype = KVD_DTYPE_FP16,
        .num_layers = 1,
        .num_planes = 2,
        .num_heads = (uint32_t)o->heads,
        .head_dim = (uint32_t)in->dim,
        .block_size = (uint32_t)o->block_size,
        .codec = {KVD_CODEC_RAW, KVD_CODEC_RAW},
        .tq_seed = o->seed,
    };
    fmt.codec[plane] = codec;
    kvd_status_t st = kvd_object_format_check(&fmt, why, why_len);
    if (st != KVD_OK) {
        return st;
    }
    kvd_codec_tables_t *tables;
    st = kvd_codec_tables_create(&fmt, &tables);
    if (st != KVD_OK) {
        snprintf(why, why_len, "codec tables: %s", kvd_status_str(st));
        return st;
    }
    kvd_eval_block_t b;
    st = eval_block_init(&b, &fmt, plane);
    if (st != KVD_OK) {
        snprintf(why, why_len, "out of memory");
        goto err_tables;
    }
    size_t heads = fmt.num_heads, bs = fmt.block_size, d = in->dim;
    size_t num_blocks = (in->num_vectors / heads + bs - 1) / bs;
    kvd_eval_acc_t acc = {0};
    for (size_t blk = 0; blk < num_blocks; blk++) {
        uint32_t valid = eval_block_fill(in, &fmt, blk, &b);
        st = kvd_ref_plane_encode(&fmt, tables, plane, b.src, valid, b.data,
                                  b.meta);
        if (st == KVD_OK) {
            st = kvd_ref_plane_decode(&fmt, tables, plane, b.data, b.meta,
                                      valid, b.dst);
        }
        if (st != KVD_OK) {
            snprintf(why, why_len, "block %zu: %s", blk, kvd_status_str(st));
            goto err_block;
        }
        for (size_t h = 0; h < heads; h++) {
            for (size_t t = 0; t < valid; t++) {
                size_t off = (h * bs + t) * d;
                eval_acc_vector(&acc, b.src + off, b.dst + off, d);
            }
        }
    }
    size_t region = kvd_object_plane_data_bytes(&fmt, plane) +
                    kvd_object_plane_meta_bytes(&fmt, plane);
    kvd_eval_result_t r = {0};
    if (acc.sig_sq > 0) {
        r.rel_mse = acc.err_sq / acc.sig_sq;
    } else {
        r.rel_mse = acc.err_sq == 0 ? 0.0 : INFINITY;
    }
    r.mean_cos = acc.cos_sum / (double)acc.count;
    r.bytes_per_vector = (double)region / (double)(heads * bs);
    r.ratio_vs_fp16 = (double)(d * sizeof(uint16_t)) / r.bytes_per_vector;
    *result_out = r;
    st = KVD_OK;

err_block:
    eval_block_cleanup(&b);
err_tables:
    kvd_codec_tables_destroy(tables);
    return st;
}

/* Codecs whose K and V planes are quantized along different axes. */
static bool eval_per_plane(kvd_codec_t c)
{
    return c == KVD_CODEC_KIVI4 || c == KVD_CODEC_KIVI2 || c == KVD_CODEC_INT8;
}

/* Prints one table row; returns false on a real failure (not "n/a"). */
static bool eval_row(const kvd_eval_input_t *in, const kvd_eval_opts_t *o,
                     kvd_codec_t codec, unsigned plane, const char *plane_name)
{
    kvd_eval_result_t r = {0};
    char why[200] = "";
    kvd_status_t st = eval_codec(in, o, codec, plane, &r, why, sizeof(why));
    const char *name = kvd_codec_name(codec);
    if (st == KVD_ERR_UNSUPPORTED || st == KVD_ERR_INVALID) {
        printf("%-9s %-5s n/a: %s\n", name, plane_name, why);
        return true;
    }
    if (st != KVD_OK) {
        fflush(stdout);
        fprintf(stderr, "kvdepot codec-eval: %s on plane %s: %s\n", name,
                plane_name, why);
        return false;
    }
    printf("%-9s %-5s %11.3e %9.6f %10.2f %8.2fx\n", name, plane_name,
           r.rel_mse, r.mean_cos, r.bytes_per_vector, r.ratio_vs_fp16);
    return true;
}

static int eval_report(const kvd_eval_input_t *in, const kvd_eval_opts_t *o)
{
    size_t tokens = in->num_vectors / o->heads;
    size_t num_blocks = (tokens + o->block_size - 1) / o->block_size;
    size_t last = tokens - (num_blocks - 1) * o->block_size;
    printf("blocks: %zu of %" PRIu64 " tokens x %" PRIu64 " head%s, last "
           "block %zu token%s%s; dtype fp16\n\n",
           num_blocks, o->block_size, o->heads, o->heads == 1 ? "" : "s", last,
           last == 1 ? "" : "s", last < o->block_size ? " (partial)" : "");
    printf("%-9s %-5s %11s %9s %10s %9s\n", "codec", "plane", "relMSE",
           "mean_cos", "bytes/vec", "vs_fp16");
    for (int c = 0; c < KVD_CODEC_COUNT; c++) {
        if (o->codec != KVD_EVAL_ALL_CODECS && o->codec != c) {
            continue;
        }
        kvd_codec_t codec = (kvd_codec_t)c;
        bool ok;
        if (o->plane != KVD_EVAL_BOTH_PLANES) {
            ok = eval_row(in, o, codec, (unsigned)o->plane,
                          o->plane == KVD_PLANE_K ? "k" : "v");
        } else if (eval_per_plane(codec)) {
            ok = eval_row(in, o, codec, KVD_PLANE_K, "k") &&
                 eval_row(in, o, codec, KVD_PLANE_V, "v");
        } else {
            ok = eval_row(in, o, codec, KVD_PLANE_K, "k,v");
        }
        if (!ok) {
            return KVD_CLI_EXIT_FAILURE;
        }
    }
    return KVD_CLI_EXIT_OK;
}

int kvd_cli_codec_eval_run(int argc, char **argv)
{
    kvd_eval_opts_t o;
    int rc = eval_parse_args(argc, argv, &o);
    if (rc >= 0) {
        return rc;
    }
    kvd_eval_input_t in = {0};
    if (o.input != NULL) {
        rc = eval_input_npy(&o, &in);
    } else {
        rc = eval_input_gaussian(&o, &in);
        if (rc < 0) {
            printf("input: Gaussian N(0,1), seed %" PRIu64 ", %zu vectors x "
                   "%zu channels\n",
                   o.seed, in.num_vectors, in.dim);
        }
    }
    if (rc >= 0) {
        goto out;
    }
    if (in.num_vectors % o.heads != 0) {
        fflush(stdout);
        fprintf(stderr,
                "kvdepot codec-eval: %zu vectors are not a whole number of "
                "tokens of %" PRIu64 " heads\n",
                in.num_vectors, o.heads);
        rc = o.input != NULL ? KVD_CLI_EXIT_FAILURE : KVD_CLI_EXIT_USAGE;
        goto out;
    }
    rc = eval_report(&in, &o);

out:
    free(in.x16);
    return rc;
}
