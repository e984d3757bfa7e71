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
#include <stdbool.h>
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

/* sizeof the public struct named `name` (its typedef, e.g.
 * "kvd_leader_config_t"), 0 for a name this library does not have: for
 * bindings that lay the structs out themselves to check they match. */
KVD_API size_t kvd_struct_size(const char *name);

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

/*
 * One status type for the whole library. KVD_OK is 0; the two positive
 * values are answers, not errors: KVD_INPROGRESS (an asynchronous operation
 * was accepted and completes later) and KVD_AGAIN (not ready: nothing was
 * started, ask again later). Errors are negative and grouped by who must
 * react to them.
 */
typedef enum kvd_status {
    KVD_OK = 0,
    KVD_INPROGRESS = 1,
    KVD_AGAIN = 2,

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
 *      joined with '.': `store: {arena_size: 8g}` -> "store.arena_size";
 *      a field parsed by kvd_config_parse_pairs takes a mapping of scalars
 *      and one parsed by kvd_config_parse_list a sequence of scalars, any
 *      other field a scalar, each error naming the key and line);
 *   4. the field's default.
 * An environment variable set to the empty string counts as unset.
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
    /* Range for integer, size and duration fields, inclusive. min = max = 0
     * means unbounded; otherwise max 0 means no upper bound and a negative
     * min no lower bound. NULL-terminated allowed values for enum fields.
     * A NULL default_value makes the setting required: kvd_config_apply
     * fails with KVD_ERR_NOT_FOUND when no source sets it. */
    int64_t min, max;
    const char *const *choices;
};

/* Parsers for the common field types; destination types in parentheses.
 * Values are trimmed of surrounding whitespace except strings.
 * (bool) true/false, yes/no, on/off, 1/0, case-insensitive */
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
/* (char[KVD_CONFIG_STRING_MAX]) a list: "a,b,c" from the text, or from a
 * YAML sequence [a, b, c] in a file; stored canonical (items trimmed, no
 * empty item; "" is the empty list) */
KVD_API kvd_status_t kvd_config_parse_list(const kvd_config_field_t *field,
                                           const char *text, void *dst,
                                           char *err, size_t err_len);
/* (char[KVD_CONFIG_STRING_MAX]) a map: "k=v,k2=v2" from the text (each
 * item split at its last '='), or from a YAML mapping {k: v, k2: v2} in a
 * file; stored canonical (keys and values trimmed and non-empty) */
KVD_API kvd_status_t kvd_config_parse_pairs(const kvd_config_field_t *field,
                                            const char *text, void *dst,
                                            char *err, size_t err_len);

#define KVD_CONFIG_STRING_MAX 256

/* Size and duration parsing on their own (also used by CLIs). */
KVD_API kvd_status_t kvd_parse_size(const char *text, uint64_t *bytes_out);
KVD_API kvd_status_t kvd_parse_duration_ms(const char *text, uint64_t *ms_out);

/* Creates an empty configuration (no file, no call parameters), owned by
 * the caller until kvd_config_destroy. Errors: KVD_ERR_INVALID (NULL
 * config_out), KVD_ERR_NOMEM. */
KVD_API kvd_status_t kvd_config_create(kvd_config_t **config_out);
/* Frees it; NULL is accepted. No other call may be using it. */
KVD_API void kvd_config_destroy(kvd_config_t *config);

/*
 * Loads a YAML file into `config` (nested mappings joined with '.';
 * sequences of scalars and mappings of scalars are kept for the fields
 * that take lists and pairs: kvd_config_apply refuses them for any other
 * field). Keys loaded earlier are replaced.
 * Errors: KVD_ERR_NOT_FOUND (no such file), KVD_ERR_IO, KVD_ERR_INVALID (not
 * a mapping of scalars; the line number is written to `err`, and logged
 * only when `err` is NULL or `err_len` 0).
 */
KVD_API kvd_status_t kvd_config_load_file(kvd_config_t *config,
                                          const char *path, char *err,
                                          size_t err_len);
