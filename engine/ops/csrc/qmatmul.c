/* Matrix products on weights that stay in their packed blocks (see engine/ops/quant/matrix.py).

   A weight row is stored as codes plus, per group of 16 or 32 weights, a float32 scale and
   offset: w = scale * code + offset, which equals gguf's float32 dequantization bit for bit
   (the product scale * code is exact for every supported type). Kinds:
     Q4: two 4-bit codes per byte; byte j of a 32-weight group holds weight j (low nibble)
         and weight j + 16 (high nibble), as in GGUF's Q4_0/Q4_1 blocks;
     Q8: one unsigned byte per weight;
     Q4H, Q8H: the same codes, the scales and offsets stored as float16 (where they are
         exactly float16: Q4_0, Q4_1, Q8_0 keep the file's own values, the file's size).
         A task widens its rows' groups into float32 first (a few vector instructions per
         row), then runs as Q4 or Q8: the same values, so the same bits;
     F16 / BF16: the half-precision value itself, no scale.
   A task dequantizes ROWS weight rows into a small float32 buffer (L1-resident), asks
   for the next task's rows, and the activation rows then pass over the buffer MR at a time
   (a 4 x 4 tile of accumulators, both operands held in registers: half a load per
   multiply-add; on AVX2 2 x 4 tiles of 8-lane halves, see half_tile), the last m % MR rows
   in one narrower tile; so the codes are read from memory once per call. A single
   activation row (decode at batch 1) dequantizes 4 or 8 weight rows (fused_rows) in
   registers instead, the next task's rows asked for too (on AVX2 4 rows, by halves).
   With AVX-512 a 4-bit group's 16 possible values are computed once and each code looked
   up (vpermps), with the same products as converting every code.

   Batch invariance: each output element is one activation row against one weight row,
   summed the same way whatever the number of activation rows and wherever the row sits:
   one 16-lane accumulator over k in order, then its lanes by a fixed tree (hsum and
   reduce16 are the same tree); no -ffast-math, so the compiler may not reassociate.

   Written with GCC/Clang vector extensions: -march=native turns them into AVX2, AVX-512
   or NEON as the machine has. Threads: par.h (OpenMP where built with it). */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "par.h"
#include "vec.h"
#include "widen.h"

typedef uint8_t v16b __attribute__((vector_size(16)));

enum { KIND_Q4 = 0, KIND_Q8 = 1, KIND_F16 = 2, KIND_BF16 = 3, KIND_Q4H = 4, KIND_Q8H = 5 };

/* The codes' kind (Q4H reads as Q4, Q8H as Q8), and whether the groups are float16. */
static inline int code_kind(int kind) { return kind >= KIND_Q4H ? kind - KIND_Q4H : kind; }
static inline int half_groups(int kind) { return kind >= KIND_Q4H; }
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

