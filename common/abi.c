/*
 * The sizes of the public structs, by name (kvd_struct_size, common.h), so
 * a binding that lays them out itself (the Python package's ctypes
 * mirrors) can check that it was built against this library's headers and
 * refuse a mismatched library instead of passing it structs of the wrong
 * shape. Only headers are included: no dependency on the other components.
 */
#include <stddef.h>
#include <string.h>

#include "kvdepot/common.h"
#include "kvdepot/kernels.h"
#include "kvdepot/leader.h"
#include "kvdepot/store.h"
#include "kvdepot/worker.h"

#define KVD_ABI_ENTRY(t)                                                       \
    {                                                                          \
#t, sizeof(t)                                                          \
    }

static const struct {
    const char *name;
    size_t size;
} kvd_abi_structs[] = {
    KVD_ABI_ENTRY(kvd_namespace_t),
    KVD_ABI_ENTRY(kvd_block_hash_t),
    KVD_ABI_ENTRY(kvd_namespace_desc_t),
    KVD_ABI_ENTRY(kvd_store_key_t),
    KVD_ABI_ENTRY(kvd_store_event_t),
    KVD_ABI_ENTRY(kvd_store_stats_t),
    KVD_ABI_ENTRY(kvd_leader_config_t),
    KVD_ABI_ENTRY(kvd_leader_transfer_t),
    KVD_ABI_ENTRY(kvd_leader_mm_input_t),
    KVD_ABI_ENTRY(kvd_leader_request_t),
    KVD_ABI_ENTRY(kvd_leader_stats_t),
    KVD_ABI_ENTRY(kvd_leader_gate_t),
    KVD_ABI_ENTRY(kvd_leader_saved_block_t),
    KVD_ABI_ENTRY(kvd_object_format_t),
    KVD_ABI_ENTRY(kvd_kv_layout_t),
    KVD_ABI_ENTRY(kvd_worker_config_t),
    KVD_ABI_ENTRY(kvd_worker_failed_load_t),
    KVD_ABI_ENTRY(kvd_worker_finished_t),
    KVD_ABI_ENTRY(kvd_worker_stats_t),
};

KVD_API size_t kvd_struct_size(const char *name)
{
    if (name == NULL) {
        return 0;
    }
    for (size_t i = 0; i < sizeof kvd_abi_structs / sizeof kvd_abi_structs[0];
         i++) {
        if (strcmp(kvd_abi_structs[i].name, name) == 0) {
            return kvd_abi_structs[i].size;
        }
    }
    return 0;
}
