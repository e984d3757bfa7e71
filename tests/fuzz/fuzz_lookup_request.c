/*
 * libFuzzer target for kvd_proto_lookup_request_unpack
 * (kvdepot.v1.LookupRequest): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/lookup_request/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(LOOKUP_REQUEST)