/* Bytes of one stored row of `k` weights. */
static int64_t row_bytes(int kind, int64_t k) {
    switch (code_kind(kind)) {
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
#if defined(__AVX512F__)
        /* The 16 values a group's codes can take, then one lookup per lane (vpermps reads
           an index's low 4 bits): the same products as below, fewer instructions. */
        const v16f codes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
        v16f t0 = fma16(codes, splat(s[g0]), splat(o[g0]));
        v16f t1 = g1 == g0 ? t0 : fma16(codes, splat(s[g1]), splat(o[g1]));
        __m512i i0, i1;
        __m512 l, h, m0, m1;
        v16i high = wide >> 4;
        memcpy(&i0, &wide, sizeof i0);
        memcpy(&i1, &high, sizeof i1);
        memcpy(&m0, &t0, sizeof m0);
        memcpy(&m1, &t1, sizeof m1);
        l = _mm512_permutexvar_ps(i0, m0);
        h = _mm512_permutexvar_ps(i1, m1);
        memcpy(lo, &l, sizeof l);
        memcpy(hi, &h, sizeof h);
#else
        *lo = fma16(__builtin_convertvector(wide & 15, v16f), splat(s[g0]), splat(o[g0]));
        *hi = fma16(__builtin_convertvector(wide >> 4, v16f), splat(s[g1]), splat(o[g1]));
#endif
    } else if (kind == KIND_Q8) {
        v16f c0 = __builtin_convertvector(widen_u8(q + 32 * b), v16f);
        *lo = fma16(c0, splat(s[g0]), splat(o[g0]));
        *hi = fma16(__builtin_convertvector(widen_u8(q + 32 * b + 16), v16f), splat(s[g1]),
                    splat(o[g1]));
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

/* n float16 values -> float32 (exactly). On AVX2 by 8-lane pieces: GCC passes the 16-lane
   form through the stack there (a single-row decode step spent ~10% of its time here). */
static void widen_halves(const uint8_t *h, int64_t n, float *dst) {
    int64_t i = 0;
#if WF_AVX2
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 2 * i))));
#endif
    for (; i + 16 <= n; i += 16) store16(dst + i, half_to_float(h + 2 * i));
    for (; i < n; i++) {
        _Float16 v;
        memcpy(&v, h + 2 * i, sizeof v);
        dst[i] = (float)v;
    }
}

/* Weight rows n .. n + rows - 1 (consecutive); for the float16 kinds their groups widened
   into scratch[2 * rows * (k >> gshift)] (every row's scales, then every row's offsets). */
static void rows_at(int kind, int gshift, const uint8_t *codes, const void *scale,
                    const void *offset, int64_t k, int64_t n, int rows, float *scratch,
                    Row *out) {
    int64_t groups = k >> gshift;
    const float *s = (const float *)scale + n * groups, *o = (const float *)offset + n * groups;
    if (half_groups(kind)) {
        widen_halves((const uint8_t *)scale + 2 * n * groups, rows * groups, scratch);
        widen_halves((const uint8_t *)offset + 2 * n * groups, rows * groups,
                     scratch + rows * groups);
        s = scratch, o = scratch + rows * groups;
    }
    for (int j = 0; j < rows; j++) {
        Row r = {codes + (n + j) * row_bytes(kind, k), s + j * groups, o + j * groups};
        out[j] = r;
    }
}

#if WF_AVX2
/* Weights 32 blk + 8 e .. 32 blk + 8 e + 7 of a row (e < 4): lanes 8 (e % 2) .. of deq32's
   lo (e < 2) or hi, computed the same way. */
static inline __m256 deq8(int kind, int gshift, const Row *r, int64_t blk, int e) {
    int64_t g = (32 * blk + 16 * (e / 2)) >> gshift;
    __m256 c;
    if (kind == KIND_Q4) {
        const __m128i *at = (const __m128i *)(r->q + 16 * blk + 8 * (e % 2));
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at));
        b = e < 2 ? _mm256_and_si256(b, _mm256_set1_epi32(15)) : _mm256_srli_epi32(b, 4);
        c = _mm256_cvtepi32_ps(b);
    } else if (kind == KIND_Q8) {
        const __m128i *at = (const __m128i *)(r->q + 32 * blk + 8 * e);
        c = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(at)));
    } else if (kind == KIND_F16) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(r->q + 64 * blk + 16 * e)));
    } else {
        const __m128i *at = (const __m128i *)(r->q + 64 * blk + 16 * e);
        __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(at));
        return _mm256_castsi256_ps(_mm256_slli_epi32(h, 16));
    }
    return _mm256_fmadd_ps(c, _mm256_set1_ps(r->s[g]), _mm256_set1_ps(r->o[g]));
}
#endif

/* Weight row `n` as float32 into dst[k]; kind and gshift are constants in each instance
   (dequant_row), so the block loop has no branch and a 32-weight group one scale. */
