/*
 * libFuzzer target for kvd_proto_node_info_unpack (kvdepot.v1.NodeInfo, the
 * value a node registers in etcd and every other node reads): unpack,
 * re-pack, re-unpack, compare (see fuzz_proto_int.h). Seeds in
 * corpus/node_info/, written by gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(NODE_INFO)
