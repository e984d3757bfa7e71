/*
 * kvdepot store: the one interface to the store, in both of its modes
 * (docs/architecture.md §4).
 *
 * A store keeps KV objects (one engine block x this worker's layers,
 * docs/codecs.md) in two tiers: the host arena (L1, shared memory that
 * workers read and write directly) and, when `store.disk_path` is set, NVMe
 * files (L2) whose LMDB index survives restarts and crashes. The store
 * treats an object as opaque bytes of a fixed size per call; callers name
 * objects by (namespace digest, block hash).
 *
 * Modes (`store.mode`, read by kvd_store_open):
 *   embedded  (default) the arena, the NVMe tier and the index live in this
 *             process.
 *   daemon    the calls go to the kvdepotd at `store.address` on this node
 *             (docs/daemon.md), which owns the tiers; this process maps the
 *             daemon's arena, so object bytes never cross a socket.
 * Every call below behaves the same in both modes except where its comment
 * says otherwise. In daemon mode a call that asks the daemon has a deadline
 * (`store.timeout`) and may also fail with the failed call's status:
 * KVD_ERR_UNREACHABLE (no daemon answers), KVD_ERR_TIMEOUT (the deadline
 * passed), KVD_ERR_RPC or KVD_ERR_AUTH (transport, credentials),
 * KVD_ERR_PROTO (a reply that fails validation), KVD_ERR_NOMEM, or the
 * daemon's own status for the call. A dead daemon is never a hang. After a
 * daemon restart the client maps the new arena by itself; leases and
 * reservations taken from the old daemon are gone with it and report
 * KVD_ERR_NOT_FOUND.
 *
 * Save:   kvd_store_reserve() gives each new key an arena slot (evicting
 *         colder objects if needed); the caller writes the object's bytes at
 *         kvd_store_reservation_ptr() (or through its own mapping of
 *         kvd_store_arena_export()), then kvd_store_commit() publishes them
 *         or kvd_store_abort() gives the slots back.
 * Load:   kvd_store_lookup() finds the longest stored prefix of a hash chain
 *         and leases every object of it, so none can be evicted or deleted
 *         before the caller is done. A lease on the HOST tier can be read at
 *         once; one on the DISK tier is brought into the arena with
 *         kvd_store_get_submit() (asynchronous, completion polled), which
 *         turns it into a HOST lease. Every lease is given back with
 *         kvd_store_release().
 * Tiers:  with write-back (default) an object evicted from the arena is
 *         written to NVMe (if the admission filter lets it) before its slot
 *         is reused; with write-through every commit is also written to
 *         NVMe at once. An NVMe object is indexed only after its bytes are
 *         written, so after a restart or a kill -9 the store serves every
 *         indexed object and nothing torn. Each NVMe object's XXH3-64 is in
 *         the index and checked on every read: a mismatch fails the read
 *         with KVD_ERR_CHECKSUM and drops the object.
 *
 * Settings (kvd_store_print_config lists them with their docs): every
 * `store.*` key, from the call's kvd_config_t, KVDEPOT_STORE_* environment
 * variables, a YAML file loaded into the config, then defaults.
 *
 * Ownership: arguments are borrowed for the call; nothing passed in is
 * retained. Pointers into the arena say how long they stay valid.
 *
 * Threading: every call is thread-safe except that kvd_store_open and
 * kvd_store_close must not overlap any other call on the store, and
 * kvd_store_poll / kvd_store_wait are for one polling thread at a time.
 * Internal threads (NVMe completions, write-back; in daemon mode the
 * client's get thread) never call user code; results come back through
 * kvd_store_poll.
 */
#ifndef KVDEPOT_STORE_H
#define KVDEPOT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvd_store kvd_store_t;

/* An object's name: 48 bytes, no padding. */
typedef struct kvd_store_key {
    kvd_namespace_t ns;
    kvd_block_hash_t hash;
} kvd_store_key_t;

typedef enum kvd_store_tier {
    KVD_STORE_TIER_NONE = 0,
    KVD_STORE_TIER_HOST = 1, /* in the arena: read at arena_offset */
    KVD_STORE_TIER_DISK = 2  /* on NVMe: kvd_store_get_submit() first */
} kvd_store_tier_t;

/* A lease on one stored object, written by kvd_store_lookup() and
 * kvd_store_poll(). Pass it back unchanged to get_submit / release. */
typedef struct kvd_store_lease {
    kvd_store_key_t key;
    uint32_t tier;         /* kvd_store_tier_t */
    uint32_t reserved;     /* the store's own (daemon mode: its lease group) */
    uint64_t arena_offset; /* HOST: slot's byte offset in the arena */
    uint64_t size_bytes;   /* the object's size */
} kvd_store_lease_t;