/* Same, from a buffer (used by the fuzzer and by tests). */
KVD_API kvd_status_t kvd_config_load_yaml(kvd_config_t *config,
                                          const char *yaml, size_t len,
                                          char *err, size_t err_len);

/* Sets a call parameter (highest precedence), replacing an earlier value
 * of the same name. Both strings are copied; the value is parsed only when
 * a component applies it. Errors: KVD_ERR_INVALID (NULL arguments, an
 * empty or over-long name), KVD_ERR_NOMEM. Thread: any (the config is
 * locked). */
KVD_API kvd_status_t kvd_config_set(kvd_config_t *config, const char *name,
                                    const char *value);

/*
 * Fills `settings` from `table` (`num_fields` entries). `config` may be NULL
 * (environment and defaults only). Every key of `config` whose first
 * dot-separated part matches a prefix used in `table` must name a field of
 * the table: an unknown key such as "store.arena_sise" is KVD_ERR_NOT_FOUND.
 * On any error nothing is guaranteed about `settings`, and the failing name,
 * source and reason are written into `err`; the caller reports it (it is
 * logged at error level only when `err` is NULL or `err_len` 0, so a
 * program that prints `err` shows each error once).
 */
KVD_API kvd_status_t kvd_config_apply(const kvd_config_t *config,
                                      const kvd_config_field_t *table,
                                      size_t num_fields, void *settings,
                                      char *err, size_t err_len);

/* Writes every field of `table` as "name = value  # doc (default: d, from:
 * call|env|file|default)", resolved exactly as kvd_config_apply would
 * (values are not parsed). Errors: KVD_ERR_INVALID (NULL out, a malformed
 * table), KVD_ERR_NOMEM, KVD_ERR_IO (writing to `out` failed). */
KVD_API kvd_status_t kvd_config_print(const kvd_config_t *config,
                                      const kvd_config_field_t *table,
                                      size_t num_fields, FILE *out);

/* Calls `fn` for every field of `table` in order with the value that wins
 * (resolved exactly as kvd_config_apply would; "" when none) and where it
 * came from ("call", "env", "file", "default" or "none"). The strings are
 * valid during the call only; the config is locked meanwhile, so `fn` must
 * not call back into it. A status other than KVD_OK from `fn` stops the walk
 * and is returned. */
typedef kvd_status_t (*kvd_config_visit_fn)(void *ctx,
                                            const kvd_config_field_t *field,
                                            const char *value,
                                            const char *source);
KVD_API kvd_status_t kvd_config_visit(const kvd_config_t *config,
                                      const kvd_config_field_t *table,
                                      size_t num_fields, kvd_config_visit_fn fn,
                                      void *ctx);

/* ------------------------------------------------------------------------ */
/* Hashing                                                                  */
/* ------------------------------------------------------------------------ */

#define KVD_SHA256_BYTES 32

/* SHA-256 of `len` bytes (OpenSSL EVP). KVD_ERR_INVALID for a NULL `out`
 * or NULL `data` with len > 0; KVD_ERR_INTERNAL if libcrypto fails. */
KVD_API kvd_status_t kvd_sha256(const void *data, size_t len,
                                uint8_t out[KVD_SHA256_BYTES]);

/* XXH3 64-bit hash (libxxhash), the checksum of stored objects. NULL `data`
 * hashes as empty input. */
KVD_API uint64_t kvd_xxh3_64(const void *data, size_t len);

/* ------------------------------------------------------------------------ */
/* Block identity (docs/architecture.md §5)                                 */
/* ------------------------------------------------------------------------ */

/* One link of the block-hash chain. */
typedef struct kvd_block_hash {
    uint8_t bytes[KVD_SHA256_BYTES];
} kvd_block_hash_t;

/* Namespace digest (docs/architecture.md §5): 16 bytes naming everything
 * that makes stored bytes incompatible (model, dtype, codec, layers, heads
 * held, head size, block size, shard). Object key = (namespace, block
 * hash). */
#define KVD_NAMESPACE_BYTES 16
typedef struct kvd_namespace {
    uint8_t bytes[KVD_NAMESPACE_BYTES];
} kvd_namespace_t;

