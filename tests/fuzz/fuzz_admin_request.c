/*
 * libFuzzer target for kvd_proto_admin_request_unpack
 * (kvdepot.v1.AdminRequest): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/admin_request/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(ADMIN_REQUEST)
