/*
 * libFuzzer target for kvd_proto_reserve_request_unpack
 * (kvdepot.v1.ReserveRequest): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/reserve_request/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(RESERVE_REQUEST)