/*
 * What makes stored bytes incompatible (docs/protocol.md), the fields of
 * kvdepot.v1.NamespaceDescriptor: dtype and codecs are that schema's enum
 * numbers (Dtype, Codec), v_codec 0 when kv_combined.
 */
typedef struct kvd_namespace_desc {
    const char *model_id; /* 1..256 bytes of UTF-8 */
    uint32_t dtype;
    uint32_t k_codec, v_codec;
    uint32_t num_layers, first_layer;
    uint32_t num_kv_heads, head_start, total_kv_heads;
    uint32_t head_dim;
    uint32_t block_size;
    uint32_t tp_size, tp_rank;
    bool kv_combined;
    /* Everything else the engine knows that changes the bytes (digest v2).
     * Zero or NULL means "not given"; every one enters the digest, so two
     * descriptors that differ in any of them never share an object. */
    uint32_t format_version;    /* object format; 0 = KVD_OBJECT_FORMAT_V */
    uint64_t tq_seed;           /* TurboQuant seed when a plane uses it */
    const char *model_revision; /* weights revision (HF commit, tag) */
    const char *weight_quant;   /* weight quantization ("awq", "fp8") */
    /* Caller's canonical text of whatever overrides the model config and
     * changes attention (hf_overrides, rope scaling/theta), e.g. JSON with
     * sorted keys; the digest only needs it to be stable. */
    const char *model_overrides;
    uint32_t sliding_window; /* tokens; 0 = none */
    /* Bumped when the engine's weights change in place or its cache is
     * reset (vLLM reset_cache): objects saved before are never matched. */
    uint64_t generation;
} kvd_namespace_desc_t;

/* The stored-object format this library writes: the payload of
 * kvdepot/kernels.h followed by the object header (kvd_object_header_*).
 * Version 1 was the payload alone. Part of every namespace digest, so
 * objects of another format are never looked up at all. */
#define KVD_OBJECT_FORMAT_V 2u

/*
 * The namespace digest: the first 16 bytes of SHA-256 over the canonical
 * CBOR array ["kvdepot-namespace-v2", model_id, dtype, k_codec, v_codec,
 * num_layers, first_layer, num_kv_heads, head_start, total_kv_heads,
 * head_dim, block_size, tp_size, tp_rank, kv_combined, format_version,
 * tq_seed, model_revision, weight_quant, model_overrides, sliding_window,
 * generation] (docs/protocol.md): a format_version of 0 is encoded as
 * KVD_OBJECT_FORMAT_V, a NULL string as "". Any process, in any language,
 * that encodes the same fields gets the same digest. KVD_ERR_INVALID for
 * NULL arguments, an empty or over-long model_id (256 bytes), an optional
 * string over 65536 bytes, a zero count (layers, heads, head_dim,
 * block_size, tp_size), head_start + num_kv_heads > total_kv_heads,
 * tp_rank >= tp_size, or a format_version other than 0 and
 * KVD_OBJECT_FORMAT_V (this library cannot read or write another).
 */
KVD_API kvd_status_t kvd_namespace_digest(const kvd_namespace_desc_t *desc,
                                          kvd_namespace_t *ns_out);

/*
 * One multimodal input overlapping a block, as vLLM's
 * _gen_mm_extra_hash_keys keys it: the tuple (identifier, offset) where
 * `identifier` is the input's MultiModalFeatureSpec.identifier (its content
 * hash, with the LoRA prefix vLLM adds when a LoRA is active) and `offset`
 * is where the input starts relative to the block's first token
 * (mm_position.offset - block start): 0 or more when it starts inside the
 * block, negative when it began in an earlier block. Encoded as the CBOR
 * array [text identifier, int offset].
 */
typedef struct kvd_mm_extra {
    const char *identifier; /* NUL-terminated UTF-8; must not be NULL */
    int64_t offset;
} kvd_mm_extra_t;