static inline __attribute__((always_inline)) void dequant_kind(int kind, int gshift,
                                                               const Row *r, int64_t k,
                                                               float *dst) {
    for (int64_t b = 0; b < k / 32; b++) {
#if WF_AVX2 /* deq32's values by 8-lane pieces: its 16-lane form is slow there */
        for (int e = 0; e < 4; e++)
            _mm256_storeu_ps(dst + 32 * b + 8 * e, deq8(kind, gshift, r, b, e));
#else
        v16f lo, hi;
        deq32(kind, gshift, r->q, r->s, r->o, b, &lo, &hi);
        store16(dst + 32 * b, lo);
        store16(dst + 32 * b + 16, hi);
#endif
    }
}

static void dequant_row(int kind, int gshift, const uint8_t *codes, const void *scale,
                        const void *offset, int64_t k, int64_t n, float *dst, float *scratch) {
    Row r;
    rows_at(kind, gshift, codes, scale, offset, k, n, 1, scratch, &r);
    switch (code_kind(kind) * 2 + (gshift == 5)) {
    case KIND_Q4 * 2: dequant_kind(KIND_Q4, gshift, &r, k, dst); break;
    case KIND_Q4 * 2 + 1: dequant_kind(KIND_Q4, 5, &r, k, dst); break;
    case KIND_Q8 * 2: dequant_kind(KIND_Q8, gshift, &r, k, dst); break;
    case KIND_Q8 * 2 + 1: dequant_kind(KIND_Q8, 5, &r, k, dst); break;
    case KIND_F16 * 2:
    case KIND_F16 * 2 + 1: dequant_kind(KIND_F16, gshift, &r, k, dst); break;
    default: dequant_kind(KIND_BF16, gshift, &r, k, dst);
    }
}

/* mr (at most MR) activation rows x ROWS weight rows of buf: one accumulator per output
   (acc += x[i:i+16] * w[i:i+16] over k in order), its lanes summed by the hsum tree. mr is
   a constant in each instance (dot_rows), so the accumulators stay in registers. */
#define MR 4
_Static_assert(MR * ROWS == 16, "a full tile's outputs are one reduce16");
#if WF_AVX2
/* AVX2 (16 registers of 8 lanes): a 16-lane accumulator is two 8-lane halves, each lane on
   its own, so each half goes through k alone: 2 activation rows x ROWS weight rows of one
   half is 8 accumulators, with the 4 weight and 2 activation vectors in the 16 registers
   (the 4 x 4 tile of 16-lane vectors needs 32 and spilled: 7-9x slower). Each lane gets the
   same multiply-adds in the same order, and lo + hi is the first level of the hsum tree:
   the same bits as the 16-lane code. */
static inline __attribute__((always_inline)) void half_tile(int mr, const float *x, int64_t k,
                                                            const float *buf, int h,
                                                            __m256 acc[2][ROWS]) {
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < ROWS; j++) acc[r][j] = _mm256_setzero_ps();
    for (int64_t i = 8 * h; i < k; i += 16) {
        __m256 w[ROWS];
        for (int j = 0; j < ROWS; j++) {
            w[j] = _mm256_loadu_ps(buf + j * k + i);
            IN_REGISTER8(w[j]); /* loaded once, not once per row as an FMA's operand */
        }
        for (int r = 0; r < mr; r++) {
            __m256 xv = _mm256_loadu_ps(x + r * k + i);
            for (int j = 0; j < ROWS; j++) acc[r][j] = _mm256_fmadd_ps(xv, w[j], acc[r][j]);
        }
    }
}

/* mr (1 or 2) rows: both halves, then each output's lanes by the hsum tree. */
static inline __attribute__((always_inline)) void pair_tile(int mr, const float *x, int64_t k,
                                                            const float *buf, int nr,
                                                            float *out, int64_t ldo) {
    __m256 lo[2][ROWS], hi[2][ROWS];
    float sums[2 * ROWS];
    half_tile(mr, x, k, buf, 0, lo);
    half_tile(mr, x, k, buf, 1, hi);
    if (mr == 1)
        for (int j = 0; j < ROWS; j++) lo[1][j] = hi[1][j] = _mm256_setzero_ps();
    hsum_halves8(lo[0], hi[0], sums);
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) out[r * ldo + j] = sums[r * ROWS + j];
}

