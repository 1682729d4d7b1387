/* Integer products of expert weights in their GGUF blocks (experts.c's tasks for the
   block-quantized types), as llama.cpp multiplies them: each activation row quantized to
   int8 once a call, in blocks as long as the weights' (32; a K-quant's 256, so its integer
   sub-scales combine in integers: one float step a super-block), and each block's
   integer sums exact (int_tiles.h) before one fixed chain of float steps an output.

   Quantization, one formula in every build: d = amax / 127, q = nearest-even of x * (1/d)
   (d = 0 and q = 0 for a block of zeros; a block with an inf or NaN gets d = NaN, so its
   outputs are NaN as the float products' would be). Each |x - d q| <= d / 2.

   A task: its rows unpacked (int_blocks.h) a chunk of IKC weights at a time into the
   thread's scratch, then IPAIRS pairs at most over each chunk in tiles of INT_MR
   activation rows, the float accumulators in scratch between chunks; or, where the build
   can (raw_tiles: AVX-512's K-quants, Q8_0 and MXFP4), straight from the file's blocks,
   INT_MR pairs a pass over them (the 256-bit chunk path gives the same bits for them,
   measured 1.6x slower at 8 pairs a bucket for the K-quants; for a Q8_0 vocabulary matrix
   at one row 19 against 26 GB/s, MXFP4 experts 10.3 against 12.5). AVX-512's K-quants
   take the chunk again from CHUNK_PAIRS pairs a task, unpacked by the raw path's own
   steps (k_unpack512): its blocks' unpacking then serves IPAIRS pairs, not INT_MR (a
   Q6_K vocabulary matrix at 32 rows 1.4x faster, 64 rows 1.5x; Q4_K experts at 256 rows
   a layer 1.1x), the same bits. */

#include "experts_int.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "int_tiles.h"

#define IKC 1024  /* weights of a chunk: 4 rows' K-quant codes and scales, 8 KB, in L1 */
#define IPAIRS 64 /* pairs over one pass of the chunks */
/* AVX-512: a K-quant task of this many pairs or more unpacks its blocks once (k_unpack512)
   for all of them; fewer take them from the file's blocks, every INT_MR pairs again */
#define CHUNK_PAIRS 8

_Static_assert(IROWS * (IKC * 2 + IKC / 256 * 32 + IKC / 32 * 8) + IPAIRS * IROWS * 4 <=
                   INT_THREAD_BYTES,
               "a task's chunk and accumulators fit its scratch");

int wf_int_products(int qtype) { return int_type(qtype); }

int64_t wf_int_act_bytes(int64_t k) { /* q, d (at most one a 32), sums per 16 */
    return up64(k) + up64(4 * (k / 32)) + up64(2 * (k / 16));
}

/* the largest |x| of a block by its bits (|x|'s order; inf and NaN above every finite) */
static uint32_t amax_bits(const float *x, int n) {
    uint32_t top = 0;
    for (int i = 0; i < n; i++) {
        uint32_t b;
        memcpy(&b, x + i, sizeof b);
        b &= 0x7fffffff;
        top = b > top ? b : top;
    }
    return top;
}

