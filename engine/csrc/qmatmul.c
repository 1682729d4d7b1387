/* Matrix products on weights that stay in their packed blocks (see engine/quant/matrix.py).

   A weight row is stored as codes plus, per group of 16 or 32 weights, a float32 scale and
   offset: w = scale * code + offset, which equals gguf's float32 dequantization bit for bit
   (the product scale * code is exact for every supported type). Kinds:
     Q4: two 4-bit codes per byte; byte j of a 32-weight group holds weight j (low nibble)
         and weight j + 16 (high nibble), as in GGUF's Q4_0/Q4_1 blocks;
     Q8: one unsigned byte per weight;
     F16 / BF16: the half-precision value itself, no scale.
   A task dequantizes ROWS weight rows into a small float32 buffer (L1-resident) and every
   activation row then passes over it, so the codes are read from memory once per call.

   Batch invariance: each output element is one activation row against one weight row,
   summed by the same instructions in the same order whatever the number of activation rows
   and wherever the row sits; no -ffast-math, so the compiler may not reassociate.

   Written with GCC/Clang vector extensions: -march=native turns them into AVX2, AVX-512
   or NEON as the machine has. Threads: OpenMP, the pool Numba's kernels use too. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec.h"

typedef uint8_t v16b __attribute__((vector_size(16)));

enum { KIND_Q4 = 0, KIND_Q8 = 1, KIND_F16 = 2, KIND_BF16 = 3 };
#define ROWS 4 /* weight rows per task */

#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

/* 16 bytes or 16 uint16 widened to int32 lanes. GCC 12 turns a widening
   __builtin_convertvector into scalar inserts, so each ISA gets its instruction. */
static inline v16i widen_u8(const uint8_t *p) {
    v16i out;
#if defined(__AVX512F__)
    __m512i w = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    memcpy(&out, &w, sizeof out);
#elif defined(__AVX2__)
    __m128i raw = _mm_loadu_si128((const __m128i *)p);
    __m256i w[2] = {_mm256_cvtepu8_epi32(raw), _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8))};
    memcpy(&out, w, sizeof out);
#elif defined(__ARM_NEON)
    uint8x16_t raw = vld1q_u8(p);
    uint16x8_t lo = vmovl_u8(vget_low_u8(raw)), hi = vmovl_u8(vget_high_u8(raw));
    uint32x4_t w[4] = {vmovl_u16(vget_low_u16(lo)), vmovl_u16(vget_high_u16(lo)),
                       vmovl_u16(vget_low_u16(hi)), vmovl_u16(vget_high_u16(hi))};
    memcpy(&out, w, sizeof out);
#else
    for (int i = 0; i < 16; i++) out[i] = p[i];
#endif
    return out;
}

static inline v16i widen_u16(const uint8_t *p) {
    v16i out;
#if defined(__AVX512F__)
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&out, &w, sizeof out);
#elif defined(__AVX2__)
    __m256i w[2] = {_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)),
                    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16)))};
    memcpy(&out, w, sizeof out);
#elif defined(__ARM_NEON)
    uint16x8_t lo = vld1q_u16((const uint16_t *)p), hi = vld1q_u16((const uint16_t *)p + 8);
    uint32x4_t w[4] = {vmovl_u16(vget_low_u16(lo)), vmovl_u16(vget_high_u16(lo)),
                       vmovl_u16(vget_low_u16(hi)), vmovl_u16(vget_high_u16(hi))};
    memcpy(&out, w, sizeof out);
#else
    uint16_t h[16];
    memcpy(h, p, sizeof h);
    for (int i = 0; i < 16; i++) out[i] = h[i];
#endif
    return out;
}

static inline v16f half_to_float(const uint8_t *p) {
    v16f out;
#if defined(__AVX512F__)
    __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&out, &w, sizeof out);
#elif defined(__F16C__)
    __m256 w[2] = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                   _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)))};
    memcpy(&out, w, sizeof out);
#else
    _Float16 h[16];
    memcpy(h, p, sizeof h);
    for (int i = 0; i < 16; i++) out[i] = (float)h[i];
#endif
    return out;
}

/* Bytes of one stored row of `k` weights. */
static int64_t row_bytes(int kind, int64_t k) {
    switch (kind) {
    case KIND_Q4: return k / 2;
    case KIND_Q8: return k;
    default: return 2 * k;
    }
}