static inline __attribute__((always_inline)) void dot_tile(int mr, const float *x, int64_t k,
                                                           const float *buf, int nr,
                                                           float *out, int64_t ldo) {
    for (int r = 0; r + 2 <= mr; r += 2) pair_tile(2, x + r * k, k, buf, nr, out + r * ldo, ldo);
    if (mr % 2) pair_tile(1, x + (mr - 1) * k, k, buf, nr, out + (mr - 1) * ldo, ldo);
}
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
/* NEON (32 registers of 4 lanes): a 16-lane accumulator is four quarters, each lane on its
   own, so each quarter goes through k alone: the tile's MR x ROWS accumulators of one
   quarter are 16 registers, beside its 4 weight and 4 activation vectors (the tile of
   16-lane vectors needs 64 and spills). The hsum tree then joins the quarters: lanes i and
   i + 8 (quarters 0 + 2, 1 + 3), then i + 4 (their sum), then the last two levels. */
static inline __attribute__((always_inline)) void dot_tile(int mr, const float *x, int64_t k,
                                                           const float *buf, int nr,
                                                           float *out, int64_t ldo) {
    float32x4_t part[4][MR][ROWS];
    for (int q = 0; q < 4; q++) {
        float32x4_t acc[MR][ROWS];
        for (int r = 0; r < mr; r++)
            for (int j = 0; j < ROWS; j++) acc[r][j] = vdupq_n_f32(0.0f);
        for (int64_t i = 4 * q; i < k; i += 16) {
            float32x4_t w[ROWS], xv[MR];
            for (int j = 0; j < ROWS; j++) w[j] = vld1q_f32(buf + j * k + i);
            for (int r = 0; r < mr; r++) xv[r] = vld1q_f32(x + r * k + i);
            for (int j = 0; j < ROWS; j++)
                for (int r = 0; r < mr; r++) acc[r][j] = vfmaq_f32(acc[r][j], xv[r], w[j]);
        }
        for (int r = 0; r < mr; r++)
            for (int j = 0; j < ROWS; j++) part[q][r][j] = acc[r][j];
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) {
            float32x4_t t = vaddq_f32(vaddq_f32(part[0][r][j], part[2][r][j]),
                                      vaddq_f32(part[1][r][j], part[3][r][j]));
            out[r * ldo + j] = (vgetq_lane_f32(t, 0) + vgetq_lane_f32(t, 2)) +
                               (vgetq_lane_f32(t, 1) + vgetq_lane_f32(t, 3));
        }
}
#else
static inline __attribute__((always_inline)) void dot_tile(int mr, const float *x, int64_t k,
                                                           const float *buf, int nr,
                                                           float *out, int64_t ldo) {
    v16f acc[MR * ROWS] = {};
    for (int64_t i = 0; i < k; i += 16) {
        v16f xv[MR], wv[ROWS];
        for (int r = 0; r < mr; r++) {
            xv[r] = load16(x + r * k + i);
            IN_REGISTER(xv[r]);
        }
        for (int j = 0; j < ROWS; j++) {
            wv[j] = load16(buf + j * k + i);
            IN_REGISTER(wv[j]);
        }
        for (int j = 0; j < ROWS; j++)
            for (int r = 0; r < mr; r++) acc[r * ROWS + j] = fma16(xv[r], wv[j], acc[r * ROWS + j]);
    }
    if (mr == MR) { /* reduce16 is the hsum tree, 16 outputs at a time */
        v16f sums = reduce16(acc);
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < nr; j++) out[r * ldo + j] = sums[r * ROWS + j];
        return;
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) out[r * ldo + j] = hsum(acc[r * ROWS + j]);
}
#endif

