/*
 * Translations into kvd_status_t from error spaces that only some
 * components see. errno's is public (kvdepot/common.h); gRPC's is here: the
 * store client (client/transport.c) and the etcd client (cluster/etcd.c)
 * both end their calls with a grpc_status_code, and both turn it into a
 * status through this one function, so a code means the same thing
 * wherever it arrives. common/ does not include the gRPC headers: the code
 * comes as an int (grpc_status_code's values are gRPC's wire codes, fixed
 * by its protocol).
 *
 * Threading: any thread; no state.
 */
#ifndef KVD_COMMON_STATUS_INT_H
#define KVD_COMMON_STATUS_INT_H

#include "kvdepot/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * The status of a gRPC call that ended with `code` (a grpc_status_code):
 *
 *    0 OK                   KVD_OK
 *    1 CANCELLED            KVD_ERR_CANCELED
 *    3 INVALID_ARGUMENT     KVD_ERR_INVALID
 *    4 DEADLINE_EXCEEDED    KVD_ERR_TIMEOUT
 *    5 NOT_FOUND            KVD_ERR_NOT_FOUND
 *    7 PERMISSION_DENIED    KVD_ERR_AUTH
 *    8 RESOURCE_EXHAUSTED   KVD_ERR_BUSY
 *   12 UNIMPLEMENTED        KVD_ERR_UNSUPPORTED
 *   14 UNAVAILABLE          KVD_ERR_UNREACHABLE
 *   16 UNAUTHENTICATED      KVD_ERR_AUTH
 *   any other code          KVD_ERR_RPC (UNKNOWN, INTERNAL, DATA_LOSS,
 *                           FAILED_PRECONDITION, ABORTED, ALREADY_EXISTS,
 *                           OUT_OF_RANGE, or a value gRPC does not define)
 *
 * kvdepotd sends its exact status in a trailer, which the store client
 * prefers; this mapping is what a call gets without one (no daemon, a
 * transport failure, a foreign server such as etcd). A code other than OK
 * is logged here at DEBUG with its number and name, after `what` (who was
 * called, e.g. the method's path; NULL: nothing), since this is where the
 * original code is last known. Never fails.
 */
kvd_status_t kvd_status_from_grpc(int code, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* KVD_COMMON_STATUS_INT_H */
