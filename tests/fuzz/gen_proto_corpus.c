/*
 * Writes the seed corpus of the proto fuzz targets: for every top-level
 * message, its valid sample shapes (proto_samples_int.h) plus malformed
 * variants of them: truncated in the middle, one byte flipped, a length
 * prefix pointing past the end, an unknown field appended (valid), and the
 * empty input. The outputs are committed under tests/fuzz/corpus/<message>/
 * and replayed by ctest (fuzz_<message>_corpus).
 *
 * Regenerate after changing the schema or the samples:
 *   cmake --build build/dev --target gen_proto_corpus
 *   build/dev/tests/fuzz/gen_proto_corpus tests/fuzz/corpus
 * Files are named gen-*, so crashers saved by hand next to them (any other
 * name) are left alone. The output is deterministic.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "proto_samples_int.h"

static int write_file(const char *dir, const char *name, const uint8_t *data,
                      size_t len)
{
    char path[4096];
    int n = snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= sizeof(path)) {
        fprintf(stderr, "gen_proto_corpus: path too long\n");
        return -1;
    }
    FILE *f = fopen(path, "wb");
    if (f == NULL) {
        fprintf(stderr, "gen_proto_corpus: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t written = len > 0 ? fwrite(data, 1, len, f) : 0;
    int rc = fclose(f);
    if (written != len || rc != 0) {
        fprintf(stderr, "gen_proto_corpus: %s: write failed\n", path);
        return -1;
    }
    return 0;
}

/* Writes the variants derived from one valid encoding. */
static int write_derived(const char *dir, unsigned variant, const uint8_t *buf,
                         size_t len)
{
    char name[64];
    uint8_t *copy = malloc(len + 4);
    if (copy == NULL) {
        return -1;
    }
    int rc = 0;
    if (len > 1) {
        snprintf(name, sizeof(name), "gen-truncated-%u", variant);
        rc |= write_file(dir, name, buf, len / 2 + 1);
        memcpy(copy, buf, len);
        copy[len / 3] ^= 0x5a;
        snprintf(name, sizeof(name), "gen-flipped-%u", variant);
        rc |= write_file(dir, name, copy, len);
    }
    /* Field 2, length-delimited, claiming 127 bytes that are not there. */
    memcpy(copy, buf, len);
    copy[len] = 0x12;
    copy[len + 1] = 0x7f;
    snprintf(name, sizeof(name), "gen-overlong-%u", variant);
    rc |= write_file(dir, name, copy, len + 2);
    /* Field 1000 as a varint: unknown to every message, so still valid. */
    memcpy(copy, buf, len);
    copy[len] = 0xc0;
    copy[len + 1] = 0x3e;
    copy[len + 2] = 0x01;
    snprintf(name, sizeof(name), "gen-unknown-%u", variant);
    rc |= write_file(dir, name, copy, len + 3);
    free(copy);
    return rc;
}

static int make_dir(const char *path)
{
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "gen_proto_corpus: %s: %s\n", path, strerror(errno));
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
        return 2;
    }
    if (make_dir(argv[1]) != 0) {
        return 1;
    }
    static kvd_samples_t samples;
    size_t files = 0;
    for (int t = 0; t < KVD_PROTO_MSG_COUNT; t++) {
        kvd_proto_msg_t type = (kvd_proto_msg_t)t;
        char dir[4096];
        snprintf(dir, sizeof(dir), "%s/%s", argv[1], kvd_proto_msg_name(type));
        if (make_dir(dir) != 0 || write_file(dir, "gen-empty", NULL, 0) != 0) {
            return 1;
        }
        files++;
        for (unsigned v = 0; v < KVD_SAMPLES_VARIANTS; v++) {
            kvd_samples_init(&samples, v);
            uint8_t *buf;
            size_t len;
            char reason[KVD_PROTO_REASON_MAX];
            kvd_status_t status =
                kvd_proto_pack_alloc(type, kvd_samples_get(&samples, type),
                                     &buf, &len, reason, sizeof(reason));
            if (status != KVD_OK) {
                fprintf(stderr, "gen_proto_corpus: %s variant %u: %s\n",
                        kvd_proto_msg_name(type), v, reason);
                return 1;
            }
            char name[64];
            snprintf(name, sizeof(name), "gen-valid-%u", v);
            int rc = write_file(dir, name, buf, len);
            rc |= write_derived(dir, v, buf, len);
            free(buf);
            if (rc != 0) {
                return 1;
            }
            files += 5;
        }
    }
    printf("gen_proto_corpus: wrote about %zu files under %s\n", files,
           argv[1]);
    return 0;
}
