/*
 * kvd_store_open: the one function that knows both store implementations.
 * It resolves the `store.*` settings (every key checked, as
 * kvd_store_check_config does), then opens the embedded engine
 * (store/engine.h) or, for store.mode daemon, a client of the kvdepotd at
 * store.address (client/client.h). Either way the caller gets a kvd_store_t
 * whose calls dispatch through its ops (store/ops.h).
 */
#include <stddef.h>

#include "client/client.h"
#include "store/engine.h"
#include "store/ops.h"

KVD_API kvd_status_t kvd_store_open(const kvd_config_t *config,
                                    kvd_store_t **store_out, char *err,
                                    size_t err_len)
{
    if (store_out == NULL) {
        return KVD_ERR_INVALID;
    }
    kvd_store_mode_settings_t mode;
    kvd_status_t s = kvd_store_mode_settings(config, &mode, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    if (!mode.daemon) {
        return kvd_store_open_partitioned(config, NULL, 0, store_out, err,
                                          err_len);
    }
    kvd_client_config_t ccfg = {
        .address = mode.address,
        .token_file = mode.token_file,
        .tls_ca = mode.tls_ca,
        .tls_cert = mode.tls_cert,
        .tls_key = mode.tls_key,
        .timeout_ms = mode.timeout_ms,
        .lease_ttl_ms = mode.lease_ttl_ms,
        .get_queue = mode.get_queue,
    };
    kvd_client_t *c = NULL;
    s = kvd_client_open(&ccfg, &c, err, err_len);
    if (s != KVD_OK) {
        return s;
    }
    *store_out = kvd_client_store(c);
    return KVD_OK;
}