static void dot_rows(const float *x, int64_t m_rows, int64_t k, const float *buf, int nr,
                     float *out, int64_t ldo) {
    int64_t m = 0;
    for (; m + MR <= m_rows; m += MR) dot_tile(MR, x + m * k, k, buf, nr, out + m * ldo, ldo);
    x += m * k;
    out += m * ldo;
    switch (m_rows - m) {
    case 3: dot_tile(3, x, k, buf, nr, out, ldo); break;
    case 2: dot_tile(2, x, k, buf, nr, out, ldo); break;
    case 1: dot_tile(1, x, k, buf, nr, out, ldo); break;
    default: break;
    }
}

/* Ask for weight rows [n, n + rows) ahead of their task: a task computes for much longer
   than memory takes to answer, so the next task's codes arrive meanwhile. */
static void prefetch_rows(int kind, int gshift, const uint8_t *codes, const void *scale,
                          const void *offset, int64_t k, int64_t n, int64_t rows) {
    int64_t width = half_groups(kind) ? 2 : 4, row_groups = width * (k >> gshift);
    int64_t code_bytes = row_bytes(kind, k) * rows, group_bytes = row_groups * rows;
    const char *q = (const char *)(codes + n * row_bytes(kind, k));
    const char *s = (const char *)scale + n * row_groups;
    const char *o = (const char *)offset + n * row_groups;
    for (int64_t off = 0; off < code_bytes; off += 64) __builtin_prefetch(q + off);
    for (int64_t off = 0; off < group_bytes; off += 64) {
        __builtin_prefetch(s + off);
        __builtin_prefetch(o + off);
    }
}

/* One activation row against f weight rows dequantized in registers: the same sums as
   dot_rows (the same weights, accumulator and order), without the trip through buf. The
   kind and f are constants in each instance (fused_kind), so the rows' loop unrolls and
   the accumulators stay in registers. f: 4 rows of 4-bit codes (their 12 row pointers fit
   the general registers; 5% faster than 8 on Zen 4), 8 of wider codes (faster there). */
#define FUSED 8 /* the most rows a single-row task takes */
#if WF_AVX2
#define WIDE_ROWS 4 /* rows of 8- and 16-bit codes a single-row task takes: 8 halves */
static inline int fused_rows(int kind) { return (void)kind, WIDE_ROWS; }

/* fused_kind on AVX2: each 16-lane accumulator as two 8-lane halves (f = 4 rows: 8
   registers), the same multiply-adds per lane in the same order. */
static inline __attribute__((always_inline)) void fused_kind(int kind, int gshift, int f,
                                                             const Row *w, const float *x,
                                                             int64_t k, int nr, float *out) {
    __m256 acc[4][2];
    for (int j = 0; j < 4; j++) acc[j][0] = acc[j][1] = _mm256_setzero_ps();
    for (int64_t blk = 0; blk < k / 32; blk++) {
        __m256 xv[4];
        for (int e = 0; e < 4; e++) xv[e] = _mm256_loadu_ps(x + 32 * blk + 8 * e);
        for (int j = 0; j < f; j++)
            for (int e = 0; e < 4; e++) /* lo's halves, then hi's: x0 * lo before x1 * hi */
                acc[j][e % 2] =
                    _mm256_fmadd_ps(xv[e], deq8(kind, gshift, &w[j], blk, e), acc[j][e % 2]);
    }
    __m256 lo[8], hi[8];
    float sums[8];
    for (int j = 0; j < 8; j++) {
        lo[j] = j < 4 ? acc[j][0] : _mm256_setzero_ps();
        hi[j] = j < 4 ? acc[j][1] : _mm256_setzero_ps();
    }
    hsum_halves8(lo, hi, sums);
    for (int j = 0; j < nr; j++) out[j] = sums[j];
}
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
#define WIDE_ROWS 4 /* 16 accumulators of 4 lanes beside the block's 8 activation vectors */
static inline int fused_rows(int kind) { return (void)kind, WIDE_ROWS; }

/* Weights 32 blk + 4 e .. 32 blk + 4 e + 3 of a row (e < 8): deq32's lanes 4 (e % 4) .. of
   lo (e < 4) or hi, computed the same way; loads stay inside the row's block. */
