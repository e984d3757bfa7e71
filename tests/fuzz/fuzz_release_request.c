/*
 * libFuzzer target for kvd_proto_release_request_unpack
 * (kvdepot.v1.ReleaseRequest): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/release_request/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(RELEASE_REQUEST)