/* Weights 32b .. 32b + 31 of a row as two 16-lane vectors; q, s, o point at the row. */
static inline void deq32(int kind, int gshift, const uint8_t *q, const float *s,
                         const float *o, int64_t b, v16f *lo, v16f *hi) {
    int64_t g0 = (32 * b) >> gshift, g1 = (32 * b + 16) >> gshift;
    if (kind == KIND_Q4) {
        v16i wide = widen_u8(q + 16 * b);
        *lo = __builtin_convertvector(wide & 15, v16f) * splat(s[g0]) + splat(o[g0]);
        *hi = __builtin_convertvector(wide >> 4, v16f) * splat(s[g1]) + splat(o[g1]);
    } else if (kind == KIND_Q8) {
        *lo = __builtin_convertvector(widen_u8(q + 32 * b), v16f) * splat(s[g0]) + splat(o[g0]);
        *hi = __builtin_convertvector(widen_u8(q + 32 * b + 16), v16f) * splat(s[g1]) +
              splat(o[g1]);
    } else if (kind == KIND_F16) {
        *lo = half_to_float(q + 64 * b);
        *hi = half_to_float(q + 64 * b + 32);
    } else { /* BF16: the high half of a float32 */
        v16i l = widen_u16(q + 64 * b) << 16, h = widen_u16(q + 64 * b + 32) << 16;
        memcpy(lo, &l, sizeof l);
        memcpy(hi, &h, sizeof h);
    }
}

typedef struct {
    const uint8_t *q;
    const float *s, *o;
} Row;

static inline Row row_at(int kind, int gshift, const uint8_t *codes, const float *scale,
                         const float *offset, int64_t k, int64_t n) {
    Row r = {codes + n * row_bytes(kind, k), scale + n * (k >> gshift),
             offset + n * (k >> gshift)};
    return r;
}

/* Weight row `n` as float32 into dst[k]. */
static void dequant_row(int kind, int gshift, const uint8_t *codes, const float *scale,
                        const float *offset, int64_t k, int64_t n, float *dst) {
    Row r = row_at(kind, gshift, codes, scale, offset, k, n);
    for (int64_t b = 0; b < k / 32; b++) {
        v16f lo, hi;
        deq32(kind, gshift, r.q, r.s, r.o, b, &lo, &hi);
        store16(dst + 32 * b, lo);
        store16(dst + 32 * b + 16, hi);
    }
}

/* out[m, j] = x[m, :] . w[j, :] for the ROWS weight rows in buf (rows >= nr are padding).
   Every (m, j) is summed the same way: two 16-lane accumulators over k in order, then
   hsum(lo + hi); pairing activation rows (where there are registers for it) only shares the
   weight loads between them. */
#define DOT_STEP(A, B, X0, X1, W)                                                          \
    A += X0 * load16((W) + i);                                                             \
    B += X1 * load16((W) + i + 16);

static void dot_rows(const float *x, int64_t m_rows, int64_t k, const float *buf, int nr,
                     float *out, int64_t ldo) {
    const float *w0 = buf, *w1 = buf + k, *w2 = buf + 2 * k, *w3 = buf + 3 * k;
    int64_t m = 0;
#if defined(__AVX512F__)
    for (; m + 2 <= m_rows; m += 2) {
        const float *xr = x + m * k, *xs = xr + k;
        v16f a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
        v16f c0 = {}, c1 = {}, c2 = {}, c3 = {}, d0 = {}, d1 = {}, d2 = {}, d3 = {};
        for (int64_t i = 0; i < k; i += 32) {
            v16f x0 = load16(xr + i), x1 = load16(xr + i + 16);
            v16f y0 = load16(xs + i), y1 = load16(xs + i + 16);
            DOT_STEP(a0, b0, x0, x1, w0) DOT_STEP(c0, d0, y0, y1, w0)
            DOT_STEP(a1, b1, x0, x1, w1) DOT_STEP(c1, d1, y0, y1, w1)
            DOT_STEP(a2, b2, x0, x1, w2) DOT_STEP(c2, d2, y0, y1, w2)
            DOT_STEP(a3, b3, x0, x1, w3) DOT_STEP(c3, d3, y0, y1, w3)
        }
        float r[ROWS] = {hsum(a0 + b0), hsum(a1 + b1), hsum(a2 + b2), hsum(a3 + b3)};
        float t[ROWS] = {hsum(c0 + d0), hsum(c1 + d1), hsum(c2 + d2), hsum(c3 + d3)};
        for (int j = 0; j < nr; j++) {
            out[m * ldo + j] = r[j];
            out[(m + 1) * ldo + j] = t[j];
        }
    }
#endif
    for (; m < m_rows; m++) {
        const float *xr = x + m * k;
        v16f a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
        for (int64_t i = 0; i < k; i += 32) {
            v16f x0 = load16(xr + i), x1 = load16(xr + i + 16);
            DOT_STEP(a0, b0, x0, x1, w0)
            DOT_STEP(a1, b1, x0, x1, w1)
            DOT_STEP(a2, b2, x0, x1, w2)
            DOT_STEP(a3, b3, x0, x1, w3)
        }
        float r[ROWS] = {hsum(a0 + b0), hsum(a1 + b1), hsum(a2 + b2), hsum(a3 + b3)};
        for (int j = 0; j < nr; j++) out[m * ldo + j] = r[j];
    }
}