/*
 * Opens a store with the `store.*` settings resolved from `config` (may be
 * NULL: environment and defaults only; borrowed for the call). Every
 * `store.*` key is checked, whichever mode it belongs to.
 *
 * Embedded mode: creates the arena and starts the I/O thread; when
 * store.disk_path is set, opens (or creates) the NVMe files and the index
 * beside them and rebuilds the disk tier's table from the index (objects
 * whose extent is unusable are dropped from the index and logged).
 *
 * Daemon mode: connects to the kvdepotd at store.address ("unix:PATH"),
 * receives its arena over the hand-off socket PATH.shm and maps it, checks
 * that the daemon answers a ping over gRPC within store.timeout, and starts
 * the client's get thread. A daemon that goes away later is not an open
 * error: the calls then fail as the header's opening comment says.
 *
 * On success *store_out is the store, valid until kvd_store_close. Errors
 * (nothing is left open; `*store_out` untouched; the reason is written to
 * `err`, at most `err_len` bytes, may be NULL when err_len is 0):
 *   KVD_ERR_INVALID      store_out NULL; a malformed setting; daemon mode:
 *                        store.address is not unix:PATH (or the path is
 *                        too long for a unix socket);
 *   KVD_ERR_NOT_FOUND / KVD_ERR_RANGE  a setting is unknown
 *                        ("store.arena_sise") or out of range;
 *   KVD_ERR_NOMEM        no memory (either mode);
 * embedded mode, from the arena, the NVMe files or the index:
 *   KVD_ERR_NOSPACE, KVD_ERR_IO, KVD_ERR_CORRUPT, KVD_ERR_UNSUPPORTED, or
 *   another translated errno;
 * daemon mode:
 *   KVD_ERR_UNREACHABLE  no daemon listens at PATH.shm, or gRPC cannot
 *                        reach it;
 *   KVD_ERR_TIMEOUT      the hand-off reply or the ping did not come
 *                        within store.timeout;
 *   KVD_ERR_PROTO        a malformed hand-off reply (or one without the
 *                        arena's descriptor), or an invalid ping reply;
 *   KVD_ERR_UNSUPPORTED  the daemon speaks another hand-off version;
 *   KVD_ERR_PEER         the daemon closed the hand-off without a reply;
 *   KVD_ERR_AUTH, KVD_ERR_RPC  the ping was refused or failed in gRPC;
 *   the daemon's refusal status in the hand-off reply, or the arena's
 *   mapping failing (a translated errno).
 * Thread: any; the store is not shared before this returns.
 */
KVD_API kvd_status_t kvd_store_open(const kvd_config_t *config,
                                    kvd_store_t **store_out, char *err,
                                    size_t err_len);

/*
 * Clean stop, then frees the store; every pointer it gave out (arena,
 * lease and reservation pointers, kvd_store_fd) is invalid afterwards.
 * Embedded mode: with a disk tier, first writes the arena's objects to
 * NVMe as kvd_store_flush does, for at most store.stop_flush_timeout
 * (default 30 s; 0: not at all), and logs how many it wrote and how many
 * it left; then cancels gets not yet completed (they are not polled any
 * more), finishes the NVMe writes already queued and indexes them, syncs
 * the NVMe files and the index. Objects still only in the arena are lost
 * (the arena is memory). Leases still held are dropped.
 * Daemon mode: stops the get thread, gives the daemon back the leases
 * still held (reservations are left to the daemon's reservation TTL) and
 * unmaps the arena; the daemon's objects stay.
 * NULL is accepted. Must not overlap any other call on the store.
 */
KVD_API void kvd_store_close(kvd_store_t *store);

/* Writes every `store.*` setting with its value, source and doc, resolved
 * from `config` (may be NULL) as kvd_store_open would, one line each; the
 * values are not checked (kvd_store_check_config does that). Errors:
 * KVD_ERR_INVALID (NULL out), KVD_ERR_NOMEM, KVD_ERR_IO (writing to `out`
 * failed; part of the list may have been written). Thread: any. */
KVD_API kvd_status_t kvd_store_print_config(const kvd_config_t *config,
                                            FILE *out);

/* kvd_config_visit over every `store.*` setting (config may be NULL): `fn`
 * gets each setting's winning value and its source; the strings are valid
 * during that call of `fn` only. Errors: KVD_ERR_INVALID (NULL fn),
 * KVD_ERR_NOMEM, or the first status other than KVD_OK that `fn` returned
 * (the walk stops there). Thread: any; `fn` must not call back into
 * `config`. */
KVD_API kvd_status_t kvd_store_visit_config(const kvd_config_t *config,
                                            kvd_config_visit_fn fn, void *ctx);

/* Resolves and checks every `store.*` setting as kvd_store_open would,
 * without opening anything: KVD_OK, or the error with the key and the
 * reason in `err` (for `--print-config` and config checkers): as
 * kvd_store_open's setting errors (KVD_ERR_INVALID, KVD_ERR_NOT_FOUND,
 * KVD_ERR_RANGE) or KVD_ERR_NOMEM. What only a daemon can tell (is
 * store.address unix:PATH, does a daemon answer) is checked by
 * kvd_store_open. Writes the mode into *daemon_mode_out (may be NULL),
 * on success only: true for store.mode daemon. Thread: any. */
KVD_API kvd_status_t kvd_store_check_config(const kvd_config_t *config,
                                            bool *daemon_mode_out, char *err,
                                            size_t err_len);

