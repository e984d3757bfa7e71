/*
 * Status codes: names for humans and the translations from errno and from
 * gRPC's status codes (common/status_int.h). Every foreign error space gets
 * exactly one translation function, which is also where the original code
 * is logged; errno and gRPC live here because several components meet
 * them, the others (MDB_*, ucs_status_t, cudaError_t) beside the single
 * file that touches that API.
 */
#include <errno.h>
#include <stddef.h>

#include "common/log_int.h"
#include "common/status_int.h"
#include "kvdepot/common.h"

KVD_API const char *kvd_version(void)
{
#define KVD_STR_(x) #x
#define KVD_STR(x) KVD_STR_(x)
    return KVD_STR(KVD_VERSION_MAJOR) "." KVD_STR(
        KVD_VERSION_MINOR) "." KVD_STR(KVD_VERSION_PATCH);
#undef KVD_STR
#undef KVD_STR_
}

KVD_API const char *kvd_status_str(kvd_status_t status)
{
    switch (status) {
    case KVD_OK: return "KVD_OK: success";
    case KVD_INPROGRESS: return "KVD_INPROGRESS: accepted, completes later";
    case KVD_AGAIN: return "KVD_AGAIN: not ready, ask again later";
    case KVD_ERR_INVALID: return "KVD_ERR_INVALID: invalid argument";
    case KVD_ERR_NOT_FOUND: return "KVD_ERR_NOT_FOUND: not found";
    case KVD_ERR_EXISTS: return "KVD_ERR_EXISTS: already exists";
    case KVD_ERR_RANGE: return "KVD_ERR_RANGE: value out of range";
    case KVD_ERR_PROTO: return "KVD_ERR_PROTO: malformed message";
    case KVD_ERR_UNSUPPORTED: return "KVD_ERR_UNSUPPORTED: not supported";
    case KVD_ERR_STATE: return "KVD_ERR_STATE: not allowed in this state";
    case KVD_ERR_CANCELED: return "KVD_ERR_CANCELED: canceled";
    case KVD_ERR_NOMEM: return "KVD_ERR_NOMEM: out of memory";
    case KVD_ERR_BUSY: return "KVD_ERR_BUSY: queue full, retry later";
    case KVD_ERR_NOSPACE: return "KVD_ERR_NOSPACE: storage tier full";
    case KVD_ERR_QUOTA: return "KVD_ERR_QUOTA: tenant quota exceeded";
    case KVD_ERR_IO: return "KVD_ERR_IO: I/O error";
    case KVD_ERR_CHECKSUM: return "KVD_ERR_CHECKSUM: checksum mismatch";
    case KVD_ERR_CORRUPT: return "KVD_ERR_CORRUPT: corrupt stored data";
    case KVD_ERR_TIMEOUT: return "KVD_ERR_TIMEOUT: deadline expired";
    case KVD_ERR_UNREACHABLE: return "KVD_ERR_UNREACHABLE: peer unreachable";
    case KVD_ERR_PEER: return "KVD_ERR_PEER: peer error";
    case KVD_ERR_RPC: return "KVD_ERR_RPC: RPC failure";
    case KVD_ERR_AUTH: return "KVD_ERR_AUTH: not authorized";
    case KVD_ERR_DEVICE: return "KVD_ERR_DEVICE: device error";
    case KVD_ERR_NO_DEVICE: return "KVD_ERR_NO_DEVICE: no usable device";
    case KVD_ERR_INTERNAL: return "KVD_ERR_INTERNAL: internal error";
    }
    return "KVD_ERR_UNKNOWN: unknown status";
}

KVD_API kvd_status_t kvd_status_from_errno(int err)
{
    switch (err) {
    case 0: return KVD_OK;
    case EINVAL:
    case EBADF:
    case EFAULT:
    case ENAMETOOLONG: return KVD_ERR_INVALID;
    case ENOENT: return KVD_ERR_NOT_FOUND;
    case EEXIST: return KVD_ERR_EXISTS;
    case ERANGE:
    case EOVERFLOW:
    case EFBIG: return KVD_ERR_RANGE;
    case EPROTO:
    case EBADMSG: return KVD_ERR_PROTO;
    case ENOSYS:
    case EOPNOTSUPP:
    case EAFNOSUPPORT: return KVD_ERR_UNSUPPORTED;
    case ECANCELED: return KVD_ERR_CANCELED;
    case ENOMEM: return KVD_ERR_NOMEM;
    case EAGAIN:
    case EBUSY: return KVD_ERR_BUSY;
    case ENOSPC:
    case EDQUOT: return KVD_ERR_NOSPACE;
    case ETIMEDOUT: return KVD_ERR_TIMEOUT;
    case ECONNREFUSED:
    case EHOSTUNREACH:
    case ENETUNREACH: return KVD_ERR_UNREACHABLE;
    case ECONNRESET:
    case EPIPE:
    case ECONNABORTED: return KVD_ERR_PEER;
    case EACCES:
    case EPERM: return KVD_ERR_AUTH;
    case ENODEV:
    case ENXIO: return KVD_ERR_NO_DEVICE;
    default: return KVD_ERR_IO;
    }
}

/* gRPC's code names, by value (its wire codes). */
static const char *const grpc_code_names[] = {
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
};

kvd_status_t kvd_status_from_grpc(int code, const char *what)
{
    kvd_status_t s;
    switch (code) {
    case 0: return KVD_OK;
    case 1: s = KVD_ERR_CANCELED; break;
    case 3: s = KVD_ERR_INVALID; break;
    case 4: s = KVD_ERR_TIMEOUT; break;
    case 5: s = KVD_ERR_NOT_FOUND; break;
    case 7:
    case 16: s = KVD_ERR_AUTH; break;
    case 8: s = KVD_ERR_BUSY; break;
    case 12: s = KVD_ERR_UNSUPPORTED; break;
    case 14: s = KVD_ERR_UNREACHABLE; break;
    default: s = KVD_ERR_RPC; break;
    }
    size_t n = sizeof grpc_code_names / sizeof grpc_code_names[0];
    KVD_LOG_DEBUG("%s%sgRPC status %d (%s): %s", what != NULL ? what : "",
                  what != NULL ? ": " : "", code,
                  code > 0 && (size_t)code < n ? grpc_code_names[code]
                                               : "not a gRPC code",
                  kvd_status_str(s));
    return s;
}