static inline float32x4_t deq4(int kind, int gshift, const Row *r, int64_t blk, int e) {
    int64_t g = (32 * blk + 16 * (e / 4)) >> gshift;
    uint16x8_t wide;
    if (kind == KIND_Q4) {
        uint8x8_t b = vld1_u8(r->q + 16 * blk + 8 * (e % 4 / 2));
        wide = vmovl_u8(e < 4 ? vand_u8(b, vdup_n_u8(15)) : vshr_n_u8(b, 4));
    } else if (kind == KIND_Q8) {
        wide = vmovl_u8(vld1_u8(r->q + 32 * blk + 8 * (e / 2)));
    } else {
        uint16x4_t h = vld1_u16((const uint16_t *)(r->q + 64 * blk + 8 * e));
        if (kind == KIND_F16) return vcvt_f32_f16(vreinterpret_f16_u16(h));
        return vreinterpretq_f32_u32(vshll_n_u16(h, 16)); /* BF16: a float32's high half */
    }
    uint32x4_t c = e % 2 ? vmovl_high_u16(wide) : vmovl_u16(vget_low_u16(wide));
    return vfmaq_f32(vdupq_n_f32(r->o[g]), vcvtq_f32_u32(c), vdupq_n_f32(r->s[g]));
}

/* fused_kind on NEON: each 16-lane accumulator as four quarters (f = 4 rows: 16 registers),
   the same multiply-adds per lane in the same order (a quarter's piece of lo, then of hi);
   the quarters joined by dot_tile's tree. */
static inline __attribute__((always_inline)) void fused_kind(int kind, int gshift, int f,
                                                             const Row *w, const float *x,
                                                             int64_t k, int nr, float *out) {
    float32x4_t acc[4][4];
    for (int j = 0; j < 4; j++)
        for (int q = 0; q < 4; q++) acc[j][q] = vdupq_n_f32(0.0f);
    for (int64_t blk = 0; blk < k / 32; blk++) {
        float32x4_t xv[8];
        for (int e = 0; e < 8; e++) xv[e] = vld1q_f32(x + 32 * blk + 4 * e);
        for (int j = 0; j < f; j++)
            for (int e = 0; e < 8; e++) /* a quarter's piece of lo (e < 4), then of hi */
                acc[j][e % 4] = vfmaq_f32(acc[j][e % 4], xv[e], deq4(kind, gshift, &w[j], blk, e));
    }
    float sums[4]; /* every row's, so that acc is indexed by constants only */
    for (int j = 0; j < 4; j++) {
        float32x4_t t = vaddq_f32(vaddq_f32(acc[j][0], acc[j][2]), vaddq_f32(acc[j][1], acc[j][3]));
        sums[j] = (vgetq_lane_f32(t, 0) + vgetq_lane_f32(t, 2)) +
                  (vgetq_lane_f32(t, 1) + vgetq_lane_f32(t, 3));
    }
    for (int j = 0; j < nr; j++) out[j] = sums[j];
}
#else
#define WIDE_ROWS FUSED
static inline int fused_rows(int kind) { return code_kind(kind) == KIND_Q4 ? 4 : WIDE_ROWS; }

static inline __attribute__((always_inline)) void fused_kind(int kind, int gshift, int f,
                                                             const Row *w, const float *x,
                                                             int64_t k, int nr, float *out) {
    v16f acc[FUSED] = {};
    for (int64_t blk = 0; blk < k / 32; blk++) {
        v16f x0 = load16(x + 32 * blk), x1 = load16(x + 32 * blk + 16);
#pragma GCC unroll 8
        for (int j = 0; j < f; j++) {
            v16f lo, hi;
            deq32(kind, gshift, w[j].q, w[j].s, w[j].o, blk, &lo, &hi);
            acc[j] = fma16(x0, lo, acc[j]);
            acc[j] = fma16(x1, hi, acc[j]);
        }
    }
    for (int j = 0; j < nr; j++) out[j] = hsum(acc[j]);
}
#endif