/* ---- the arena, for the bytes --------------------------------------- */

/* Pointer to [arena_offset, +len) in this process's mapping of the arena,
 * or NULL when the range is outside it, len is 0 or store is NULL. Valid
 * until kvd_store_close. Thread: any. In
 * daemon mode this is the arena of the daemon as it is now: after a daemon
 * restart, an offset from an earlier lease or reservation names a slot of
 * the new arena that holds something else. Use kvd_store_lease_ptr and
 * kvd_store_reservation_ptr for the bytes of a lease or a reservation. */
KVD_API void *kvd_store_arena_ptr(kvd_store_t *store, uint64_t arena_offset,
                                  uint64_t len);

/*
 * Keeps the arena this process maps now mapped until the matching
 * kvd_store_arena_unhold, and says where it is: for memory registered with
 * a device (cudaHostRegister), which must stay mapped while it is
 * registered. In daemon mode a restarted daemon's arena is otherwise
 * unmapped once nothing of it is held (kvd_store_lease_ptr). Writes the
 * base, the usable size and the mapping's generation (changes when the
 * client maps a restarted daemon's arena; 0 for an embedded store, whose
 * arena never changes). Errors: KVD_ERR_INVALID (NULL), KVD_ERR_STATE (no
 * arena mapped). Thread: any.
 */
KVD_API kvd_status_t kvd_store_arena_hold(kvd_store_t *store, void **base_out,
                                          uint64_t *size_bytes_out,
                                          uint32_t *generation_out);
/* Undoes one kvd_store_arena_hold of `generation` (an unknown generation
 * or a NULL store: nothing). After the last unhold of a generation that is
 * no longer the current one, its base pointer is invalid. Thread: any. */
KVD_API void kvd_store_arena_unhold(kvd_store_t *store, uint32_t generation);
/* The generation of the arena mapped now (see kvd_store_arena_hold); 0 for
 * an embedded store or a NULL one. Thread: any. */
KVD_API uint32_t kvd_store_arena_generation(kvd_store_t *store);

/*
 * The object of a HOST-tier lease (lease->size_bytes bytes), in the arena
 * the lease was given in, or NULL (not a HOST lease, not held, or that
 * arena is no longer mapped). In daemon mode a daemon restart does not
 * move it: it stays in the old arena, which the client keeps mapped while
 * any lease or reservation of it is held, and the restarted daemon's
 * objects are never reached through it. Valid until the lease is released;
 * daemon mode: NULL once the lease's deadline (store.lease_ttl from the
 * lookup, extended by a get) has passed, and bytes read through an earlier
 * pointer count only if kvd_store_release of the lease answers KVD_OK.
 * Thread: any.
 */
KVD_API void *kvd_store_lease_ptr(kvd_store_t *store,
                                  const kvd_store_lease_t *lease);

/* What another process needs to map the arena: a new O_CLOEXEC descriptor
 * of the sealed memfd, owned by the caller, and the lengths. The memfd may
 * be one partition of the daemon's arena (a tenant with an arena of its
 * own): the mapped bytes are then arena offsets [offset, offset +
 * size_bytes). */
typedef struct kvd_store_arena_export {
    int fd;
    uint64_t map_bytes;  /* length to mmap (MAP_SHARED) */
    uint64_t size_bytes; /* usable bytes from the start of the mapping */
    uint64_t offset;     /* arena offset of the mapping's first byte */
} kvd_store_arena_export_t;

/*
 * Fills *out with a new descriptor of the arena's memfd and its layout.
 * Embedded mode: the main arena (the partition of tenant 0; the daemon
 * hands other tenants their own through its hand-off). Daemon mode: the
 * memfd this process was handed, i.e. the daemon's arena as it is now, or
 * this caller's tenant's partition of it. The caller owns out->fd and must
 * close it; the descriptor keeps the memory alive after kvd_store_close
 * (and, in daemon mode, after a daemon restart, when it no longer names
 * the daemon's arena). *out is written on success only. Errors:
 * KVD_ERR_INVALID (NULL argument), or the translated errno of the dup
 * (e.g. EMFILE: KVD_ERR_IO). Thread: any.
 */
KVD_API kvd_status_t kvd_store_arena_export(kvd_store_t *store,
                                            kvd_store_arena_export_t *out);

/* ---- save ------------------------------------------------------------ */

/* One key's outcome of kvd_store_reserve. */
typedef struct kvd_store_reservation {
    /* KVD_OK: write size_bytes at arena_offset, then commit or abort.
     * KVD_ERR_EXISTS: stored already (either tier) or being written: skip.
     * KVD_ERR_NOSPACE: no slot could be freed (everything leased/pinned);
     *   daemon mode also: the caller (its tenant, or its client's session)
     *   holds server.max_reserved_bytes reserved already.
     * KVD_ERR_QUOTA: the tenant's quota cannot fit it.
     * Daemon mode also: KVD_ERR_NOMEM / KVD_ERR_BUSY (the daemon's cause,
     * e.g. draining), or the failed call's status (KVD_ERR_UNREACHABLE,
     * KVD_ERR_TIMEOUT, KVD_ERR_INTERNAL, ...): skip the save. */
    kvd_status_t status;
    uint32_t reserved; /* the store's own (daemon mode: which arena mapping) */
    uint64_t arena_offset;
    /* KVD_OK from kvd_store_reserve_part: this caller made the slot, so it
     * writes what no part owns (the object header, the padding); false when
     * it joined a slot another part made. kvd_store_reserve: true. */
    bool first;
} kvd_store_reservation_t;

