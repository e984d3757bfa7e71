/*
 * libFuzzer target for kvd_proto_stats_request_unpack
 * (kvdepot.v1.StatsRequest): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/stats_request/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(STATS_REQUEST)
