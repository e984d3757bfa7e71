/*
 * libFuzzer target for kvd_proto_release_response_unpack
 * (kvdepot.v1.ReleaseResponse): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/release_response/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(RELEASE_RESPONSE)
