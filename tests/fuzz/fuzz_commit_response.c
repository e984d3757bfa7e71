/*
 * libFuzzer target for kvd_proto_commit_response_unpack
 * (kvdepot.v1.CommitResponse): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/commit_response/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(COMMIT_RESPONSE)