/*
 * Reserves arena slots of `object_bytes` for the keys (ns, hashes[i]),
 * i < num_hashes, on behalf of `tenant` (the cache_salt quota domain; 0 is
 * the default tenant). Writes one outcome per key into out[i] (on KVD_OK).
 * Keys reserved here are invisible to lookups until committed. An embedded
 * store may wait up to store.reserve_timeout for write-back to free slots;
 * a daemon-mode store makes one call to the daemon. The call itself fails
 * for bad arguments (KVD_ERR_INVALID: NULL pointers with num_hashes > 0,
 * object_bytes 0 or larger than an arena chunk; daemon mode: larger than
 * the mapped arena, or a request the daemon finds invalid) and, in daemon
 * mode, for KVD_ERR_PROTO (the daemon refused the request as malformed,
 * or its reply is) and KVD_ERR_NOMEM; nothing is reserved then. A daemon
 * that cannot be reached or fails the call is not a call error: every key
 * gets that status in `out` and the saves are skipped. Thread: any.
 */
KVD_API kvd_status_t kvd_store_reserve(kvd_store_t *store,
                                       const kvd_namespace_t *ns,
                                       const kvd_block_hash_t *hashes,
                                       size_t num_hashes, uint64_t object_bytes,
                                       uint32_t tenant,
                                       kvd_store_reservation_t *out);

/*
 * Where to write the `len` bytes of a reservation whose status is KVD_OK,
 * in the arena it was made in (as kvd_store_lease_ptr), or NULL (NULL
 * arguments, status not OK, len 0, range outside the arena,
 * or that arena is no longer mapped). A
 * reservation made before a daemon restart can no longer be committed, and
 * writing through this pointer cannot touch the restarted daemon's
 * objects. Valid until the key is committed or aborted; daemon mode: NULL
 * for a reservation no longer open or past its deadline (the daemon's
 * server.reservation_ttl), whose commit then reports KVD_ERR_TIMEOUT and
 * publishes nothing. Thread: any.
 */
KVD_API void *kvd_store_reservation_ptr(kvd_store_t *store,
                                        const kvd_store_reservation_t *r,
                                        uint64_t len);

/*
 * Publishes reserved keys: each becomes visible to lookups (and, with
 * write-through, is queued for NVMe); its reservation pointer must not be
 * written after this. statuses_out[i] (may be NULL) gets KVD_OK or
 * KVD_ERR_NOT_FOUND (not reserved; daemon mode also: reserved from a
 * daemon that has restarted since, or committed already) / KVD_ERR_STATE
 * (embedded: already committed). Daemon mode: KVD_ERR_TIMEOUT for a key
 * whose reservation's deadline had passed (aborted instead: its bytes may
 * have been written after the daemon could end it); one call per reservation
 * id; the client sends the XXH3-64 of each object's bytes and the daemon
 * checks it (server.verify_commits), so a key may also get
 * KVD_ERR_CHECKSUM (the slot's bytes changed under the writer) or the
 * status of a call that failed (KVD_ERR_UNREACHABLE, KVD_ERR_TIMEOUT, ...:
 * the key is not committed and the daemon aborts it at its reservation
 * TTL). Returns KVD_OK when every key committed, else the first error
 * (KVD_ERR_INVALID: NULL keys with num > 0; KVD_ERR_NOMEM in daemon mode:
 * nothing sent). Thread: any.
 */
KVD_API kvd_status_t kvd_store_commit(kvd_store_t *store,
                                      const kvd_store_key_t *keys, size_t num,
                                      kvd_status_t *statuses_out);

/* Gives reserved keys' slots back (the write failed). Same reporting as
 * kvd_store_commit; an embedded store answers KVD_ERR_STATE for a key that
 * is committed already (delete it instead). Thread: any. */
KVD_API kvd_status_t kvd_store_abort(kvd_store_t *store,
                                     const kvd_store_key_t *keys, size_t num,
                                     kvd_status_t *statuses_out);

/* ---- objects written in parts --------------------------------------- */

