/*
 * libFuzzer target for kvd_proto_abort_request_unpack
 * (kvdepot.v1.AbortRequest): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/abort_request/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(ABORT_REQUEST)
