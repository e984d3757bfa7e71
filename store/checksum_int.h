/*
 * Checksums the store remembers (implemented in store.c): an object whose
 * bytes a writer has checked against their XXH3-64 at commit keeps that
 * value in its L1 entry, so a reader that needs it (the cluster data plane
 * sending the object to another node) does not read 2 MiB again to
 * compute it. Writers that check: the daemon's Commit with
 * server.verify_commits (the client's checksum, verified), and the cluster
 * data plane committing a fetched object (verified on arrival).
 *
 * A remembered checksum describes the bytes as they were checked: a
 * process that writes into a committed slot afterwards (a broken client
 * mapping the arena) makes the object fail a peer's verification instead
 * of travelling with a checksum of the damaged bytes.
 *
 * Embedded stores only (a daemon-mode store has no L1 here). Threading:
 * any thread, as the other store calls.
 */
#ifndef KVD_STORE_CHECKSUM_INT_H
#define KVD_STORE_CHECKSUM_INT_H

#include <stdbool.h>
#include <stdint.h>

#include "kvdepot/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kvd_store_commit of one key whose bytes the caller has checked against
 * `xxh3` (XXH3-64 of the whole object); the entry remembers it. In daemon
 * mode the same as kvd_store_commit. Errors: as kvd_store_commit. */
kvd_status_t kvd_store_commit_checksum(kvd_store_t *store,
                                       const kvd_store_key_t *key,
                                       uint64_t xxh3);

/* Writes the checksum remembered for the arena object `lease` holds (a
 * HOST lease of this store) to `*xxh3_out`; false when none is remembered
 * (committed without one, or not an embedded store's HOST lease). */
bool kvd_store_lease_checksum(kvd_store_t *store,
                              const kvd_store_lease_t *lease,
                              uint64_t *xxh3_out);

#ifdef __cplusplus
}
#endif

#endif /* KVD_STORE_CHECKSUM_INT_H */
