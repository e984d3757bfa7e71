/*
 * Fuzz target for the shared-memory hand-off messages (client/handoff.h):
 * the daemon decodes a HELLO from any local process that can connect, and a
 * client decodes the daemon's REPLY before mapping the descriptor it
 * carries. Each input is decoded as both; whatever decodes must re-encode
 * to the same bytes.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "client/handoff.h"

/* libFuzzer's fixed entry point name. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size); // NOLINT

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[128];
    if (kvd_handoff_hello_decode(data, size, err, sizeof err) == KVD_OK) {
        uint8_t again[KVD_HANDOFF_HELLO_BYTES];
        kvd_handoff_hello_encode(again);
        if (memcmp(again, data, sizeof again) != 0) {
            abort();
        }
    }
    kvd_handoff_reply_t r;
    if (kvd_handoff_reply_decode(data, size, &r, err, sizeof err) == KVD_OK) {
        uint8_t again[KVD_HANDOFF_REPLY_BYTES];
        kvd_handoff_reply_encode(&r, again);
        if (memcmp(again, data, sizeof again) != 0 ||
            (r.status == KVD_OK &&
             (r.size_bytes == 0 || r.size_bytes > r.map_bytes ||
              r.offset % 4096 != 0 || r.offset + r.size_bytes < r.offset))) {
            abort();
        }
    }
    return 0;
}