static void quantize_block(const float *x, int n, int8_t *q, float *d) {
    uint32_t top = amax_bits(x, n);
    float amax;
    memcpy(&amax, &top, sizeof amax);
    if (top >= 0x7f800000) { /* inf or NaN */
        *d = NAN;
        memset(q, 0, n);
        return;
    }
    float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    *d = scale;
    for (int i = 0; i < n; i++) {
        float v = nearbyintf(x[i] * inverse);
        q[i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
    }
}

void wf_int_quantize(int qtype, const float *x, int64_t k, uint8_t *to) {
    int bw = block_weights(qtype);
    Acts a = acts_at(to, k);
    int8_t *q = (int8_t *)a.q;
    int16_t *sum16 = (int16_t *)a.sum16;
    for (int64_t b = 0; b < k / bw; b++) quantize_block(x + b * bw, bw, q + b * bw, (float *)a.d + b);
    for (int64_t s = 0; s < k / 16; s++) {
        int sum = 0;
        for (int i = 0; i < 16; i++) sum += q[16 * s + i];
        sum16[s] = (int16_t)sum;
    }
}

/* Blocks [b0, b0 + c->nb) of rows w[0 .. IROWS) (rows past nr repeat the last) into c. */
static inline __attribute__((always_inline)) void unpack_chunk(int t, const uint8_t *w,
                                                              int64_t rb, int nr, int64_t b0,
                                                              const Chunk *c) {
#if INT_SIMD == 512
    if (k_quant(t)) {
        k_unpack512(t, w, rb, nr, b0, c);
        return;
    }
#endif
    int bb = block_bytes(t), ub = unpacked_bytes(t);
    for (int j = 0; j < IROWS; j++) {
        const uint8_t *row = w + (j < nr ? j : nr - 1) * rb + b0 * bb;
        for (int b = 0; b < c->nb; b++) {
            Unpacked u = {c->codes + (j * c->nb + b) * ub, c->aux + (j * c->nb + b) * 16,
                          c->d + 4 * b + j, c->m + 4 * b + j};
            unpack_block(t, row + b * bb, &u);
        }
    }
}

/* The chunk against pairs [q0, q1), INT_MR a tile; acc [q1 - q0][IROWS]. */
static inline __attribute__((always_inline)) void chunk_pairs(int t, const Chunk *c,
                                                             int64_t b0, int64_t k,
                                                             const uint8_t *acts,
                                                             const int64_t *rows, int64_t q0,
                                                             int64_t q1, float *acc) {
    int64_t ab = wf_int_act_bytes(k);
    for (int64_t p = q0; p < q1; p += INT_MR) {
        int mr = q1 - p < INT_MR ? (int)(q1 - p) : INT_MR;
        Acts xs[INT_MR];
        for (int r = 0; r < mr; r++) xs[r] = acts_at(acts + rows[p + r] * ab, k);
        float *a = acc + (p - q0) * IROWS;
        if (!INT_SIMD) /* plain C: its loops gain nothing from a constant mr */
            int_tile(t, mr, c, b0, xs, a);
        else if (mr == 1)
            int_tile(t, 1, c, b0, xs, a);
        else if (mr == 2)
            int_tile(t, 2, c, b0, xs, a);
#if INT_MR > 2
        else if (mr == 3)
            int_tile(t, 3, c, b0, xs, a);
        else
            int_tile(t, 4, c, b0, xs, a);
#endif
    }
}

/* Pairs [p0, p1) straight from the file's blocks (raw_tiles: no chunk), INT_MR a tile */
static inline __attribute__((always_inline)) void raw_task(int t, const uint8_t *w, int64_t rb,
                                                          int nr, int64_t k,
                                                          const uint8_t *acts,
                                                          const int64_t *rows, int64_t p0,
                                                          int64_t p1, float *out,
                                                          int64_t out_stride, float *acc,
                                                          const uint8_t *ahead) {
    int64_t ab = wf_int_act_bytes(k);
    for (int64_t p = p0; p < p1; p += INT_MR, ahead = NULL) { /* ahead: on the first pass */
        int mr = p1 - p < INT_MR ? (int)(p1 - p) : INT_MR;
        Acts xs[INT_MR];
        for (int r = 0; r < mr; r++) xs[r] = acts_at(acts + rows[p + r] * ab, k);
        memset(acc, 0, sizeof(float) * mr * IROWS);
        if (mr == 1)
            int_raw_tile(t, 1, w, rb, nr, k, xs, acc, ahead);
        else if (mr == 2)
            int_raw_tile(t, 2, w, rb, nr, k, xs, acc, ahead);
#if INT_MR > 2
        else if (mr == 3)
            int_raw_tile(t, 3, w, rb, nr, k, xs, acc, ahead);
        else
            int_raw_tile(t, 4, w, rb, nr, k, xs, acc, ahead);
#endif
        for (int r = 0; r < mr; r++)
            for (int j = 0; j < nr; j++) out[(p + r) * out_stride + j] = acc[r * IROWS + j];
    }
}

static inline __attribute__((always_inline)) void int_task(int t, const uint8_t *w, int64_t rb,
                                                          int nr, int64_t k,
                                                          const uint8_t *acts,
                                                          const int64_t *rows, int64_t p0,
                                                          int64_t p1, float *out,
                                                          int64_t out_stride, void *scratch,
                                                          const uint8_t *ahead) {
    if (raw_tiles(t) && !(k_quant(t) && p1 - p0 >= CHUNK_PAIRS)) {
        raw_task(t, w, rb, nr, k, acts, rows, p0, p1, out, out_stride, scratch, ahead);
        return;
    }
    int64_t blocks = k / block_weights(t), per_chunk = IKC / block_weights(t);
    uint8_t *codes = scratch;
    Chunk c = {codes, (int16_t *)(codes + IROWS * IKC * 2), NULL, NULL, 0};
    c.d = (float *)(c.aux + IROWS * 16 * (IKC / 256));
    c.m = c.d + IROWS * per_chunk;
    float *acc = c.m + IROWS * per_chunk;
    for (int64_t q0 = p0; q0 < p1; q0 += IPAIRS) {
        int64_t q1 = p1 - q0 < IPAIRS ? p1 : q0 + IPAIRS;
        memset(acc, 0, sizeof(float) * (q1 - q0) * IROWS);
        for (int64_t b0 = 0; b0 < blocks; b0 += per_chunk) {
            c.nb = (int)(blocks - b0 < per_chunk ? blocks - b0 : per_chunk);
            prefetch_part(q0 == p0 ? ahead : NULL, IROWS * rb, b0 / per_chunk,
                          (blocks + per_chunk - 1) / per_chunk);
            unpack_chunk(t, w, rb, nr, b0, &c);
            chunk_pairs(t, &c, b0, k, acts, rows, q0, q1, acc);
        }
        for (int64_t p = q0; p < q1; p++)
            for (int j = 0; j < nr; j++) out[p * out_stride + j] = acc[(p - q0) * IROWS + j];
    }
}

void wf_int_task(int qtype, const uint8_t *w, int64_t rb, int nr, int64_t k,
                 const uint8_t *acts, const int64_t *rows, int64_t p0, int64_t p1, float *out,
                 int64_t out_stride, void *scratch, const uint8_t *ahead) {
#define CASE(T)                                                                                \
    case T: int_task(T, w, rb, nr, k, acts, rows, p0, p1, out, out_stride, scratch, ahead); break;
    switch (qtype) {
        CASE(T_Q4_0) CASE(T_Q4_1) CASE(T_Q5_0) CASE(T_Q5_1) CASE(T_Q8_0) CASE(T_Q4_K)
        CASE(T_Q5_K) CASE(T_Q6_K) CASE(T_MXFP4)
    default: break;
    }
#undef CASE
}
