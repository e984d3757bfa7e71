/*
 * libFuzzer target for kvd_proto_get_response_unpack (kvdepot.v1.GetResponse):
 * unpack, re-pack, re-unpack, compare (see fuzz_proto_int.h). Seeds in
 * corpus/get_response/, written by gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(GET_RESPONSE)
