/*
 * libFuzzer target for kvd_proto_object_descriptor_unpack
 * (kvdepot.v1.ObjectDescriptor): unpack, re-pack, re-unpack, compare (see
 * fuzz_proto_int.h). Seeds in corpus/object_descriptor/, written by
 * gen_proto_corpus.
 */
#include "fuzz_proto_int.h"

KVD_FUZZ_PROTO_TARGET(OBJECT_DESCRIPTOR)
