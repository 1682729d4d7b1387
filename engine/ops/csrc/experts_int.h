/* experts.c's integer products of the block-quantized types (experts_int.c): activation
   rows quantized to int8 once a call, then tasks of IROWS weight rows against a bucket's
   pairs. Internal to the kernels' library (moe.h is its interface). */
#ifndef WARMFLEET_EXPERTS_INT_H
#define WARMFLEET_EXPERTS_INT_H

#include <stdint.h>

/* bytes a thread's task takes (64-byte aligned) */
#define INT_THREAD_BYTES 12288

/* Whether `qtype` multiplies in integers (the block-quantized types). */
int wf_int_products(int qtype);

/* Bytes of one activation row of k quantized (64-byte aligned; k % 32 == 0). */
int64_t wf_int_act_bytes(int64_t k);

/* x [k] -> its int8 blocks at `to` (wf_int_act_bytes(k) bytes), for weights of qtype. */
void wf_int_quantize(int qtype, const float *x, int64_t k, uint8_t *to);

/* out[p * out_stride + j] for pairs [p0, p1) and weight rows w[0 .. nr) (nr <= 4, row
   bytes rb): acts holds activation row i at i * wf_int_act_bytes(k); the 4 rows at `ahead`
   (the next task's, or NULL) prefetched meanwhile. */
void wf_int_task(int qtype, const uint8_t *w, int64_t rb, int nr, int64_t k,
                 const uint8_t *acts, const int64_t *rows, int64_t p0, int64_t p1, float *out,
                 int64_t out_stride, void *scratch, const uint8_t *ahead);

#define PACK_ROWS 16 /* weight rows of a group wf_int_pack repacks (int_packed.c) */

/* wf_int_task on a group of PACK_ROWS rows repacked by wf_int_pack: PACK_ROWS outputs a
   pair at out[p * out_stride]. */
void wf_int_packed_task(int qtype, const uint8_t *w, int64_t k, const uint8_t *acts,
                        const int64_t *rows, int64_t p0, int64_t p1, float *out,
                        int64_t out_stride);

#endif
