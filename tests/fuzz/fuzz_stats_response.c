/*
 * libFuzzer target for kvd_proto_stats_response_unpack
 * (kvdepot.v1.StatsResponse): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/stats_response/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(STATS_RESPONSE)