/*
 * One object written by several writers, each its own disjoint byte ranges
 * (tensor-parallel ranks writing their heads of a block: worker.h,
 * `object_heads`). Each of `num_parts` writers (1..KVD_STORE_MAX_PARTS)
 * reserves the key with its `part` (0..num_parts-1): the first makes the
 * slot (out[i].first), the others join it and get the same arena_offset.
 * The object becomes visible when every part has committed
 * (kvd_store_commit_part); one part's abort, or num_parts not all
 * committed store.part_timeout after the slot was made, abandons it: it is
 * never published, parts not joined yet are refused, and its slot is given
 * back once every part that joined has committed or aborted (so no writer
 * ever writes a slot that was reused). Per key, out[i].status is KVD_OK,
 * KVD_ERR_EXISTS (stored already; or being written by a plain reserve, by
 * another writer of the same part, with another num_parts or size, or
 * abandoned: skip the save), or the errors of kvd_store_reserve. Call
 * errors as kvd_store_reserve, and KVD_ERR_INVALID for a part >= num_parts
 * or num_parts outside 1..KVD_STORE_MAX_PARTS; KVD_ERR_UNSUPPORTED from a
 * store without the call. Daemon mode: the daemon's store does this (one
 * slot for every client's part; protocol revision 9), a daemon before
 * revision 9 answers KVD_ERR_UNSUPPORTED for each key (its slots given
 * back), and a part's commit is not checked against a checksum of the
 * object, which no part knows whole. With num_parts 1 these
 * are kvd_store_reserve, kvd_store_commit and kvd_store_abort. A key
 * reserved in parts must be committed and aborted with the _part calls:
 * kvd_store_commit and kvd_store_abort answer KVD_ERR_STATE for it.
 * Thread: any.
 */
#define KVD_STORE_MAX_PARTS 64u
KVD_API kvd_status_t
kvd_store_reserve_part(kvd_store_t *store, const kvd_namespace_t *ns,
                       const kvd_block_hash_t *hashes, size_t num_hashes,
                       uint64_t object_bytes, uint32_t tenant, uint32_t part,
                       uint32_t num_parts, kvd_store_reservation_t *out);

/* Commits `part` of each key. statuses_out[i] (may be NULL): KVD_OK (the
 * part is in; the object is published with its last part, and then
 * published_out[i], which may be NULL, is true), KVD_ERR_NOT_FOUND (this
 * part of the key is not reserved), KVD_ERR_STATE (committed or aborted
 * already), KVD_ERR_TIMEOUT (the object was abandoned: nothing published).
 * Returns KVD_OK or the first error. */
KVD_API kvd_status_t kvd_store_commit_part(kvd_store_t *store,
                                           const kvd_store_key_t *keys,
                                           size_t num, uint32_t part,
                                           kvd_status_t *statuses_out,
                                           bool *published_out);

/* Aborts `part` of each key, abandoning the object (same reporting). */
KVD_API kvd_status_t kvd_store_abort_part(kvd_store_t *store,
                                          const kvd_store_key_t *keys,
                                          size_t num, uint32_t part,
                                          kvd_status_t *statuses_out);

/* ---- load ------------------------------------------------------------ */

/*
 * Finds the longest prefix hashes[0..m) stored under `ns` in either tier,
 * leases each of its objects (so none is evicted, deleted or reused until
 * released) and writes them into leases_out[0..m) and m into *matched_out.
 * Matching stops at the first key stored nowhere (or only half written).
 * `leases_out` holds num_hashes entries; each lease stays valid (and its
 * object in place) until it is given to kvd_store_release or the store is
 * closed (daemon mode: or the daemon reclaims it at store.lease_ttl).
 * Embedded: never blocks on I/O, it consults in-memory tables only. Daemon
 * mode: one call to the daemon (in a cluster the daemon may first fill a
 * local miss from other nodes, within cluster.timeout); it also carries
 * the releases not yet sent. Counts a hit per matched key and a miss when
 * the prefix stops early, per tier. Errors (nothing leased, *matched_out
 * not written): KVD_ERR_INVALID (NULL arguments); daemon mode: the failed
 * call's status (KVD_ERR_UNREACHABLE, KVD_ERR_TIMEOUT, ...), KVD_ERR_PROTO
 * (an inconsistent reply), KVD_ERR_NOMEM. A store implementation that
 * cannot answer yet (store/ops.h) may return KVD_AGAIN: nothing leased,
 * ask again later; neither built-in implementation does today. Thread:
 * any.
 */
KVD_API kvd_status_t kvd_store_lookup(kvd_store_t *store,
                                      const kvd_namespace_t *ns,
                                      const kvd_block_hash_t *hashes,
                                      size_t num_hashes,
                                      kvd_store_lease_t *leases_out,
                                      size_t *matched_out);

/*
 * kvd_store_lookup, naming the node that computed the blocks (a prefill
 * node handing a request over; `source_node` as its kvd_leader_transfer's
 * node_id, NULL or "" for none). In daemon mode the daemon, when it is in
 * a cluster, asks that node first for what it does not hold, before the
 * blocks' home nodes, and pulls what it finds into its arena before it
 * answers; an embedded store has no other node and ignores it.
 * `source_node` is borrowed for the call. Errors and leases: as
 * kvd_store_lookup. Thread: any.
 */
KVD_API kvd_status_t kvd_store_lookup_from(
    kvd_store_t *store, const kvd_namespace_t *ns,
    const kvd_block_hash_t *hashes, size_t num_hashes, const char *source_node,
    kvd_store_lease_t *leases_out, size_t *matched_out);

