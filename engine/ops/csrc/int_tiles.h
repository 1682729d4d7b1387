/* The integer products of a chunk of unpacked blocks (int_blocks.h) of IROWS weight rows
   against mr activation rows quantized to int8 (experts_int.c), one tile of mr x IROWS
   outputs. Each output adds, block by block in order,

     acc = fmaf(d_w * d_x, (float)isum, acc);  then, with a min,
     acc = fmaf(m_w * d_x, (float)msum, acc);

   isum and msum exact in int32 (|isum| < 2^29 for every type), so however a build sums the
   products (vpdpbusd, maddubs + madd, plain C) the integers, and so the floats, are the
   same: every build gives the same bits, each output a function of its two rows alone.

   x86: AVX-512BW (int_avx512.h) or AVX2 with FMA (int_avx2.h); else plain C. Static inline
   helpers of experts_int.c. */
#ifndef WARMFLEET_INT_TILES_H
#define WARMFLEET_INT_TILES_H

#include <math.h>
#include <stdint.h>

#include "int_blocks.h"

#define IROWS 4 /* weight rows of a task (experts.c's ROWS) */

/* An activation row quantized per block: int8 q, each block's float scale d, sums per 16. */
typedef struct {
    const int8_t *q;
    const float *d;
    const int16_t *sum16;
} Acts;

static inline int64_t up64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

/* Activation row `row` of k as wf_int_quantize lays it out: q, then d, then sum16 */
static inline Acts acts_at(const uint8_t *row, int64_t k) {
    Acts a = {(const int8_t *)row, (const float *)(row + up64(k)),
              (const int16_t *)(row + up64(k) + up64(4 * (k / 32)))};
    return a;
}

/* A chunk of nb blocks of IROWS rows, unpacked: codes [IROWS][nb][unpacked_bytes],
   aux [IROWS][nb][16] (K-quants), d and m [nb][IROWS] (a block's 4 rows side by side). */
typedef struct {
    uint8_t *codes;
    int16_t *aux;
    float *d, *m;
    int nb;
} Chunk;

#if defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__FMA__)
#define INT_SIMD 512
#include "int_avx512.h"
#elif defined(__AVX2__) && defined(__FMA__)
#define INT_SIMD 256
#include "int_avx2.h"
#else
#define INT_SIMD 0
#define INT_MR 4

/* the integers of block b for one activation row and weight row j, exactly */
static inline void block_sums(int t, const Chunk *c, int b, int j, const Acts *x, int64_t g,
                              int32_t *isum, int32_t *msum) {
    int bw = block_weights(t);
    const uint8_t *codes = c->codes + (int64_t)(j * c->nb + b) * unpacked_bytes(t);
    const int8_t *q = x->q + g * bw;
    const int16_t *s16 = x->sum16 + g * (bw / 16);
    int32_t is = 0, ms = 0;
    for (int s = 0; s < bw / 16; s++) {
        int32_t p = 0;
        for (int l = 0; l < 16; l++) p += codes[16 * s + l] * q[16 * s + l];
        if (k_quant(t)) { /* the scale of s: lane 8 (s % 2) of vector s / 2 */
            int16_t sc;
            memcpy(&sc, codes + 256 + 32 * (s / 2) + 16 * (s % 2), sizeof sc);
            int16_t aux = c->aux[(j * c->nb + b) * 16 + s];
            is += sc * p;
            *(has_min(t) ? &ms : &is) += aux * s16[s];
        } else {
            is += p - zero_point(t) * s16[s];
            ms += s16[s];
        }
    }
    *isum = is;
    *msum = ms;
}

static inline __attribute__((always_inline)) void plain_block(int t, int mr, const Chunk *c,
                                                              int b, const Acts *xs, int64_t g,
                                                              float *acc) {
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < IROWS; j++) {
            int32_t is, ms;
            block_sums(t, c, b, j, xs + r, g, &is, &ms);
            float dx = xs[r].d[g], a = acc[4 * r + j];
            a = fmaf(c->d[4 * b + j] * dx, (float)is, a);
            if (has_min(t)) a = fmaf(c->m[4 * b + j] * dx, (float)ms, a);
            acc[4 * r + j] = a;
        }
}
#endif

/* acc[r][j] (floats, kept in memory between chunks: no rounding changes) of mr activation
   rows over the chunk's blocks, the first the row's block b0 */
static inline __attribute__((always_inline)) void int_tile(int t, int mr, const Chunk *c,
                                                          int64_t b0, const Acts *xs,
                                                          float *acc) {
#if INT_SIMD == 512
    if (k_quant(t))
        for (int b = 0; b < c->nb; b++) k_chunk_block512(t, mr, c, b, xs, b0 + b, acc);
    else
        for (int b = 0; b < c->nb; b += 2) small_pair512(t, mr, c, b, xs, b0 + b, acc);
#elif INT_SIMD == 256
    for (int b = 0; b < c->nb; b++) {
        if (k_quant(t))
            k_block256(t, mr, c, b, xs, b0 + b, acc);
        else
            small_block256(t, mr, c, b, xs, b0 + b, acc);
    }
#else
    for (int b = 0; b < c->nb; b++) plain_block(t, mr, c, b, xs, b0 + b, acc);
#endif
}

/* Whether this type multiplies straight from the file's blocks (int_raw_tile), with no
   chunk: the AVX-512 build's K-quants, Q8_0 and MXFP4 */
#if INT_SIMD == 512
static inline int raw_tiles(int t) { return k_quant(t) || small_raw(t); }
#else
static inline int raw_tiles(int t) {
    (void)t;
    return 0;
}
#endif

/* Part `part` of `parts` of the bytes at `ahead` (the next task's rows; NULL: none) on their
   way to L2: spread over a task's blocks, a burst of a task's lines at once measured slower
   (the hardware's prefetchers alone keep a core at a third of its memory bandwidth here).
   Inlined early: else GCC finds it free of side effects and drops its calls. */
static inline __attribute__((always_inline)) void prefetch_part(const uint8_t *ahead,
                                                               int64_t bytes, int64_t part,
                                                               int64_t parts) {
    if (!ahead) return;
    for (int64_t at = part * bytes / parts / 64 * 64; at < (part + 1) * bytes / parts; at += 64)
        __builtin_prefetch(ahead + at, 0, 2);
}

/* int_tile's products for mr rows over all k of rows w[0 .. IROWS) unpacked in registers
   (raw_tiles(t) only), the next task's rows (ahead) prefetched meanwhile */
static inline __attribute__((always_inline)) void int_raw_tile(int t, int mr, const uint8_t *w,
                                                              int64_t rb, int nr, int64_t k,
                                                              const Acts *xs, float *acc,
                                                              const uint8_t *ahead) {
#if INT_SIMD == 512
    if (!k_quant(t)) { /* 32-weight blocks, two at a time (small_pair512's pairs) */
        int64_t nb = k / 32;
        for (int64_t g = 0; g < nb; g += 2) {
            prefetch_part(ahead, IROWS * rb, g / 2, (nb + 1) / 2);
            small_raw_pair512(t, mr, w, rb, nr, nb, xs, g, acc);
        }
        return;
    }
    for (int64_t g = 0; g < k / 256; g++) {
        prefetch_part(ahead, IROWS * rb, g, k / 256);
        k_raw_block(t, mr, w, rb, nr, xs, g, acc);
    }
#else
    (void)t, (void)mr, (void)w, (void)rb, (void)nr, (void)k, (void)xs, (void)acc, (void)ahead;
#endif
}

#endif