static void dot_row_fused(int kind, int gshift, const Row *w, const float *x, int64_t k,
                          int nr, float *out) {
    /* groups of 32 (gshift 5) as a constant: a 32-weight block then has one scale */
    switch (kind * 2 + (gshift == 5)) {
    case KIND_Q4 * 2: fused_kind(KIND_Q4, gshift, 4, w, x, k, nr, out); break;
    case KIND_Q4 * 2 + 1: fused_kind(KIND_Q4, 5, 4, w, x, k, nr, out); break;
    case KIND_Q8 * 2: fused_kind(KIND_Q8, gshift, WIDE_ROWS, w, x, k, nr, out); break;
    case KIND_Q8 * 2 + 1: fused_kind(KIND_Q8, 5, WIDE_ROWS, w, x, k, nr, out); break;
    case KIND_F16 * 2:
    case KIND_F16 * 2 + 1: fused_kind(KIND_F16, gshift, WIDE_ROWS, w, x, k, nr, out); break;
    default: fused_kind(KIND_BF16, gshift, WIDE_ROWS, w, x, k, nr, out);
    }
}

/* Floats of scratch wf_matmul_with takes a thread: ROWS dequantized weight rows (none for
   one activation row, whose rows are multiplied as they are read), and the widened float16
   groups of the rows a task reads; a multiple of 16 (each thread's share 64-byte aligned). */
static int64_t thread_floats(int kind, int gshift, int64_t k, int64_t m_rows) {
    int64_t rows = m_rows == 1 ? 0 : ROWS * k;
    int64_t groups = half_groups(kind) ? FUSED * 2 * (k >> gshift) : 0;
    return (rows + groups + 15) / 16 * 16;
}

int64_t wf_matmul_scratch(int kind, int gshift, int64_t k, int64_t m_rows, int num_threads) {
    return num_threads * thread_floats(kind, gshift, k, m_rows);
}

/* A product's arguments, shared by its region's threads. */
typedef struct {
    int kind, gshift;
    const uint8_t *codes;
    const void *scale, *offset;
    int64_t n_rows, k, m_rows, ldo, rows, room;
    const float *x;
    float *out, *scratch;
} Product;

/* Thread t's share of the product's tasks: `rows` weight rows each. */
static void product_share(void *ctx, int t, int threads) {
    const Product *p = ctx;
    int kind = p->kind, gshift = p->gshift;
    int64_t k = p->k, rows = p->rows, lo, hi;
    float *buf = p->scratch + t * p->room;
    float *scratch_groups = p->m_rows == 1 ? buf : buf + ROWS * k; /* widened float16 */
    wf_share((p->n_rows + rows - 1) / rows, t, threads, &lo, &hi);
    for (int64_t task = lo; task < hi; task++) {
        int64_t n0 = task * rows;
        int nr = p->n_rows - n0 < rows ? (int)(p->n_rows - n0) : (int)rows;
        if (p->m_rows == 1) {
            Row w[FUSED]; /* a short last task repeats its last row */
            rows_at(kind, gshift, p->codes, p->scale, p->offset, k, n0, nr, scratch_groups, w);
            for (int j = nr; j < rows; j++) w[j] = w[nr - 1];
            if (n0 + 2 * rows <= p->n_rows)
                prefetch_rows(kind, gshift, p->codes, p->scale, p->offset, k, n0 + rows, rows);
            dot_row_fused(code_kind(kind), gshift, w, p->x, k, nr, p->out + n0);
            continue;
        }
        for (int j = 0; j < ROWS; j++)
            dequant_row(kind, gshift, p->codes, p->scale, p->offset, k,
                        n0 + (j < nr ? j : nr - 1), buf + j * k, scratch_groups);
        if (n0 + 2 * ROWS <= p->n_rows)
            prefetch_rows(kind, gshift, p->codes, p->scale, p->offset, k, n0 + ROWS, ROWS);
        dot_rows(p->x, p->m_rows, k, buf, nr, p->out + n0, p->ldo);
    }
}