/* Gives leases back (either tier); the lease pointers of those objects are
 * invalid afterwards. Never waits on the daemon: a daemon-mode client
 * releases a lease id once all its blocks are back, with the next lookup
 * or from its get thread a few milliseconds later. Returns KVD_OK, or the
 * first error (KVD_ERR_INVALID: NULL leases with num > 0, a tier the store
 * does not have; KVD_ERR_NOT_FOUND / KVD_ERR_STATE: not a lease held, e.g.
 * released already; daemon mode: KVD_ERR_TIMEOUT: the lease's deadline had
 * passed, so the daemon may have ended it while its bytes were read: the
 * lease is released, but what was read through it must not be used);
 * nothing else is affected by one bad element. Thread: any. */
KVD_API kvd_status_t kvd_store_release(kvd_store_t *store,
                                       const kvd_store_lease_t *leases,
                                       size_t num);

/* One object to bring into the arena. */
typedef struct kvd_store_get {
    kvd_store_lease_t lease; /* from kvd_store_lookup */
    uint64_t user_data;      /* returned in the completion */
} kvd_store_get_t;

/* One finished get, drained by kvd_store_poll. */
typedef struct kvd_store_completion {
    uint64_t user_data;
    /* KVD_OK: `lease` is now a HOST lease (release it when done).
     * Otherwise the object could not be read and the DISK lease is already
     * given back: KVD_ERR_CHECKSUM (bad bytes; the object was dropped),
     * KVD_ERR_IO, KVD_ERR_NOSPACE (no arena slot could be freed),
     * KVD_ERR_CANCELED (store closing). Daemon mode also: the daemon's
     * status for the block (e.g. KVD_ERR_QUOTA: its tenant holds too much
     * leased), KVD_ERR_PROTO (a reply outside the mapped arena), or the
     * failed call's status (KVD_ERR_UNREACHABLE, KVD_ERR_TIMEOUT, ...). */
    kvd_status_t status;
    uint32_t reserved;
    kvd_store_lease_t lease;
} kvd_store_completion_t;

/*
 * Starts bringing leased objects into the arena; writes how many were
 * accepted (a prefix) into *accepted_out. Each accepted get completes
 * exactly once through kvd_store_poll (a HOST lease completes at once with
 * KVD_OK). The get takes the lease over: do not release it while the get
 * is in flight; its completion hands back a HOST lease (KVD_OK) or has
 * given the lease back (an error). Fewer accepted than asked means the
 * queue (store.get_queue completions not yet polled) is full:
 * back-pressure, poll, then submit the rest; in daemon mode it may also
 * mean the first one not accepted is not a lease this client holds, or
 * memory ran out: submitting it again reports that.
 * Errors (nothing accepted, *accepted_out not written): KVD_ERR_INVALID
 * (NULL arguments, a lease that is not one: a tier other than HOST or
 * DISK, a DISK lease on a store without a disk tier, in daemon mode a
 * lease not held), KVD_ERR_BUSY, KVD_ERR_NOMEM. Thread: any.
 */
KVD_API kvd_status_t kvd_store_get_submit(kvd_store_t *store,
                                          const kvd_store_get_t *gets,
                                          size_t num, size_t *accepted_out);

/* Drains up to `max` completions into `out` without blocking; returns how
 * many (0 for a NULL store or out). One polling thread at a time. */
KVD_API size_t kvd_store_poll(kvd_store_t *store, kvd_store_completion_t *out,
                              size_t max);

/* Blocks until a completion is ready or `timeout_ms` passes (-1: forever,
 * 0: only checks). KVD_OK (something to poll), KVD_ERR_TIMEOUT,
 * KVD_ERR_INVALID (NULL store), or a translated poll(2) failure. The
 * polling thread only. */
KVD_API kvd_status_t kvd_store_wait(kvd_store_t *store, int timeout_ms);

/* An eventfd that is readable when completions may be ready (for epoll);
 * owned by the store (do not close it), valid until kvd_store_close; -1 for
 * a NULL store. Sleep on it only after a kvd_store_poll that returned
 * fewer than its `max`: from the first call of kvd_store_fd on, such a
 * poll arms the fd, so the next completion makes it readable; a poll that
 * returned `max` may have left more to poll. It may be readable
 * spuriously (poll again). Thread: the polling thread. */
KVD_API int kvd_store_fd(kvd_store_t *store);

/* ---- management ------------------------------------------------------ */

/*
 * Deletes the keys from both tiers (index entries are removed and synced
 * before their extents are reused). Writes the number deleted into
 * *num_deleted_out (may be NULL). A leased or half-written key is skipped
 * and makes the call return KVD_ERR_BUSY after the others are deleted;
 * absent keys are not an error. KVD_ERR_IO (before BUSY): an NVMe object's
 * index record could not be removed: it is gone from the tables now but a
 * restart finds it again (its extent is kept, its bytes intact), so the
 * deletion is not durable. KVD_ERR_INVALID: NULL keys with num > 0.
 * Daemon mode: one call to the daemon per run of keys of one namespace;
 * a failed call stops there and its status is returned (with
 * KVD_ERR_NOMEM), *num_deleted_out then counting the keys deleted before
 * it. Thread: any.
 */
