/*
 * libFuzzer target for kvd_proto_namespace_descriptor_unpack
 * (kvdepot.v1.NamespaceDescriptor): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/namespace_descriptor/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(NAMESPACE_DESCRIPTOR)