/*
 * Everything besides the tokens that changes a block's KV, mirroring vLLM's
 * generate_block_hash_extra_keys: the extras tuple is, in this order,
 *   lora_name (text)                   if lora_name is not NULL,
 *   one [identifier, offset] per mm[i] for i < num_mm,
 *   cache_salt (text)                  if cache_salt is neither NULL nor "",
 *   prompt-embeds digest (32-byte bstr) if prompt_embeds is not NULL.
 * If none is present the extras encode as CBOR null, like vLLM's None. An
 * empty lora_name "" is present (vLLM tests the LoRA request, not its name);
 * an empty cache_salt is absent (vLLM tests the salt's truthiness).
 *
 * vLLM adds cache_salt to the block that starts at token 0 only, and the
 * mm entries differ per block; kvd_block_hash encodes exactly the extras it
 * is given, so computing them per block is the caller's job (see
 * kvd_block_hash_chain for the common case). All pointers are borrowed for
 * the call.
 */
typedef struct kvd_block_extras {
    const char *lora_name;    /* LoRA adapter name (lora_request.lora_name) */
    const kvd_mm_extra_t *mm; /* multimodal inputs overlapping this block */
    size_t num_mm;            /* entries in mm; mm may be NULL only if 0 */
    const char *cache_salt;   /* tenant salt: first block only */
    /* KVD_SHA256_BYTES bytes: SHA-256 of the raw bytes of this block's
     * slice of the prompt embeddings tensor, as vLLM's
     * _gen_prompt_embeds_extra_hash_keys computes it. */
    const uint8_t *prompt_embeds;
} kvd_block_extras_t;

/*
 * The chain's root h_{-1}: SHA-256 of the canonical-CBOR text string
 * `seed` (NUL-terminated UTF-8). This equals vLLM's NONE_HASH for hash
 * algorithm "sha256_cbor" when the engine runs with PYTHONHASHSEED=<seed>
 * (init_none_hash). kvdepot's documented default seed is
 * KVD_BLOCK_HASH_DEFAULT_SEED. KVD_ERR_INVALID for NULL seed or root_out;
 * KVD_ERR_NOMEM if a very long seed cannot be buffered.
 */
#define KVD_BLOCK_HASH_DEFAULT_SEED "kvdepot"
KVD_API kvd_status_t kvd_block_hash_seed(const char *seed,
                                         kvd_block_hash_t *root_out);

/*
 * h = SHA-256(canonical_cbor([parent, [tokens...], extras or null])),
 * byte-identical to vLLM's hash_block_tokens with sha256_cbor: parent is a
 * 32-byte bstr, tokens unsigned integers, extras as kvd_block_extras_t
 * describes. `extras` may be NULL (same as all members absent). A block of
 * up to 64 tokens with small extras is encoded on the stack; only larger
 * ones allocate. KVD_ERR_INVALID for NULL parent/out, tokens NULL with
 * num_tokens > 0, mm NULL with num_mm > 0, or a NULL mm identifier;
 * KVD_ERR_NOMEM if a large block cannot be buffered. `*hash_out` is
 * written only on success.
 */
KVD_API kvd_status_t kvd_block_hash(const kvd_block_hash_t *parent,
                                    const uint32_t *tokens, size_t num_tokens,
                                    const kvd_block_extras_t *extras,
                                    kvd_block_hash_t *hash_out);

/*
 * Hashes every full block of `tokens` (num_tokens / block_size blocks; a
 * partial tail is ignored) starting from `root`, writing at most
 * `max_hashes` links to `hashes_out` and their count to `*num_hashes_out`.
 * Block 0 is hashed with `first_extras` and every later block with
 * `extras` (either may be NULL; first_extras replaces extras on block 0, it
 * is not merged with it). vLLM's usual case is extras = {lora_name} and
 * first_extras = {lora_name, cache_salt}; requests with multimodal inputs
 * need per-block extras and use kvd_block_hash block by block. Every block
 * reuses one encoding buffer. KVD_ERR_INVALID for NULL root or
 * num_hashes_out, tokens NULL with num_tokens > 0, hashes_out NULL with
 * max_hashes > 0, or block_size 0; KVD_ERR_RANGE if max_hashes is smaller
 * than the number of full blocks (nothing is written then); otherwise
 * kvd_block_hash's errors, after which `hashes_out` holds unspecified bytes
 * and `*num_hashes_out` is not written.
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