/* out[m, n] (row stride ldo) = x[m, :] . w[n, :] for m < m_rows, n < n_rows; k % 32 == 0.
   scratch: wf_matmul_scratch(kind, gshift, k, m_rows, num_threads) floats, 64-byte aligned
   (on the heap: the groups of a long row would not fit a thread's stack). */
void wf_matmul_with(int kind, int gshift, const uint8_t *codes, const void *scale,
                    const void *offset, int64_t n_rows, int64_t k, const float *x,
                    int64_t m_rows, float *out, int64_t ldo, int num_threads, float *scratch) {
    Product p = {kind, gshift, codes, scale, offset, n_rows, k, m_rows, ldo,
                 m_rows == 1 ? fused_rows(kind) : ROWS, /* weight rows per task */
                 thread_floats(kind, gshift, k, m_rows), x, out, scratch};
    wf_parallel(num_threads, product_share, &p);
}

/* wf_matmul_with with scratch of its own: 0, or the bytes it could not allocate (nothing
   done). */
int64_t wf_matmul(int kind, int gshift, const uint8_t *codes, const void *scale,
                  const void *offset, int64_t n_rows, int64_t k, const float *x, int64_t m_rows,
                  float *out, int64_t ldo, int num_threads) {
    int64_t floats = wf_matmul_scratch(kind, gshift, k, m_rows, num_threads);
    int64_t bytes = sizeof(float) * (floats ? floats : 16);
    float *scratch = aligned_alloc(64, bytes);
    if (!scratch) return bytes;
    wf_matmul_with(kind, gshift, codes, scale, offset, n_rows, k, x, m_rows, out, ldo,
                   num_threads, scratch);
    free(scratch);
    return 0;
}

/* Weight row n as float32 into dst (blas_chunks.c's expansion; scratch: half_room floats
   for the float16-scale kinds, else unused). */
void wf_dequant_row(int kind, int gshift, const uint8_t *codes, const void *scale,
                    const void *offset, int64_t k, int64_t n, float *dst, float *scratch) {
    dequant_row(kind, gshift, codes, scale, offset, k, n, dst, scratch);
}

/* Floats of scratch wf_dequant_row takes for rows of k weights. */
int64_t wf_dequant_room(int kind, int gshift, int64_t k) {
    return half_groups(kind) ? (2 * (k >> gshift) + 15) / 16 * 16 : 0;
}

typedef struct {
    int kind, gshift;
    const uint8_t *codes;
    const void *scale, *offset;
    int64_t k, num, room;
    const int64_t *rows;
    float *out, *scratch;
} Dequant;

static void dequant_share(void *ctx, int t, int threads) {
    const Dequant *d = ctx;
    float *groups = d->scratch ? d->scratch + t * d->room : NULL;
    int64_t lo, hi;
    wf_share(d->num, t, threads, &lo, &hi);
    for (int64_t i = lo; i < hi; i++)
        dequant_row(d->kind, d->gshift, d->codes, d->scale, d->offset, d->k, d->rows[i],
                    d->out + i * d->k, groups);
}

/* out[i] = weight row rows[i] as float32: 0, or the bytes it could not allocate (nothing
   done). Only the float16 kinds take scratch (their rows' groups widened, a thread's share
   on the heap: a long row's would overflow a thread's stack). */
int64_t wf_dequant(int kind, int gshift, const uint8_t *codes, const void *scale,
                   const void *offset, int64_t k, const int64_t *rows, int64_t num, float *out,
                   int num_threads) {
    int64_t room = wf_dequant_room(kind, gshift, k);
    int64_t bytes = sizeof(float) * room * num_threads;
    float *scratch = NULL;
    if (bytes && !(scratch = malloc(bytes))) return bytes;
    Dequant d = {kind, gshift, codes, scale, offset, k, num, room, rows, out, scratch};
    wf_parallel(num_threads, dequant_share, &d);
    free(scratch);
    return 0;
}
