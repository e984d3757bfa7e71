/*
 * Shared body of the proto fuzz targets (fuzz_<message>.c): each target is
 * one KVD_FUZZ_PROTO_TARGET line naming its message type.
 *
 * For every input: unpack must either refuse it (KVD_ERR_PROTO, or
 * KVD_ERR_NOMEM) or return a message that is valid; that message must pack;
 * the packed bytes must unpack again (a valid message always fits the
 * limits and the memory budget, or peers could send what they cannot
 * receive); and packing the second message must give the same bytes
 * (protobuf-c's encoding is canonical, so anything else means a field was
 * read differently than it was written). Any breach calls abort(), which
 * libFuzzer and the replay driver report as a crash.
 */
#ifndef KVD_TESTS_FUZZ_PROTO_INT_H
#define KVD_TESTS_FUZZ_PROTO_INT_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto/kvd_proto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static inline void kvd_fuzz_proto_die(kvd_proto_msg_t type, const char *what,
                                      kvd_status_t status, const char *reason)
{
    fprintf(stderr, "fuzz %s: %s: %s (%s)\n", kvd_proto_msg_name(type), what,
            kvd_status_str(status), reason);
    abort();
}

static inline int kvd_fuzz_proto_one(kvd_proto_msg_t type, const uint8_t *data,
                                     size_t size)
{
    char reason[KVD_PROTO_REASON_MAX] = "";
    ProtobufCMessage *first = NULL, *second = NULL;
    uint8_t *bytes1 = NULL, *bytes2 = NULL;
    size_t len1 = 0, len2 = 0;

    kvd_status_t status =
        kvd_proto_unpack(type, data, size, &first, reason, sizeof(reason));
    if (status == KVD_ERR_PROTO || status == KVD_ERR_NOMEM) {
        return 0;
    }
    if (status != KVD_OK) {
        kvd_fuzz_proto_die(type, "unpack", status, reason);
    }
    status = kvd_proto_pack_alloc(type, first, &bytes1, &len1, reason,
                                  sizeof(reason));
    if (status != KVD_OK) {
        kvd_fuzz_proto_die(type, "pack of an unpacked message", status, reason);
    }
    status =
        kvd_proto_unpack(type, bytes1, len1, &second, reason, sizeof(reason));
    if (status != KVD_OK) {
        kvd_fuzz_proto_die(type, "unpack of a packed message", status, reason);
    }
    status = kvd_proto_pack_alloc(type, second, &bytes2, &len2, reason,
                                  sizeof(reason));
    if (status != KVD_OK) {
        kvd_fuzz_proto_die(type, "second pack", status, reason);
    }
    if (len1 != len2 || memcmp(bytes1, bytes2, len1) != 0) {
        kvd_fuzz_proto_die(type, "re-encoding differs", KVD_ERR_INTERNAL, "");
    }
    free(bytes2);
    free(bytes1);
    kvd_proto_free(second);
    kvd_proto_free(first);
    return 0;
}

/* Defines the libFuzzer entry point for message type KVD_PROTO_MSG_<UPPER>. */
#define KVD_FUZZ_PROTO_TARGET(UPPER)                                           \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)               \
    {                                                                          \
        return kvd_fuzz_proto_one(KVD_PROTO_MSG_##UPPER, data, size);          \
    }

#endif /* KVD_TESTS_FUZZ_PROTO_INT_H */
