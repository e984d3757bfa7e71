/*
 * libFuzzer target for kvd_proto_worker_report_unpack
 * (kvdepot.v1.WorkerReport): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/worker_report/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(WORKER_REPORT)
