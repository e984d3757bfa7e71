/*
 * libFuzzer target for kvd_proto_promote_request_unpack
 * (kvdepot.v1.PromoteRequest): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/promote_request/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(PROMOTE_REQUEST)
