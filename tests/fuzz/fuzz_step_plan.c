/*
 * libFuzzer target for kvd_proto_step_plan_unpack (kvdepot.v1.StepPlan):
 * unpack, re-pack, re-unpack, compare (see fuzz_proto_int.h). Seeds in
 * corpus/step_plan/, written by gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(STEP_PLAN)
