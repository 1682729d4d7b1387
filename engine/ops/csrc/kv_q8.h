/* The KV pool's items (engine/kv_files/kv_dtypes.py): float32, float16 or q8_0 blocks, and
   how values are put into them.

   The q8_0 blocks: llama.cpp's block_q8_0, a float16
   scale d and 32 int8 codes, 34 bytes; a value is d * q. Quantized here as NumPy's
   kv_dtypes.quantize does, in float32: amax / 127, codes rint(x * (1 / d)) (ties to even;
   0 where d is 0), d rounded to float16 to nearest even: the same bytes either way. */
#ifndef WARMFLEET_KV_Q8_H
#define WARMFLEET_KV_Q8_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#define WF_Q8_VALUES 32

typedef struct __attribute__((packed)) {
    _Float16 d;
    int8_t q[WF_Q8_VALUES];
} wf_q8;

static inline _Float16 wf_q8_scale(const wf_q8 *b) {
    _Float16 d;
    memcpy(&d, &b->d, sizeof d); /* unaligned: blocks are 34 bytes apart */
    return d;
}

/* n values of src (n a multiple of 32) into n / 32 blocks at to. */
static inline void wf_q8_put(wf_q8 *to, const float *src, int64_t n) {
    for (int64_t i = 0; i < n / WF_Q8_VALUES; i++) {
        const float *x = src + i * WF_Q8_VALUES;
        float amax = 0.0f;
        for (int j = 0; j < WF_Q8_VALUES; j++) amax = fmaxf(amax, fabsf(x[j]));
        float d = amax / 127.0f, inverse = d > 0.0f ? 1.0f / d : 0.0f;
        int8_t q[WF_Q8_VALUES];
        for (int j = 0; j < WF_Q8_VALUES; j++) q[j] = (int8_t)rintf(x[j] * inverse);
        _Float16 d16 = (_Float16)d;
        memcpy(&to[i].d, &d16, sizeof d16);
        memcpy(to[i].q, q, sizeof q);
    }
}

/* Items a row of d values takes in a pool of `kind` (below): d, or d / 32 q8_0 blocks */
static inline int64_t wf_kv_row_items(int kind, int64_t d) {
    return kind == 2 ? d / WF_Q8_VALUES : d;
}

/* d values of src into a pool of `kind` (0: float32; 1: float16, rounded to nearest even;
   2: q8_0, d a multiple of 32) at item `at` */
static inline void wf_kv_put(int kind, void *kv, int64_t at, const float *src, int64_t d) {
    if (kind == 0) {
        memcpy((float *)kv + at, src, sizeof(float) * d);
    } else if (kind == 1) {
        _Float16 *to = (_Float16 *)kv + at;
        for (int64_t i = 0; i < d; i++) to[i] = (_Float16)src[i];
    } else {
        wf_q8_put((wf_q8 *)kv + at, src, d);
    }
}

#endif
