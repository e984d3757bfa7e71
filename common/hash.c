/*
 * Hash primitives: SHA-256 through OpenSSL's EVP one-shot digest (block
 * identity, docs/architecture.md §5) and XXH3-64 through libxxhash
 * (checksums of stored objects). This is the only file that includes
 * OpenSSL or xxHash headers, and kvd_openssl_status() is the one place
 * libcrypto errors become a kvdepot status.
 *
 * The SHA-256 implementation is fetched from the default provider once per
 * process. Handing EVP_sha256() to EVP_Digest instead would repeat that
 * fetch (a locked lookup in the provider store) on every call, which is
 * measurable when hashing a 16-token block costs a few hundred nanoseconds.
 * The fetched EVP_MD is never freed: it lives as long as the process and
 * freeing it from a destructor could race OpenSSL's own atexit cleanup.
 */
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/evp.h>
#include <xxhash.h>
#if defined(__x86_64__)
#define XXH_DISPATCH_DISABLE_REPLACE 1
#include <xxh_x86dispatch.h>
#endif

#include "common/failpoint_int.h"
#include "common/hash_int.h"
#include "common/log_int.h"

static pthread_once_t kvd_sha256_once = PTHREAD_ONCE_INIT;
static EVP_MD *kvd_sha256_md;

/*
 * Logs every queued libcrypto error for `what` (clearing the thread's error
 * queue, so a later failure is not blamed on this one) and returns the
 * kvdepot status. Any libcrypto failure in a digest is a kvdepot bug or a
 * broken installation, hence KVD_ERR_INTERNAL.
 */
static kvd_status_t kvd_openssl_status(const char *what)
{
    char text[256];
    unsigned long err;
    int logged = 0;

    while ((err = ERR_get_error()) != 0) {
        ERR_error_string_n(err, text, sizeof(text));
        KVD_LOG_ERROR("%s failed: %s", what, text);
        logged = 1;
    }
    if (!logged) {
        KVD_LOG_ERROR("%s failed (no libcrypto error queued)", what);
    }
    return KVD_ERR_INTERNAL;
}

/* One digest context per thread, reused: EVP_Digest would allocate and
 * free a context per call, which costs as much as hashing a block's 100
 * bytes. The key's destructor frees a thread's context when it exits. */
static pthread_key_t kvd_sha256_ctx_key;
static bool kvd_sha256_ctx_key_ok;

static void kvd_sha256_ctx_free(void *ctx)
{
    EVP_MD_CTX_free(ctx);
}

static void kvd_sha256_md_fetch(void)
{
    kvd_sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
    kvd_sha256_ctx_key_ok =
        pthread_key_create(&kvd_sha256_ctx_key, kvd_sha256_ctx_free) == 0;
}

/* This thread's context, or NULL (then the caller uses EVP_Digest). */
static EVP_MD_CTX *kvd_sha256_ctx(void)
{
    if (!kvd_sha256_ctx_key_ok) {
        return NULL;
    }
    EVP_MD_CTX *ctx = pthread_getspecific(kvd_sha256_ctx_key);
    if (ctx == NULL) {
        ctx = EVP_MD_CTX_new();
        if (ctx != NULL && pthread_setspecific(kvd_sha256_ctx_key, ctx) != 0) {
            EVP_MD_CTX_free(ctx);
            ctx = NULL;
        }
    }
    return ctx;
}

KVD_API kvd_status_t kvd_sha256(const void *data, size_t len,
                                uint8_t out[KVD_SHA256_BYTES])
{
    static const uint8_t empty[1];
    uint8_t digest[EVP_MAX_MD_SIZE];
    unsigned int digest_len = 0;

    if ((data == NULL && len != 0) || out == NULL) {
        KVD_LOG_DEBUG("kvd_sha256: NULL %s", out == NULL ? "out" : "data");
        return KVD_ERR_INVALID;
    }
    if (pthread_once(&kvd_sha256_once, kvd_sha256_md_fetch) != 0 ||
        kvd_sha256_md == NULL) {
        return kvd_openssl_status("EVP_MD_fetch(SHA256)");
    }
    /* The failpoint stands in for a broken libcrypto, so callers' handling
     * of KVD_ERR_INTERNAL is tested. */
    if (KVD_FAILPOINT("hash.sha256") != 0) {
        return kvd_openssl_status("EVP_Digest(SHA256) (failpoint hash.sha256)");
    }
    const void *in = data != NULL ? data : empty;
    EVP_MD_CTX *ctx = kvd_sha256_ctx();
    int ok = ctx != NULL ? EVP_DigestInit_ex2(ctx, kvd_sha256_md, NULL) == 1 &&
                               EVP_DigestUpdate(ctx, in, len) == 1 &&
                               EVP_DigestFinal_ex(ctx, digest, &digest_len) == 1
                         : EVP_Digest(in, len, digest, &digest_len,
                                      kvd_sha256_md, NULL) == 1;
    if (!ok) {
        return kvd_openssl_status("EVP_Digest(SHA256)");
    }
    if (digest_len != KVD_SHA256_BYTES) {
        KVD_LOG_ERROR("EVP_Digest(SHA256) returned %u bytes, expected %d",
                      digest_len, KVD_SHA256_BYTES);
        return KVD_ERR_INTERNAL;
    }
    memcpy(out, digest, KVD_SHA256_BYTES);
    return KVD_OK;
}

KVD_API uint64_t kvd_xxh3_64(const void *data, size_t len)
{
    /* The header promises no status here; a NULL buffer hashes as the empty
     * input rather than crashing inside libxxhash. */
    if (data == NULL) {
        return XXH3_64bits(NULL, 0);
    }
    /* libxxhash's dispatching entry picks its AVX2/AVX-512 loop when the
     * CPU has one (the plain entry is built for baseline x86-64): same
     * value, about 4x the speed on large objects. */
#if defined(__x86_64__)
    return XXH3_64bits_dispatch(data, len);
#else
    return XXH3_64bits(data, len);
#endif
}

/* A kvd_xxh3_stream_t pointer is libxxhash's XXH3_state_t under another
 * name (the header keeps xxHash out of its includers). */

kvd_xxh3_stream_t *kvd_xxh3_stream_new(void)
{
    XXH3_state_t *st = XXH3_createState();
    if (st != NULL && XXH3_64bits_reset(st) != XXH_OK) {
        XXH3_freeState(st);
        st = NULL;
    }
    return (kvd_xxh3_stream_t *)st;
}

void kvd_xxh3_stream_update(kvd_xxh3_stream_t *s, const void *data, size_t len)
{
    if (len == 0) {
        return;
    }
#if defined(__x86_64__)
    (void)XXH3_64bits_update_dispatch((XXH3_state_t *)s, data, len);
#else
    (void)XXH3_64bits_update((XXH3_state_t *)s, data, len);
#endif
}

uint64_t kvd_xxh3_stream_digest(const kvd_xxh3_stream_t *s)
{
    return XXH3_64bits_digest((const XXH3_state_t *)s);
}

void kvd_xxh3_stream_free(kvd_xxh3_stream_t *s)
{
    XXH3_freeState((XXH3_state_t *)s);
}
