/*
 * kvdepot common layer: status codes, logging, configuration, hashing and
 * block identity. Every other public kvdepot header includes this one.
 *
 * Threading: every function here is thread-safe unless its comment says
 * otherwise. Functions never abort on bad input; they return a status.
 */
#ifndef KVDEPOT_COMMON_H
#define KVDEPOT_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks a symbol exported from libkvdepot.so; everything else is hidden. */
#define KVD_API __attribute__((visibility("default")))

#define KVD_VERSION_MAJOR 0
#define KVD_VERSION_MINOR 1
#define KVD_VERSION_PATCH 0

/* Returns the library version as "MAJOR.MINOR.PATCH"; static storage. */
KVD_API const char *kvd_version(void);

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

/*
 * One status type for the whole library. KVD_OK is 0, KVD_INPROGRESS is the
 * only positive value (an asynchronous operation was accepted), errors are
 * negative and grouped by who must react to them.
 */
typedef enum kvd_status {
    KVD_OK = 0,
    KVD_INPROGRESS = 1,

    /* The caller passed something wrong: fix the call. */
    KVD_ERR_INVALID = -1,     /* bad argument or malformed value */
    KVD_ERR_NOT_FOUND = -2,   /* no such key, object, request or setting */
    KVD_ERR_EXISTS = -3,      /* already present */
    KVD_ERR_RANGE = -4,       /* value outside its allowed range */
    KVD_ERR_PROTO = -5,       /* malformed or semantically invalid message */
    KVD_ERR_UNSUPPORTED = -6, /* valid request this build cannot serve */
    KVD_ERR_STATE = -7,       /* call not allowed in the object's state */
    KVD_ERR_CANCELED = -8,    /* operation canceled before completion */

    /* Capacity: retry later, free something, or raise a limit. */
    KVD_ERR_NOMEM = -20,   /* memory allocation failed */
    KVD_ERR_BUSY = -21,    /* bounded queue full (back-pressure) */
    KVD_ERR_NOSPACE = -22, /* storage tier full */
    KVD_ERR_QUOTA = -23,   /* tenant quota exceeded */

    /* I/O: the medium failed or returned bad bytes. */
    KVD_ERR_IO = -40,       /* read/write/syscall failure */
    KVD_ERR_CHECKSUM = -41, /* stored bytes do not match their checksum */
    KVD_ERR_CORRUPT = -42,  /* on-disk structure is inconsistent */

    /* Peer: another process or node misbehaved or is gone. */
    KVD_ERR_TIMEOUT = -60,     /* deadline expired */
    KVD_ERR_UNREACHABLE = -61, /* peer cannot be reached */
    KVD_ERR_PEER = -62,        /* peer returned an error or closed */

    /* RPC layer. */
    KVD_ERR_RPC = -80,  /* transport-level RPC failure */
    KVD_ERR_AUTH = -81, /* authentication or permission denied */

    /* Accelerator device. */
    KVD_ERR_DEVICE = -100,    /* device runtime error */
    KVD_ERR_NO_DEVICE = -101, /* no usable device present */

    /* Bug in kvdepot: report it. */
    KVD_ERR_INTERNAL = -120
} kvd_status_t;

/*
 * Returns a short, stable, human-readable name for a status, e.g.
 * "KVD_ERR_NOSPACE: storage tier full". Unknown values give
 * "KVD_ERR_UNKNOWN". Static storage; never NULL.
 */
KVD_API const char *kvd_status_str(kvd_status_t status);

/*
 * Translates a positive errno value into the matching status (ENOMEM ->
 * KVD_ERR_NOMEM, ENOSPC/EDQUOT -> KVD_ERR_NOSPACE, EAGAIN -> KVD_ERR_BUSY,
 * ETIMEDOUT -> KVD_ERR_TIMEOUT, ...). Any other errno is KVD_ERR_IO.
 * 0 gives KVD_OK. This is the one place errno becomes a kvdepot status.
 */
KVD_API kvd_status_t kvd_status_from_errno(int err);