KVD_API kvd_status_t kvd_store_delete(kvd_store_t *store,
                                      const kvd_store_key_t *keys, size_t num,
                                      size_t *num_deleted_out);

/*
 * Pins (`pinned` true) or unpins the objects of `keys` in the host arena: a
 * pinned object is never evicted (by policy, quota or a full arena) until
 * it is unpinned or deleted; pinning is a flag, not a count. Keys not in
 * the arena (absent, or on the NVMe tier only) are skipped and counted in
 * *num_missing_out; *num_done_out counts the keys now as asked (both may be
 * NULL). The pinned objects' bytes are bounded by store.pin_max_bytes
 * (default half of the arena): the pin that would pass it answers
 * KVD_ERR_QUOTA, the keys before it done, the rest untouched. Daemon mode:
 * one Admin call (operators only: KVD_ERR_AUTH for a caller bound to a
 * tenant). KVD_ERR_INVALID: NULL keys with num > 0. Thread: any.
 */
KVD_API kvd_status_t kvd_store_pin(kvd_store_t *store,
                                   const kvd_store_key_t *keys, size_t num,
                                   bool pinned, size_t *num_done_out,
                                   size_t *num_missing_out);

/* One stored object, written by kvd_store_scan. */
typedef struct kvd_store_object {
    kvd_store_key_t key;
    uint32_t tier;   /* kvd_store_tier_t */
    uint32_t tenant; /* the quota domain it was saved under */
    uint64_t size_bytes;
} kvd_store_object_t;

/*
 * Lists stored objects (committed; both tiers; an object in both is listed
 * once per tier), up to `max` per call, for operators (`kvdepot ls`, drop
 * a namespace). *cursor starts at 0 and is advanced; the listing is done
 * when a call writes fewer than `max`. Objects saved or removed meanwhile
 * may or may not appear; none appears twice in one tier. Does not block on
 * I/O. *n_out is the number written to out[0..). Errors: KVD_ERR_INVALID
 * (NULL cursor or n_out, NULL out with max > 0), KVD_ERR_UNSUPPORTED in
 * daemon mode (operators ask the daemon: `kvdepot ls`). Thread: any.
 */
KVD_API kvd_status_t kvd_store_scan(kvd_store_t *store, uint64_t *cursor,
                                    kvd_store_object_t *out, size_t max,
                                    size_t *n_out);

/* Sets the arena byte quota of `tenant` (0 = unlimited), enforced at
 * reserve; lowering it evicts nothing at once (the tenant's next reserve
 * does). Errors: KVD_ERR_INVALID (NULL store), KVD_ERR_NOMEM (first sight
 * of the tenant), KVD_ERR_UNSUPPORTED in daemon mode (the daemon's quotas
 * are its server.tenant_quotas). Thread: any. */
KVD_API kvd_status_t kvd_store_tenant_set_quota(kvd_store_t *store,
                                                uint32_t tenant,
                                                uint64_t max_bytes);

/*
 * The durability point: writes every committed object that is in the arena
 * only (whatever store.disk_write says; the admission filter does not
 * apply) to NVMe, waits for those and every NVMe write queued before the
 * call to finish and be indexed, then syncs the files and the index
 * (durable against power loss). Each object being written is pinned by a
 * lease of the flush's own; objects evicted or deleted meanwhile are
 * skipped, objects committed during the call may or may not be written. A
 * disk smaller than the arena evicts its own objects to take the arena's.
 * `timeout_ms` -1 waits forever. KVD_OK, KVD_ERR_TIMEOUT, an I/O error
 * from the sync, or the cause of the latest NVMe write dropped since the
 * previous flush (KVD_ERR_IO, KVD_ERR_NOSPACE, ...: those objects stay in
 * the arena only; each drop is reported by one flush, whichever caller's
 * it is). Without a disk tier there is nothing to wait for: KVD_OK.
 * KVD_ERR_INVALID for a NULL store. Daemon mode: the daemon flushes its
 * store the same way (timeout_ms -1: one hour at most), but the call
 * itself ends at store.timeout with KVD_ERR_TIMEOUT if that comes first;
 * or the failed call's status. Thread: any.
 */
KVD_API kvd_status_t kvd_store_flush(kvd_store_t *store, int timeout_ms);

typedef struct kvd_store_tier_stats {
    uint64_t capacity_bytes;
    uint64_t bytes; /* held by objects (reserved included) */
    uint64_t objects;
    uint64_t hits;   /* keys matched by lookups in this tier */
    uint64_t misses; /* lookups whose prefix ended in this tier's turn */
    uint64_t evictions;
    uint64_t bytes_written;
    uint64_t bytes_read;
    uint64_t errors; /* I/O and checksum errors (daemon mode: checksum) */
} kvd_store_tier_stats_t;

typedef struct kvd_store_stats {
    kvd_store_tier_stats_t host;
    kvd_store_tier_stats_t disk; /* all zero without a disk tier */
    uint64_t leases;             /* held now, both tiers */
    uint64_t writes_pending;     /* NVMe writes queued or in flight */
    uint64_t admission_rejects;  /* evictions not written (filter) */
    uint64_t checksum_errors;
    uint64_t dropped_writes; /* write-backs lost to errors or space */
} kvd_store_stats_t;