/* One activation row against ROWS weight rows dequantized in registers: the same sums as
   dot_rows (the same weights, accumulators and order), without the trip through buf. */
static void dot_row_fused(int kind, int gshift, const Row *w, const float *x, int64_t k,
                          int nr, float *out) {
    v16f a0 = {}, a1 = {}, a2 = {}, a3 = {}, b0 = {}, b1 = {}, b2 = {}, b3 = {};
    for (int64_t blk = 0; blk < k / 32; blk++) {
        v16f x0 = load16(x + 32 * blk), x1 = load16(x + 32 * blk + 16), lo, hi;
        deq32(kind, gshift, w[0].q, w[0].s, w[0].o, blk, &lo, &hi);
        a0 += x0 * lo;
        b0 += x1 * hi;
        deq32(kind, gshift, w[1].q, w[1].s, w[1].o, blk, &lo, &hi);
        a1 += x0 * lo;
        b1 += x1 * hi;
        deq32(kind, gshift, w[2].q, w[2].s, w[2].o, blk, &lo, &hi);
        a2 += x0 * lo;
        b2 += x1 * hi;
        deq32(kind, gshift, w[3].q, w[3].s, w[3].o, blk, &lo, &hi);
        a3 += x0 * lo;
        b3 += x1 * hi;
    }
    float r[ROWS] = {hsum(a0 + b0), hsum(a1 + b1), hsum(a2 + b2), hsum(a3 + b3)};
    for (int j = 0; j < nr; j++) out[j] = r[j];
}

/* out[m, n] (row stride ldo) = x[m, :] . w[n, :] for m < m_rows, n < n_rows; k % 32 == 0. */
void wf_matmul(int kind, int gshift, const uint8_t *codes, const float *scale,
               const float *offset, int64_t n_rows, int64_t k, const float *x, int64_t m_rows,
               float *out, int64_t ldo, int num_threads) {
    int64_t num_tasks = (n_rows + ROWS - 1) / ROWS;
#pragma omp parallel num_threads(num_threads)
    {
        float *buf = aligned_alloc(64, sizeof(float) * ROWS * k);
#pragma omp for schedule(static)
        for (int64_t t = 0; t < num_tasks; t++) {
            int64_t n0 = t * ROWS;
            int nr = n_rows - n0 < ROWS ? (int)(n_rows - n0) : ROWS;
            if (m_rows == 1) {
                Row w[ROWS]; /* a short last task repeats its last row */
                for (int j = 0; j < ROWS; j++)
                    w[j] = row_at(kind, gshift, codes, scale, offset, k, n0 + (j < nr ? j : nr - 1));
                dot_row_fused(kind, gshift, w, x, k, nr, out + n0);
                continue;
            }
            for (int j = 0; j < ROWS; j++)
                dequant_row(kind, gshift, codes, scale, offset, k, n0 + (j < nr ? j : nr - 1),
                            buf + j * k);
            dot_rows(x, m_rows, k, buf, nr, out + n0, ldo);
        }
        free(buf);
    }
}

/* out[i, :] = w[rows[i], :] as float32, for i < num (an embedding lookup, or a slab). */
void wf_dequant(int kind, int gshift, const uint8_t *codes, const float *scale,
                const float *offset, int64_t k, const int64_t *rows, int64_t num, float *out,
                int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads)
    for (int64_t i = 0; i < num; i++)
        dequant_row(kind, gshift, codes, scale, offset, k, rows[i], out + i * k);
}