/* ------------------------------------------------------------------------ */
/* Logging                                                                  */
/* ------------------------------------------------------------------------ */

typedef enum kvd_log_level {
    KVD_LOG_LEVEL_OFF = -1,
    KVD_LOG_LEVEL_ERROR = 0,
    KVD_LOG_LEVEL_WARN = 1,
    KVD_LOG_LEVEL_INFO = 2,
    KVD_LOG_LEVEL_DEBUG = 3,
    KVD_LOG_LEVEL_TRACE = 4
} kvd_log_level_t;

/*
 * A log sink receives one formatted message (no trailing newline) with its
 * level and source location. It may be called from any kvdepot thread,
 * concurrently; it must not call back into kvdepot. `arg` is the pointer
 * given to kvd_log_set_sink.
 */
typedef void (*kvd_log_sink_fn)(void *arg, kvd_log_level_t level,
                                const char *file, int line, const char *msg);

/*
 * Replaces the process-wide sink. NULL restores the default sink, which
 * writes "<time> <LEVEL> <file>:<line> <msg>\n" to stderr. `arg` is retained
 * until the next call. Messages being logged concurrently may still reach
 * the previous sink.
 */
KVD_API void kvd_log_set_sink(kvd_log_sink_fn sink, void *arg);

/* Sets / gets the process-wide level; messages above it are dropped before
 * their arguments are evaluated. The initial level comes from the
 * KVDEPOT_LOG_LEVEL environment variable (error|warn|info|debug|trace|off),
 * default "warn". */
KVD_API void kvd_log_set_level(kvd_log_level_t level);
KVD_API kvd_log_level_t kvd_log_get_level(void);

/* Parses "error", "warn", "info", "debug", "trace" or "off"
 * (case-insensitive). KVD_ERR_INVALID for anything else. */
KVD_API kvd_status_t kvd_log_level_parse(const char *text,
                                         kvd_log_level_t *level_out);

/* Formats and emits one message if `level` is enabled. Use the KVD_LOG_*
 * macros (common/log_int.h) rather than calling these directly. */