/*
 * Fills *out (on success only) with the store's counters and gauges: each
 * value is read atomically, the set is not one instant's snapshot.
 * Embedded: every field, for this process's store. Daemon mode: the
 * daemon's figures for its whole store (all its clients): per tier the
 * capacity, bytes, objects, hits, misses, evictions, bytes read and
 * written and `errors`, `leases` held at the daemon, checksum_errors,
 * writes_pending, admission_rejects and dropped_writes (a daemon older
 * than protocol revision 5 sends only its checksum errors as `errors`
 * and 0 for the last three). A client bound to a tenant (a tenant token,
 * certificate or local uid mapping) gets its tenant's figures only: per
 * tier its objects, bytes, evictions, hits and misses, host
 * capacity_bytes what it may fill (its partition, capped by its quota),
 * disk capacity_bytes the shared disk tier's size, `leases` its own; the
 * rest reads 0 (docs/daemon.md, "Stats"). Errors:
 * KVD_ERR_INVALID (NULL argument); daemon mode: the failed call's status.
 * Thread: any.
 */
KVD_API kvd_status_t kvd_store_stats(kvd_store_t *store,
                                     kvd_store_stats_t *out);

/* What happened to a key (kvd_store_take_events). */
typedef enum kvd_store_event_kind {
    KVD_STORE_EVENT_STORED = 1,  /* committed: lookups find it from now */
    KVD_STORE_EVENT_REMOVED = 2, /* gone from every tier (evicted from the
                                    last tier that held it, or deleted) */
} kvd_store_event_kind_t;

typedef struct kvd_store_event {
    kvd_store_key_t key;
    kvd_store_event_kind_t kind;
} kvd_store_event_t;

/* The most events kvd_store_events_enable queues. */
#define KVD_STORE_EVENTS_MAX (1u << 20)
/* The most namespaces kvd_store_events_watch names. */
#define KVD_STORE_EVENTS_WATCH_MAX 64

/*
 * Starts (capacity > 0) or stops (0) recording key events: from this call
 * on, every commit and every object leaving the store's last tier (an
 * arena eviction without a disk copy, a disk eviction without an arena
 * copy, a write-back that failed, kvd_store_delete) queues one event, for
 * KV-aware routers that want to know which node holds a prefix. The queue
 * keeps the newest `capacity` events (at most KVD_STORE_EVENTS_MAX): when
 * full the oldest is dropped and counted (kvd_store_take_events). Calling
 * it again resizes the queue, discarding what it held; stopping discards
 * it. Off by default, and costs nothing then.
 * Daemon mode: the events are the daemon's store's, of the namespaces named
 * by kvd_store_events_watch (none until it is called; a client bound to a
 * tenant sees its tenant's objects only); the daemon keeps them (its newest
 * 65536), so `capacity` only turns recording on or off, and reading starts
 * at this call (protocol revision 8; an older daemon: KVD_ERR_UNSUPPORTED
 * or KVD_ERR_PROTO). Errors: KVD_ERR_INVALID (NULL store, capacity over
 * KVD_STORE_EVENTS_MAX), KVD_ERR_NOMEM (nothing changed); daemon mode: the
 * failed call's status. Thread: any.
 */
KVD_API kvd_status_t kvd_store_events_enable(kvd_store_t *store,
                                             size_t capacity);

/*
 * Moves up to `max` queued events, oldest first, into `out` and writes
 * their number into *n_out; *dropped_out (may be NULL) gets how many
 * events were dropped for lack of room since the previous call (the
 * caller has then missed some: a router should resynchronise). Recording
 * off: *n_out 0. Daemon mode: one call to the daemon, at most 4096 events
 * per call; *dropped_out counts events the daemon no longer held (of any
 * namespace: some of ours may be among them). Errors: KVD_ERR_INVALID
 * (NULL store or n_out, NULL out with max > 0); daemon mode: the failed
 * call's status. Thread: any.
 */
KVD_API kvd_status_t kvd_store_take_events(kvd_store_t *store,
                                           kvd_store_event_t *out, size_t max,
                                           size_t *n_out,
                                           uint64_t *dropped_out);

/*
 * Which namespaces' events kvd_store_take_events returns: the `num` of
 * `ns` (at most KVD_STORE_EVENTS_WATCH_MAX; num 0: every namespace in an
 * embedded store, none in daemon mode, where a client is told only about
 * namespaces it names). Events of other namespaces are skipped (embedded:
 * dropped from the queue as they are taken). Replaces the previous list.
 * Errors: KVD_ERR_INVALID (NULL store, NULL ns with num > 0, num over
 * KVD_STORE_EVENTS_WATCH_MAX). Thread: any.
 */
KVD_API kvd_status_t kvd_store_events_watch(kvd_store_t *store,
                                            const kvd_namespace_t *ns,
                                            size_t num);

#ifdef __cplusplus
}
#endif

#endif /* KVDEPOT_STORE_H */
