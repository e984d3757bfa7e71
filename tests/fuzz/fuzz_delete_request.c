/*
 * libFuzzer target for kvd_proto_delete_request_unpack
 * (kvdepot.v1.DeleteRequest): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/delete_request/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(DELETE_REQUEST)