KVD_API void kvd_log_write(kvd_log_level_t level, const char *file, int line,
                           const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
KVD_API void kvd_log_vwrite(kvd_log_level_t level, const char *file, int line,
                            const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

/* ------------------------------------------------------------------------ */
/* Configuration                                                            */
/* ------------------------------------------------------------------------ */

/*
 * Each component declares its settings in one table of kvd_config_field_t
 * (name, default, doc, parser, offset into the component's settings
 * struct). kvd_config_apply() fills that struct, resolving each field from,
 * in order of precedence:
 *   1. a call parameter set with kvd_config_set();
 *   2. the environment variable KVDEPOT_<NAME>, where NAME is the field name
 *      upper-cased with '.' and '-' turned into '_'
 *      ("store.arena_size" -> KVDEPOT_STORE_ARENA_SIZE);
 *   3. the YAML file loaded with kvd_config_load_file() (nested mappings are
 *      joined with '.': `store: {arena_size: 8g}` -> "store.arena_size");
 *   4. the field's default.
 * Sizes accept the suffixes k, m, g, t (powers of 1024, optionally followed
 * by "b" or "ib", any case): "64g", "512KiB", "4096". Durations accept ns, us,
 * ms, s, m, h ("500ms", "2s", "1h"); a bare number is milliseconds.
 */
typedef struct kvd_config kvd_config_t;
typedef struct kvd_config_field kvd_config_field_t;

/* Parses `text` for `field` into `dst` (which points at the field inside the
 * settings struct). Returns KVD_ERR_INVALID or KVD_ERR_RANGE with a reason
 * written into `err` (NUL-terminated, at most `err_len` bytes). */
typedef kvd_status_t (*kvd_config_parse_fn)(const kvd_config_field_t *field,
                                            const char *text, void *dst,
                                            char *err, size_t err_len);

struct kvd_config_field {
    const char *name;          /* "store.arena_size" */
    const char *default_value; /* text parsed like any other source */
    const char *doc;           /* one line shown by --print-config */
    kvd_config_parse_fn parse; /* one of the kvd_config_parse_* below */
    size_t offset;             /* offsetof(settings struct, member) */
    /* Range for integer, size and duration fields (inclusive; max 0 means
     * no upper bound); NULL-terminated allowed values for enum fields. */
    int64_t min, max;
    const char *const *choices;
};

/* Parsers for the common field types; destination types in parentheses. */
KVD_API kvd_status_t kvd_config_parse_bool(const kvd_config_field_t *field,
                                           const char *text, void *dst,
                                           char *err, size_t err_len);
/* (int64_t) decimal or 0x hex, range-checked against min/max */
KVD_API kvd_status_t kvd_config_parse_int(const kvd_config_field_t *field,
                                          const char *text, void *dst,
                                          char *err, size_t err_len);
/* (uint64_t bytes) */
KVD_API kvd_status_t kvd_config_parse_size(const kvd_config_field_t *field,
                                           const char *text, void *dst,
                                           char *err, size_t err_len);
/* (uint64_t milliseconds; sub-millisecond values must be whole ms) */
KVD_API kvd_status_t
kvd_config_parse_duration_ms(const kvd_config_field_t *field, const char *text,
                             void *dst, char *err, size_t err_len);
/* (char[KVD_CONFIG_STRING_MAX]) copied, NUL-terminated; too long is an error */
KVD_API kvd_status_t kvd_config_parse_string(const kvd_config_field_t *field,
                                             const char *text, void *dst,
                                             char *err, size_t err_len);
/* (int index into `choices`) case-sensitive match */
KVD_API kvd_status_t kvd_config_parse_enum(const kvd_config_field_t *field,
                                           const char *text, void *dst,
                                           char *err, size_t err_len);

#define KVD_CONFIG_STRING_MAX 256

/* Size and duration parsing on their own (also used by CLIs). */
KVD_API kvd_status_t kvd_parse_size(const char *text, uint64_t *bytes_out);
KVD_API kvd_status_t kvd_parse_duration_ms(const char *text, uint64_t *ms_out);

/* Creates an empty configuration (no file, no call parameters). */
KVD_API kvd_status_t kvd_config_create(kvd_config_t **config_out);
/* Frees it; NULL is accepted. */
KVD_API void kvd_config_destroy(kvd_config_t *config);

/*
 * Loads a YAML file into `config` (scalars only, nested mappings joined
 * with '.'; sequences are rejected). Keys loaded earlier are replaced.
 * Errors: KVD_ERR_NOT_FOUND (no such file), KVD_ERR_IO, KVD_ERR_INVALID (not
 * a mapping of scalars; the line number is logged and written to `err`).
 */
KVD_API kvd_status_t kvd_config_load_file(kvd_config_t *config,
                                          const char *path, char *err,
                                          size_t err_len);
/* Same, from a buffer (used by the fuzzer and by tests). */
KVD_API kvd_status_t kvd_config_load_yaml(kvd_config_t *config,
                                          const char *yaml, size_t len,
                                          char *err, size_t err_len);

/* Sets a call parameter (highest precedence). Both strings are copied. */
KVD_API kvd_status_t kvd_config_set(kvd_config_t *config, const char *name,
                                    const char *value);

/*
 * Fills `settings` from `table` (`num_fields` entries). `config` may be NULL
 * (environment and defaults only). Every key of `config` whose first
 * dot-separated part matches a prefix used in `table` must name a field of
 * the table: an unknown key such as "store.arena_sise" is KVD_ERR_NOT_FOUND.
 * On any error nothing is guaranteed about `settings`, and the failing name,
 * source and reason are written into `err`.
 */
KVD_API kvd_status_t kvd_config_apply(const kvd_config_t *config,
                                      const kvd_config_field_t *table,
                                      size_t num_fields, void *settings,
                                      char *err, size_t err_len);

/* Writes every field of `table` as "name = value  # doc (default: d, from:
 * call|env|file|default)", resolved exactly as kvd_config_apply would. */
KVD_API kvd_status_t kvd_config_print(const kvd_config_t *config,
                                      const kvd_config_field_t *table,
                                      size_t num_fields, FILE *out);

/* ------------------------------------------------------------------------ */
/* Hashing                                                                  */
/* ------------------------------------------------------------------------ */

#define KVD_SHA256_BYTES 32

/* SHA-256 of `len` bytes (OpenSSL EVP). KVD_ERR_INTERNAL if libcrypto fails. */
KVD_API kvd_status_t kvd_sha256(const void *data, size_t len,
                                uint8_t out[KVD_SHA256_BYTES]);

/* XXH3 64-bit hash (libxxhash), the checksum of stored objects. */
KVD_API uint64_t kvd_xxh3_64(const void *data, size_t len);

/* ------------------------------------------------------------------------ */
/* Block identity (DESIGN.md §3)                                            */
/* ------------------------------------------------------------------------ */

/* One link of the block-hash chain. */
typedef struct kvd_block_hash {
    uint8_t bytes[KVD_SHA256_BYTES];
} kvd_block_hash_t;

/* One multimodal input overlapping a block: its content identifier and the
 * offset of the block's first token inside it, as vLLM keys them. */
typedef struct kvd_mm_extra {
    const char *identifier;
    int64_t offset;
} kvd_mm_extra_t;

/*
 * Everything besides the tokens that changes a block's KV, in the order
 * vLLM's generate_block_hash_extra_keys puts them. All pointers are
 * borrowed for the call; NULL/0 members are absent. If every member is
 * absent the extras encode as CBOR null, like vLLM's None.
 */
typedef struct kvd_block_extras {
    const char *lora_name;        /* LoRA adapter name */
    const kvd_mm_extra_t *mm;     /* multimodal inputs in this block */
    size_t num_mm;                /* */
    const char *cache_salt;       /* tenant salt: first block only */
    const uint8_t *prompt_embeds; /* SHA-256 of the block's prompt-embeds */
} kvd_block_extras_t;

/*
 * The chain's root h_{-1}: SHA-256 of the canonical-CBOR text string
 * `seed`. This equals vLLM's NONE_HASH for hash algorithm "sha256_cbor" when
 * the engine runs with PYTHONHASHSEED=<seed>. kvdepot's documented default
 * seed is KVD_BLOCK_HASH_DEFAULT_SEED.
 */
#define KVD_BLOCK_HASH_DEFAULT_SEED "kvdepot"
KVD_API kvd_status_t kvd_block_hash_seed(const char *seed,
                                         kvd_block_hash_t *root_out);

/*
 * h = SHA-256(canonical_cbor([parent, [tokens...], extras or null])),
 * byte-identical to vLLM's hash_block_tokens with sha256_cbor.
 * `extras` may be NULL. KVD_ERR_INVALID for NULL parent/out, or tokens NULL
 * with num_tokens > 0.
 */
KVD_API kvd_status_t kvd_block_hash(const kvd_block_hash_t *parent,
                                    const uint32_t *tokens, size_t num_tokens,
                                    const kvd_block_extras_t *extras,
                                    kvd_block_hash_t *hash_out);

/*
 * Hashes every full block of `tokens` (num_tokens / block_size blocks; a
 * partial tail is ignored) starting from `root`, writing at most
 * `max_hashes` links to `hashes_out` and their count to `*num_hashes_out`.
 * `first_extras` applies to the first block only, `extras` (may be NULL) to
 * every later one. KVD_ERR_RANGE if max_hashes is too small (nothing is
 * written then), KVD_ERR_INVALID if block_size is 0.
 */
KVD_API kvd_status_t kvd_block_hash_chain(
    const kvd_block_hash_t *root, const uint32_t *tokens, size_t num_tokens,
    size_t block_size, const kvd_block_extras_t *first_extras,
    const kvd_block_extras_t *extras, kvd_block_hash_t *hashes_out,
    size_t max_hashes, size_t *num_hashes_out);

#ifdef __cplusplus
}
#endif

#endif /* KVDEPOT_COMMON_H */
