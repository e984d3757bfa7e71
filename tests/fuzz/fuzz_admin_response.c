/*
 * libFuzzer target for kvd_proto_admin_response_unpack
 * (kvdepot.v1.AdminResponse): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/admin_response/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(ADMIN_RESPONSE)
