/*
 * Fuzz target for the index's on-disk record decoder
 * (kvd_index_record_unpack): the bytes LMDB hands back after a crash, a
 * disk error or a hostile edit of index.mdb. Input = 48-byte key followed by
 * the stored record bytes. A record that decodes must re-encode to exactly
 * the same bytes (the format is canonical), under the same key; anything
 * else must be KVD_ERR_CORRUPT, never a crash.
 *
 * Seeds in corpus/index_record/ were written with kvd_index_record_pack
 * (valid host and disk records) and by hand (truncated, wrong version, bad
 * check, wrong key).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store/index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvd_store_key_t key;
    kvd_index_entry_t entry;
    uint8_t again[KVD_INDEX_RECORD_BYTES];

    if (size < sizeof(key)) {
        return 0;
    }
    memcpy(&key, data, sizeof(key));
    const uint8_t *rec = data + sizeof(key);
    size_t len = size - sizeof(key);

    kvd_status_t st = kvd_index_record_unpack(&key, rec, len, &entry);
    if (st == KVD_OK) {
        if (len != KVD_INDEX_RECORD_BYTES ||
            memcmp(&entry.key, &key, sizeof(key)) != 0 ||
            kvd_index_record_pack(&entry, again) != KVD_OK ||
            memcmp(again, rec, sizeof(again)) != 0) {
            abort(); /* decoded something it would not write back */
        }
    } else if (st != KVD_ERR_CORRUPT) {
        abort(); /* untrusted bytes must only ever be "corrupt" */
    }
    return 0;
}
