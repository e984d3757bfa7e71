/*
 * libFuzzer target for the CLI's .npy reader (cli/npy.c), the one parser
 * in kvdepot that reads files users bring from elsewhere. Besides "no
 * crash, no out-of-bounds read" it checks what callers rely on after a
 * successful parse: the data region lies inside the input, ends exactly at
 * its end, and its size is rows * cols * element size.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli/npy_int.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvd_npy_array_t a;
    char err[256];
    err[0] = '\0';
    kvd_status_t st = kvd_npy_parse(data, size, &a, err, sizeof(err));
    if (st != KVD_OK) {
        /* Every refusal explains itself, in a NUL-terminated string. */
        if (memchr(err, '\0', sizeof(err)) == NULL || err[0] == '\0') {
            abort();
        }
        return 0;
    }
    if (a.elem_bytes != 2 && a.elem_bytes != 4) {
        abort();
    }
    if (a.rows == 0 || a.cols == 0 ||
        a.rows * a.cols * a.elem_bytes != a.data_bytes ||
        a.data_offset + a.data_bytes != size ||
        (const uint8_t *)a.data != data + a.data_offset) {
        abort();
    }
    /* Touch the first and last data bytes so ASan sees any overrun. */
    volatile uint8_t sink = data[a.data_offset] ^ data[size - 1];
    (void)sink;
    return 0;
}
