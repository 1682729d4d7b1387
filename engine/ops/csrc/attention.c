/* Attention of single query rows over their sequences' keys in the paged KV pool.

   A task is one (row, KV head): its G query heads walk the row's block table; with two rows
   or more per thread, a task is a whole row, its KV heads block by block (a block's heads
   are adjacent in the pool), computing each (KV head, query head) the same way. Where a
   step holds a chunk (rows of one table at consecutive positions), a task is a run of up
   to GROUP of its rows for one KV head, block by block, so each block comes from memory
   once per run instead of once per row. A few long rows on more threads than their
   (row, KV head) tasks (decode at batch 1) are spread over all threads (row_split). Scores
   of a block's 16 keys are 16 dot products summed lane-wise (a product, then D / 16 - 1
   fused multiply-adds each)
   and then reduced across lanes together, by a fixed tree of vector shuffles, instead of
   one horizontal sum per key. Softmax with a vector exp (a fixed polynomial), then the
   values weighted in 16-lane vectors. Each row's result depends on its own keys only, and
   is computed by the same instructions whatever other rows the call holds. Built for AVX2
   the scores and the weighing go by 8-lane halves, for NEON by 4-lane quarters
   (attention_lanes.h): the same bits.

   A row may see only its last `window` keys (the blocks before them are not read: a
   sliding window's layer may have freed them), and a learned sink logit per query head may
   join each softmax's denominator (gpt-oss's attention).

   Shapes: q [R, H, D]; k, v [num_blocks, Hkv, 16, D] (one layer, float32; float16 in the
   _f16 functions of attention_f16.c, this file built again; q8_0 blocks [.., D / 32] in
   the _q8 ones of attention_q8.c); tables [R, max_blocks]; out [R, H, D]. D a multiple of
   16 (of 32 for q8_0), at most 256; G = H / Hkv at most 16. */

/* GCC 12's global CSE passes took most of this file's build (built for AVX2 45 of 60 s,
   for AVX-512 7 of 19) and gave the same code speed: without them the engine's first start
   is shorter, and within native.py's compile timeout on slow machines too. */
#pragma GCC optimize("no-gcse", "no-gcse-after-reload")
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "par.h"
#include "vec.h"

#define BLOCK 16
#define MAX_G 16
#define MAX_D 256
static const v16i IOTA16 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

#define MAX_KV 8 /* KV heads a whole-row task takes */
#define INLINE static inline __attribute__((always_inline))

/* What the pool holds (KV_KIND 0: float32; 1: float16, attention_f16.c; 2: q8_0 blocks,
   attention_q8.c), widened to float32 as it is loaded: KV16(row, c) the c-th 16 values of
   the key (or value) vector at row, KV8(row, i) its i-th 8 (AVX2). The arithmetic after
   the load is the same for all, so a float16 or q8_0 pool's results are the float32
   code's on the widened values (q8_0: float(d) * q, exact). A vector of D values takes
   ROW(D) kv_t. */
#ifndef KV_KIND
#define KV_KIND 0
#endif
#if KV_KIND == 1
typedef _Float16 kv_t;
typedef _Float16 v16h __attribute__((vector_size(32)));
#define KV_NAME(f) f##_f16
#define ROW(dim) (dim)
INLINE v16f KV16(const kv_t *row, int64_t c) {
#if defined(__AVX512F__) /* one vcvtph2ps: GCC's generic conversion went value by value */
    return (v16f)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(row + 16 * c)));
#else
    v16h h;
    memcpy(&h, row + 16 * c, sizeof h);
    return __builtin_convertvector(h, v16f);
#endif
}
#if WF_AVX2
INLINE __m256 KV8(const kv_t *row, int64_t i) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(row + 8 * i)));
}
#elif WF_NEON
INLINE float32x4_t KV4(const kv_t *row, int64_t i) {
    return vcvt_f32_f16(vld1_f16((const float16_t *)(row + 4 * i)));
}
#endif
#elif KV_KIND == 2
#include "kv_q8.h"
typedef wf_q8 kv_t;
typedef int8_t v16b __attribute__((vector_size(16)));
#define KV_NAME(f) f##_q8
#define ROW(dim) ((dim) / WF_Q8_VALUES)
INLINE v16f KV16(const kv_t *row, int64_t c) {
    const kv_t *b = row + (c >> 1);
#if defined(__AVX512F__)
    __m512i wide = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->q + 16 * (c & 1))));
    return (v16f)_mm512_cvtepi32_ps(wide) * splat((float)wf_q8_scale(b));
#else
    v16b codes;
    memcpy(&codes, b->q + 16 * (c & 1), sizeof codes);
    return __builtin_convertvector(codes, v16f) * splat((float)wf_q8_scale(b));
#endif
}
#if WF_AVX2
INLINE __m256 KV8(const kv_t *row, int64_t i) {
    const kv_t *b = row + (i >> 2);
    __m256i wide = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(b->q + 8 * (i & 3))));
    return _mm256_mul_ps(_mm256_cvtepi32_ps(wide), _mm256_set1_ps((float)wf_q8_scale(b)));
}
#elif WF_NEON
INLINE float32x4_t KV4(const kv_t *row, int64_t i) {
    const kv_t *b = row + (i >> 3);
    int16x8_t wide = vmovl_s8(vld1_s8(b->q + 8 * ((i & 7) >> 1)));
    int32x4_t c = i & 1 ? vmovl_high_s16(wide) : vmovl_s16(vget_low_s16(wide));
    return vmulq_f32(vcvtq_f32_s32(c), vdupq_n_f32((float)wf_q8_scale(b)));
}
#endif
#else
typedef float kv_t;
#define KV_NAME(f) f
#define ROW(dim) (dim)
INLINE v16f KV16(const kv_t *row, int64_t c) { return load16(row + 16 * c); }
#if WF_AVX2
INLINE __m256 KV8(const kv_t *row, int64_t i) { return _mm256_loadu_ps(row + 8 * i); }
#elif WF_NEON
INLINE float32x4_t KV4(const kv_t *row, int64_t i) { return vld1q_f32(row + 4 * i); }
#endif
#endif
#define KV_BYTES ((int64_t)sizeof(kv_t))

/* The G query heads of a row from q (pointing at the KV head's first), scaled, into qv:
   head j's part c at qv[j * nv + c]. */
INLINE void load_queries(const float *q, int64_t row, int64_t num_heads, int64_t g, int64_t nv,
                         float scale, v16f *qv) {
    for (int64_t j = 0; j < g; j++)
        for (int64_t c = 0; c < nv; c++)
            qv[j * nv + c] = load16(q + (row * num_heads + j) * 16 * nv + 16 * c) * splat(scale);
}

/* The first key a row of n keys sees: n - window with a sliding window (window > 0)
   longer than it, else 0; its block is the first the row reads. */
INLINE int64_t first_key(int64_t n, int64_t window) { return window && n > window ? n - window : 0; }

/* Head j's scores of block b: keys past n and before lo masked, the running maximum in
   top[j], stored. */
INLINE void keep_scores(v16f sc, int64_t j, int64_t b, int64_t nb, int64_t n, int64_t lo,
                        v16f *top, float *p, int64_t padded) {
    if (b == nb - 1) /* keys past the row's length */
        sc = select16(IOTA16 + (int32_t)(b * BLOCK) >= (int32_t)n, splat(-INFINITY), sc);
    if (b * BLOCK < lo) /* keys the window has left behind */
        sc = select16(IOTA16 + (int32_t)(b * BLOCK) < (int32_t)lo, splat(-INFINITY), sc);
    top[j] = max16(sc, top[j]);
    store16(p + j * padded + b * BLOCK, sc);
}

#include "attention_lanes.h"
#if WF_AVX2 || WF_NEON /* scores and values head by head, in the ISA's forms above */
INLINE void score_block(const v16f *qv, const kv_t *kb, int64_t b, int64_t nb, int64_t n,
                        int64_t lo, int64_t g, int64_t nv, v16f *top, float *p, int64_t padded) {
    for (int64_t j = 0; j < g; j++) {
        float sc[16];
        head_scores((const float *)(qv + j * nv), kb, nv, sc);
#if WF_AVX2
        keep_scores8(sc, j, b, nb, n, lo, top, p, padded);
#else
        keep_scores(load16(sc), j, b, nb, n, lo, top, p, padded);
#endif
    }
}

INLINE void weigh_block(v16f acc_v[MAX_G][MAX_D / 16], const kv_t *vb, int64_t s0,
                        int64_t keys, const float *p, int64_t padded, int64_t b, int64_t g,
                        int64_t nv) {
#if WF_AVX2
    weigh_heads(g, (float *)acc_v[0], MAX_D, p + b * BLOCK, padded, vb, s0, keys, nv);
#else
    for (int64_t j = 0; j < g; j++)
        weigh_head((float *)acc_v[j], vb, s0, keys, p + j * padded + b * BLOCK, nv);
#endif
}
#else
/* Scores of block b (16 keys at kb) for the G query heads into p (row stride padded), with
   keys past n masked and the running maxima in top. Up to 4 heads, keys go 4 at a time,
   each vector of a key loaded once for every head (reduce4 sums each quarter's lanes as
   far as it can alone): 25% less time than head by head. The two forms do the same
   operations per score, and a model (its G) always takes the same one. */
INLINE void score_block(const v16f *qv, const kv_t *kb, int64_t b, int64_t nb, int64_t n,
                        int64_t lo, int64_t g, int64_t nv, v16f *top, float *p, int64_t padded) {
    int64_t row = ROW(16 * nv);
    v16f quarters[MAX_G][4]; /* [head][keys 4 q4 .. 4 q4 + 3] */
    if (g > 4) { /* too many accumulators for the G heads at once: one head at a time, on
                    the quarter's 4 keys widened once for all of them */
        for (int q4 = 0; q4 < 4; q4++) {
            v16f keys4[4][MAX_D / 16];
            for (int s = 0; s < 4; s++)
                for (int64_t c = 0; c < nv; c++) keys4[s][c] = KV16(kb + (4 * q4 + s) * row, c);
            for (int64_t j = 0; j < g; j++) {
                v16f acc[4];
                for (int s = 0; s < 4; s++) {
                    acc[s] = qv[j * nv] * keys4[s][0];
                    for (int64_t c = 1; c < nv; c++) acc[s] = fma16(qv[j * nv + c], keys4[s][c], acc[s]);
                }
                quarters[j][q4] = reduce4(acc);
            }
        }
    } else {
        for (int q4 = 0; q4 < 4; q4++) {
            v16f acc[MAX_G][4]; /* each key vector loaded once for the G heads */
            for (int s = 0; s < 4; s++) {
                v16f kv = KV16(kb + (4 * q4 + s) * row, 0);
                IN_REGISTER(kv);
                for (int64_t j = 0; j < g; j++) acc[j][s] = qv[j * nv] * kv;
            }
            for (int64_t c = 1; c < nv; c++)
                for (int s = 0; s < 4; s++) {
                    v16f kv = KV16(kb + (4 * q4 + s) * row, c);
                    IN_REGISTER(kv);
                    for (int64_t j = 0; j < g; j++) acc[j][s] = fma16(qv[j * nv + c], kv, acc[j][s]);
                }
            for (int64_t j = 0; j < g; j++) quarters[j][q4] = reduce4(acc[j]);
        }
    }
    for (int64_t j = 0; j < g; j++)
        keep_scores(reduce_quarters(quarters[j]), j, b, nb, n, lo, top, p, padded);
}

#endif

/* Each of the G rows of scores in p (blocks b0 .. nb - 1) becomes its softmax; with sinks
   (the G heads' learned logits, gpt-oss's), each head's sink joins the maximum and the
   denominator as one more key whose value is zero. */
INLINE void softmax_rows(float *p, int64_t padded, int64_t b0, int64_t nb, int64_t g,
                         const v16f *top, const float *sinks) {
    for (int64_t j = 0; j < g; j++) {
        float m = top[j][0];
        for (int i = 1; i < 16; i++) m = top[j][i] > m ? top[j][i] : m;
        if (sinks && sinks[j] > m) m = sinks[j];
        float *row = p + j * padded, sum;
#if WF_AVX2 /* by 8-lane halves, lane for lane the same (16-lane forms went through the stack) */
        __m256 lo = _mm256_setzero_ps(), hi = lo, mv = _mm256_set1_ps(m);
        for (int64_t i = b0 * BLOCK; i < nb * BLOCK; i += BLOCK) {
            __m256 e0 = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + i), mv));
            __m256 e1 = exp8(_mm256_sub_ps(_mm256_loadu_ps(row + i + 8), mv));
            lo = _mm256_add_ps(lo, e0);
            hi = _mm256_add_ps(hi, e1);
            _mm256_storeu_ps(row + i, e0);
            _mm256_storeu_ps(row + i + 8, e1);
        }
        float t[16];
        _mm256_storeu_ps(t, lo);
        _mm256_storeu_ps(t + 8, hi);
        sum = hsum(load16(t));
#else
        v16f total = {};
        for (int64_t b = b0; b < nb; b++) {
            v16f e = exp16(load16(row + b * BLOCK) - splat(m));
            total += e;
            store16(row + b * BLOCK, e);
        }
        sum = hsum(total);
#endif
        if (sinks) sum += exp16(splat(sinks[j] - m))[0];
        float inv = 1.0f / sum;
#if WF_AVX2
        for (int64_t i = b0 * BLOCK; i < nb * BLOCK; i += 8)
            _mm256_storeu_ps(row + i, _mm256_mul_ps(_mm256_loadu_ps(row + i), _mm256_set1_ps(inv)));
#else
        for (int64_t b = b0; b < nb; b++)
            store16(row + b * BLOCK, load16(row + b * BLOCK) * splat(inv));
#endif
    }
}

#if !WF_AVX2 && !WF_NEON
/* acc_v += values s0 .. keys - 1 at vb weighted by block b's probabilities, for G heads. */
INLINE void weigh_block(v16f acc_v[MAX_G][MAX_D / 16], const kv_t *vb, int64_t s0,
                        int64_t keys, const float *p, int64_t padded, int64_t b, int64_t g,
                        int64_t nv) {
    for (int64_t s = s0; s < keys; s++) {
        const kv_t *vt = vb + s * ROW(16 * nv);
        for (int64_t c = 0; c < nv; c++) { /* each value vector widened once for the G heads */
            v16f value = KV16(vt, c);
            for (int64_t j = 0; j < g; j++)
                acc_v[j][c] = fma16(splat(p[j * padded + b * BLOCK + s]), value, acc_v[j][c]);
        }
    }
}
#endif

/* weigh_block on G heads' accumulators held in memory (held[j * nv + c]): on AVX2 and NEON
   weigh_head works on them where they are; the 16-lane form takes them into registers
   and back. The same multiply-adds either way. */
INLINE void weigh_held(v16f *held, const kv_t *vb, int64_t s0, int64_t keys, const float *p,
                       int64_t padded, int64_t b, int64_t g, int64_t nv) {
#if WF_AVX2 /* copies of 16-lane vectors went piece by piece there */
    weigh_heads(g, (float *)held, 16 * nv, p + b * BLOCK, padded, vb, s0, keys, nv);
#elif WF_NEON
    for (int64_t j = 0; j < g; j++)
        weigh_head((float *)(held + j * nv), vb, s0, keys, p + j * padded + b * BLOCK, nv);
#else
    v16f acc_v[MAX_G][MAX_D / 16];
    for (int64_t j = 0; j < g; j++)
        for (int64_t c = 0; c < nv; c++) acc_v[j][c] = held[j * nv + c];
    weigh_block(acc_v, vb, s0, keys, p, padded, b, g, nv);
    for (int64_t j = 0; j < g; j++)
        for (int64_t c = 0; c < nv; c++) held[j * nv + c] = acc_v[j][c];
#endif
}

/* A table walk defeats the hardware prefetcher: ask for `bytes` of the next block (blocks
   `stride` kv_t apart from base). */
INLINE void prefetch_block(const kv_t *base, const int32_t *table, int64_t b, int64_t nb,
                           int64_t stride, int64_t bytes) {
    if (b + 1 < nb) {
        const char *next = (const char *)(base + (int64_t)table[b + 1] * stride);
        for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(next + off);
    }
}

/* One task: query row `row`, KV head `kh`. `g` and `nv` (D / 16) are constants where the
   caller dispatches on them, so the accumulators live in registers. */
INLINE void row_task(const float *q, const kv_t *k, const kv_t *v, const int32_t *tables,
                     int64_t max_blocks, int64_t n, int64_t row, int64_t kh, int64_t num_heads,
                     int64_t hkv, int64_t g, int64_t nv, float scale, float *p, int64_t padded,
                     float *out, int64_t window, const float *sinks) {
    int64_t dim = 16 * nv, nb = (n + BLOCK - 1) / BLOCK, stride = hkv * BLOCK * ROW(dim);
    int64_t lo = first_key(n, window), b0 = lo / BLOCK;
    const int32_t *table = tables + row * max_blocks;
    const kv_t *kh_k = k + kh * BLOCK * ROW(dim), *kh_v = v + kh * BLOCK * ROW(dim);
    v16f qv[MAX_G * MAX_D / 16], top[MAX_G], acc_v[MAX_G][MAX_D / 16];
    load_queries(q + kh * g * dim, row, num_heads, g, nv, scale, qv);
    for (int64_t j = 0; j < g; j++) top[j] = splat(-INFINITY);
    for (int64_t b = b0; b < nb; b++) { /* scores, 16 keys at a time */
        prefetch_block(kh_k, table, b, nb, stride, BLOCK * ROW(dim) * KV_BYTES);
        score_block(qv, kh_k + table[b] * stride, b, nb, n, lo, g, nv, top, p, padded);
    }
    softmax_rows(p, padded, b0, nb, g, top, sinks ? sinks + kh * g : NULL);
    for (int64_t j = 0; j < g; j++)
        for (int64_t c = 0; c < nv; c++) acc_v[j][c] = (v16f){};
    for (int64_t b = b0; b < nb; b++) { /* the values, weighted */
        prefetch_block(kh_v, table, b, nb, stride, BLOCK * ROW(dim) * KV_BYTES);
        int64_t keys = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
        weigh_block(acc_v, kh_v + table[b] * stride, 0, keys, p, padded, b, g, nv);
    }
    for (int64_t j = 0; j < g; j++)
        for (int64_t c = 0; c < nv; c++)
            store16(out + (row * num_heads + kh * g + j) * dim + 16 * c, acc_v[j][c]);
}

/* All KV heads of one row, block by block (a block's heads are adjacent in the pool: one
   contiguous run where row_task reads one per head; 15% faster from memory). Per (KV head,
   query head) the same operations in the same order as row_task: the same bits. acc: room
   for the row's H * D / 16 value accumulators (they do not fit registers), then as many
   for its scaled queries, loaded once for every block. */
INLINE void row_all_heads(const float *q, const kv_t *k, const kv_t *v,
                          const int32_t *tables, int64_t max_blocks, int64_t n, int64_t row,
                          int64_t num_heads, int64_t hkv, int64_t g, int64_t nv, float scale,
                          float *p, int64_t padded, float *out, v16f *acc, int64_t window,
                          const float *sinks) {
    int64_t dim = 16 * nv, nb = (n + BLOCK - 1) / BLOCK, stride = hkv * BLOCK * ROW(dim);
    int64_t lo = first_key(n, window), b0 = lo / BLOCK;
    const int32_t *table = tables + row * max_blocks;
    v16f top[MAX_KV][MAX_G], *qv = acc + num_heads * nv;
    for (int64_t kh = 0; kh < hkv; kh++)
        for (int64_t j = 0; j < g; j++) top[kh][j] = splat(-INFINITY);
    load_queries(q, row, num_heads, num_heads, nv, scale, qv);
    for (int64_t b = b0; b < nb; b++) {
        prefetch_block(k, table, b, nb, stride, stride * KV_BYTES);
        for (int64_t kh = 0; kh < hkv; kh++)
            score_block(qv + kh * g * nv, k + table[b] * stride + kh * BLOCK * ROW(dim), b, nb,
                        n, lo, g, nv, top[kh], p + kh * g * padded, padded);
    }
    for (int64_t kh = 0; kh < hkv; kh++)
        softmax_rows(p + kh * g * padded, padded, b0, nb, g, top[kh], sinks ? sinks + kh * g : NULL);
    for (int64_t i = 0; i < num_heads * nv; i++) acc[i] = (v16f){};
    for (int64_t b = b0; b < nb; b++) {
        prefetch_block(v, table, b, nb, stride, stride * KV_BYTES);
        int64_t keys = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
        for (int64_t kh = 0; kh < hkv; kh++)
            weigh_held(acc + kh * g * nv, v + table[b] * stride + kh * BLOCK * ROW(dim), 0, keys,
                       p + kh * g * padded, padded, b, g, nv);
    }
    for (int64_t i = 0; i < num_heads * nv; i++)
        store16(out + row * num_heads * dim + 16 * i, acc[i]);
}

/* weigh_block for all GROUP rows of a run at once, keys 0 .. keys - 1: each value vector
   is loaded once for the run's GROUP * G query heads, w of its D / 16 parts at a time so
   the accumulators fit the registers. Each accumulator gets the same multiply-adds in the
   same order as weigh_block row by row: the same bits. acc: [GROUP][G][nv], in memory. */
#define GROUP 4
#define ROW_ACCS 24 /* accumulators held at once: vector registers left for the values */
INLINE void weigh_run(v16f *acc, const kv_t *vb, int64_t keys, const float *p, int64_t padded,
                      int64_t b, int64_t g, int64_t nv) {
#if WF_AVX2 || WF_NEON /* the run's rows' heads, one after the other in acc and in p */
    weigh_held(acc, vb, 0, keys, p, padded, b, GROUP * g, nv);
#else
    int64_t w = ROW_ACCS / (GROUP * g) < nv ? ROW_ACCS / (GROUP * g) : nv;
    while (nv % w) w--; /* a constant where g and nv are: the parts go w at a time */
    for (int64_t c0 = 0; c0 < nv; c0 += w) {
        v16f a[GROUP][MAX_G][ROW_ACCS];
        for (int64_t r = 0; r < GROUP; r++)
            for (int64_t j = 0; j < g; j++)
                for (int64_t c = 0; c < w; c++) a[r][j][c] = acc[(r * g + j) * nv + c0 + c];
        for (int64_t s = 0; s < keys; s++) {
            v16f vv[ROW_ACCS];
            for (int64_t c = 0; c < w; c++) {
                vv[c] = KV16(vb + s * ROW(16 * nv), c0 + c);
                IN_REGISTER(vv[c]);
            }
            for (int64_t r = 0; r < GROUP; r++)
                for (int64_t j = 0; j < g; j++) {
                    v16f wt = splat(p[(r * g + j) * padded + b * BLOCK + s]);
                    for (int64_t c = 0; c < w; c++) a[r][j][c] = fma16(wt, vv[c], a[r][j][c]);
                }
        }
        for (int64_t r = 0; r < GROUP; r++)
            for (int64_t j = 0; j < g; j++)
                for (int64_t c = 0; c < w; c++) acc[(r * g + j) * nv + c0 + c] = a[r][j][c];
    }
#endif
}

/* A run of up to GROUP rows of one chunk (one table, consecutive positions) for KV head
   kh: block by block, each row in turn, so a block read from memory serves every row of
   the run from cache. Per row the same calls, in the same order, as row_task: the same
   bits (its value accumulators wait in acc between blocks, its scaled queries after them:
   room for GROUP * G * D / 16 each). */
INLINE void group_task(const float *q, const kv_t *k, const kv_t *v, const int32_t *tables,
                       int64_t max_blocks, const int32_t *lengths, int64_t row0, int64_t rows,
                       int64_t kh, int64_t num_heads, int64_t hkv, int64_t g, int64_t nv,
                       float scale, float *p, int64_t padded, float *out, v16f *acc,
                       int64_t window, const float *sinks) {
    int64_t dim = 16 * nv, stride = hkv * BLOCK * ROW(dim), nbs[GROUP], los[GROUP], b0s[GROUP];
    int64_t nb_last = (lengths[row0 + rows - 1] + BLOCK - 1) / BLOCK;
    const int32_t *table = tables + row0 * max_blocks;
    const kv_t *kh_k = k + kh * BLOCK * ROW(dim), *kh_v = v + kh * BLOCK * ROW(dim);
    v16f top[GROUP][MAX_G], *qv = acc + GROUP * g * nv;
    for (int64_t r = 0; r < rows; r++) {
        nbs[r] = (lengths[row0 + r] + BLOCK - 1) / BLOCK;
        los[r] = first_key(lengths[row0 + r], window);
        b0s[r] = los[r] / BLOCK; /* rising with r, as the lengths do */
        for (int64_t j = 0; j < g; j++) top[r][j] = splat(-INFINITY);
        load_queries(q + kh * g * dim, row0 + r, num_heads, g, nv, scale, qv + r * g * nv);
    }
    for (int64_t b = b0s[0]; b < nb_last; b++) {
        prefetch_block(kh_k, table, b, nb_last, stride, BLOCK * ROW(dim) * KV_BYTES);
        for (int64_t r = 0; r < rows; r++) {
            if (b >= nbs[r] || b < b0s[r]) continue;
            score_block(qv + r * g * nv, kh_k + table[b] * stride, b, nbs[r], lengths[row0 + r], los[r], g,
                        nv, top[r], p + r * g * padded, padded);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        softmax_rows(p + r * g * padded, padded, b0s[r], nbs[r], g, top[r],
                     sinks ? sinks + kh * g : NULL);
    for (int64_t i = 0; i < rows * g * nv; i++) acc[i] = (v16f){};
    for (int64_t b = b0s[0]; b < nb_last; b++) {
        prefetch_block(kh_v, table, b, nb_last, stride, BLOCK * ROW(dim) * KV_BYTES);
        const kv_t *vb = kh_v + table[b] * stride;
        int64_t common = 0; /* keys every row of the run sees in this block (row 0's) */
        if (rows == GROUP && GROUP * g <= ROW_ACCS && b < nbs[0] && b >= b0s[rows - 1]) {
            common = lengths[row0] - b * BLOCK < BLOCK ? lengths[row0] - b * BLOCK : BLOCK;
            weigh_run(acc, vb, common, p, padded, b, g, nv);
        }
        for (int64_t r = 0; r < rows; r++) {
            if (b >= nbs[r] || b < b0s[r]) continue;
            int64_t n = lengths[row0 + r], keys = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
            if (keys <= common) continue;
            weigh_held(acc + r * g * nv, vb, common, keys, p + r * g * padded, padded, b, g, nv);
        }
    }
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < g; j++)
            for (int64_t c = 0; c < nv; c++)
                store16(out + ((row0 + r) * num_heads + kh * g + j) * dim + 16 * c,
                        acc[(r * g + j) * nv + c]);
}

/* A few long rows on more threads than their (row, KV head) tasks keep busy (decode at
   batch 1: a model's 3 KV heads on 2 threads left one thread idle a third of the time,
   and decode there is bound by each core's reads of the keys and values). Each row is
   spread over all threads in three phases, with the same operations per score, per
   softmax and per value lane as row_task, so the same bits:
   - scores: the row's blocks split in contiguous ranges, each thread scoring its blocks
     for every KV head into the shared rows of p, with running maxima of its own (tops);
   - softmax: a KV head's G rows on one thread, its maxima the lane-wise maximum of every
     thread's (exact, whatever the order);
   - values: the row's (KV head, 16-lane part of D) units split in contiguous ranges, each
     thread weighing its units' lanes over every key in order.
   p: the row's num_heads rows of scores (padded apart); tops: [threads][num_heads] v16f;
   acc: [num_heads * nv] v16f. */
#define SPLIT_MIN_KEYS 1024 /* shorter rows: no faster (fragmented tables: slower) */
INLINE void row_split(const float *q, const kv_t *k, const kv_t *v, const int32_t *table,
                      int64_t n, int64_t row, int64_t num_heads, int64_t hkv, int64_t g,
                      int64_t nv, float scale, float *p, int64_t padded, v16f *tops, v16f *acc,
                      float *out, int t, int num_threads, int64_t window, const float *sinks) {
    int64_t dim = 16 * nv, row_len = ROW(dim), nb = (n + BLOCK - 1) / BLOCK;
    int64_t stride = hkv * BLOCK * row_len, lo = first_key(n, window), first = lo / BLOCK;
    v16f *top = tops + t * num_heads;
    for (int64_t h = 0; h < num_heads; h++) top[h] = splat(-INFINITY);
    int64_t b0 = first + (nb - first) * t / num_threads;
    int64_t b1 = first + (nb - first) * (t + 1) / num_threads;
    for (int64_t b = b0; b < b1; b++) {
        prefetch_block(k, table, b, b1, stride, stride * KV_BYTES);
        for (int64_t kh = 0; kh < hkv; kh++) {
            v16f qv[MAX_G * MAX_D / 16];
            load_queries(q + kh * g * dim, row, num_heads, g, nv, scale, qv);
            score_block(qv, k + table[b] * stride + kh * BLOCK * row_len, b, nb, n, lo, g, nv,
                        top + kh * g, p + kh * g * padded, padded);
        }
    }
    wf_barrier();
    for (int64_t kh = t; kh < hkv; kh += num_threads) {
        v16f most[MAX_G];
        for (int64_t j = 0; j < g; j++) {
            most[j] = tops[kh * g + j];
            for (int u = 1; u < num_threads; u++) {
                v16f other = tops[u * num_heads + kh * g + j];
                most[j] = max16(other, most[j]);
            }
        }
        softmax_rows(p + kh * g * padded, padded, first, nb, g, most, sinks ? sinks + kh * g : NULL);
    }
    wf_barrier();
    int64_t units = hkv * nv, u0 = units * t / num_threads, u1 = units * (t + 1) / num_threads;
    for (int64_t u = u0; u < u1; u++)
        for (int64_t j = 0; j < g; j++) acc[((u / nv) * g + j) * nv + u % nv] = (v16f){};
    for (int64_t b = first; b < nb; b++) {
        int64_t keys = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
        const kv_t *vb = v + table[b] * stride;
        if (b + 1 < nb) /* the next block's lines of this thread's units */
            for (int64_t u = u0; u < u1; u++)
                for (int64_t s = 0; s < BLOCK; s++)
                    __builtin_prefetch(v + table[b + 1] * stride + (u / nv) * BLOCK * row_len +
                                       s * row_len + ROW(16 * (u % nv)));
        for (int64_t u = u0; u < u1; u++) {
            int64_t kh = u / nv, c = u % nv;
            const kv_t *vt = vb + kh * BLOCK * row_len;
            const float *w = p + kh * g * padded + b * BLOCK;
            v16f a[MAX_G];
            for (int64_t j = 0; j < g; j++) a[j] = acc[(kh * g + j) * nv + c];
            for (int64_t s = 0; s < keys; s++) {
                v16f value = KV16(vt + s * row_len, c);
                for (int64_t j = 0; j < g; j++) a[j] = fma16(splat(w[j * padded + s]), value, a[j]);
            }
            for (int64_t j = 0; j < g; j++) acc[(kh * g + j) * nv + c] = a[j];
        }
    }
    for (int64_t u = u0; u < u1; u++)
        for (int64_t j = 0; j < g; j++) {
            int64_t kh = u / nv, c = u % nv;
            store16(out + (row * num_heads + kh * g + j) * dim + 16 * c,
                    acc[(kh * g + j) * nv + c]);
        }
    wf_barrier(); /* p, tops and acc are the next row's */
}

/* Runs of rows for group_task: a row joins the previous one's run where it is the next
   position of the same table (a chunk's rows), up to GROUP; starts[i] is run i's first
   row, starts[count] = num_rows. Returns the count. */
static int64_t find_runs(const int32_t *tables, int64_t max_blocks, const int32_t *lengths,
                         int64_t num_rows, int64_t *starts) {
    int64_t count = 0;
    for (int64_t r = 0; r < num_rows; r++) {
        int joins = r > 0 && r - starts[count - 1] < GROUP && lengths[r] == lengths[r - 1] + 1 &&
                    !memcmp(tables + r * max_blocks, tables + (r - 1) * max_blocks,
                            sizeof(int32_t) * max_blocks);
        if (!joins) starts[count++] = r;
    }
    starts[count] = num_rows;
    return count;
}

/* A task: one (row, KV head), or a whole row (all KV heads) where there are rows enough to
   keep the threads busy; either way the same bits. Its body is compiled for common
   (G, D / 16), the model families' head layouts, so accumulators stay in registers. */
#define SPECIALISED(G, NV)                                                                   \
    if (g == G && nv == NV) {                                                                \
        if (grouped)                                                                         \
            group_task(q, k, v, tables, max_blocks, lengths, row, starts[run + 1] - row, kh, \
                       num_heads, num_kv_heads, G, NV, scale, p, padded, out, acc, window,   \
                       sinks);                                                               \
        else if (whole_rows)                                                                 \
            row_all_heads(q, k, v, tables, max_blocks, n, row, num_heads, num_kv_heads, G,  \
                          NV, scale, p, padded, out, acc, window, sinks);                    \
        else                                                                                 \
            row_task(q, k, v, tables, max_blocks, n, row, kh, num_heads, num_kv_heads, G,   \
                     NV, scale, p, padded, out, window, sinks);                              \
        continue;                                                                            \
    }

/* Room one thread of wf_paged_rows_with takes, in floats: the scores of its task's rows'
   heads (rows padded to whole blocks, plus one), then their value accumulators, then their
   scaled queries. */
static int64_t thread_floats(int64_t num_heads, int64_t g, int64_t nv, int64_t padded) {
    int64_t heads_room = num_heads > GROUP * g ? num_heads : GROUP * g;
    return heads_room * (padded + BLOCK) + 2 * heads_room * nv * 16;
}

static int64_t padded_length(const int32_t *lengths, int64_t num_rows) {
    int64_t longest = 0;
    for (int64_t r = 0; r < num_rows; r++) longest = lengths[r] > longest ? lengths[r] : longest;
    return (longest + BLOCK - 1) / BLOCK * BLOCK;
}

/* Floats of scratch wf_paged_rows_with takes: each thread's room, then the runs' starts. */
#if KV_KIND == 0 /* one definition, in the float32 build */
int64_t wf_paged_rows_scratch(const int32_t *lengths, int64_t num_rows, int64_t num_heads,
                              int64_t num_kv_heads, int64_t dim, int num_threads) {
    int64_t g = num_heads / num_kv_heads, padded = padded_length(lengths, num_rows);
    return num_threads * thread_floats(num_heads, g, dim / 16, padded) + 2 * (num_rows + 1);
}
#else
int64_t wf_paged_rows_scratch(const int32_t *lengths, int64_t num_rows, int64_t num_heads,
                              int64_t num_kv_heads, int64_t dim, int num_threads);
#endif

/* A call's arguments and plan, shared by its region's threads. */
typedef struct {
    const float *q;
    const kv_t *k, *v;
    const int32_t *tables, *lengths;
    int64_t max_blocks, num_rows, num_heads, num_kv_heads, g, nv, padded, room, heads_room;
    int64_t window, tasks, next; /* next: the first task no thread took yet */
    float scale;
    float *out, *scratch;
    const float *sinks;
    const int64_t *starts;
    int grouped, whole_rows;
} Paged;

/* Every row spread over all the threads, one row after the other (row_split). */
static void split_rows(void *ctx, int t, int threads) {
    const Paged *a = ctx;
    int64_t g = a->g, nv = a->nv;
    v16f *acc = (v16f *)(a->scratch + a->heads_room * (a->padded + BLOCK)); /* thread 0's room */
    v16f *tops = (v16f *)(a->scratch + a->room); /* the threads' maxima from thread 1's on */
    for (int64_t row = 0; row < a->num_rows; row++) {
#define SPLIT(G, NV)                                                                          \
    if (g == G && nv == NV) {                                                                 \
        row_split(a->q, a->k, a->v, a->tables + row * a->max_blocks, a->lengths[row], row,    \
                  a->num_heads, a->num_kv_heads, G, NV, a->scale, a->scratch, a->padded,      \
                  tops, acc, a->out, t, threads, a->window, a->sinks);                        \
        continue;                                                                             \
    }
        SPLIT(3, 4) SPLIT(1, 8) SPLIT(2, 8) SPLIT(4, 4) SPLIT(7, 8) SPLIT(g, nv)
    }
}

/* Tasks taken one at a time until none is left. */
static void take_tasks(void *ctx, int t, int threads) {
    (void)threads;
    Paged *a = ctx;
    const float *q = a->q, *sinks = a->sinks;
    float scale = a->scale;
    const kv_t *k = a->k, *v = a->v;
    const int32_t *tables = a->tables, *lengths = a->lengths;
    const int64_t *starts = a->starts;
    int64_t max_blocks = a->max_blocks, num_heads = a->num_heads, num_kv_heads = a->num_kv_heads;
    int64_t g = a->g, nv = a->nv, padded = a->padded, window = a->window;
    int grouped = a->grouped, whole_rows = a->whole_rows;
    float *out = a->out, *p = a->scratch + t * a->room;
    v16f *acc = (v16f *)(p + a->heads_room * (padded + BLOCK));
    for (int64_t task; (task = wf_take(&a->next, 1)) < a->tasks;) {
        int64_t run = grouped ? task / num_kv_heads : 0;
        int64_t row = grouped ? starts[run] : whole_rows ? task : task / num_kv_heads;
        int64_t kh = whole_rows ? 0 : task % num_kv_heads, n = lengths[row];
        SPECIALISED(3, 4) SPECIALISED(4, 8) SPECIALISED(8, 8) SPECIALISED(7, 8)
        SPECIALISED(1, 4) SPECIALISED(1, 8) SPECIALISED(2, 8) SPECIALISED(4, 4)
        SPECIALISED(g, nv) /* any other layout: the same code, not specialised */
    }
}

/* scratch: wf_paged_rows_scratch(...) floats, 64-byte aligned. window: each row sees its
   last `window` keys only (0: all of them); sinks: NULL, or a learned logit per query head
   that joins each softmax's denominator (gpt-oss). */
static void KV_NAME(paged_rows)(const float *q, const kv_t *k, const kv_t *v, const int32_t *tables,
                        int64_t max_blocks, const int32_t *lengths, int64_t num_rows,
                        int64_t num_heads, int64_t num_kv_heads, int64_t dim, float scale,
                        float *out, int num_threads, float *scratch, int64_t window,
                        const float *sinks) {
    int64_t g = num_heads / num_kv_heads, nv = dim / 16;
    int64_t padded = padded_length(lengths, num_rows);
    int64_t room = thread_floats(num_heads, g, nv, padded);
    int64_t *starts = (int64_t *)(scratch + num_threads * room);
    int64_t runs = find_runs(tables, max_blocks, lengths, num_rows, starts);
    int grouped = runs < num_rows; /* some chunk's rows: runs of rows per KV head */
    int whole_rows = !grouped && num_rows >= 2 * num_threads && num_kv_heads <= MAX_KV;
    int64_t tasks = grouped ? runs * num_kv_heads : whole_rows ? num_rows : num_rows * num_kv_heads;
    int64_t shortest = lengths[0] - first_key(lengths[0], window); /* keys a row reads */
    for (int64_t r = 1; r < num_rows; r++) {
        int64_t keys = lengths[r] - first_key(lengths[r], window);
        shortest = keys < shortest ? keys : shortest;
    }
    Paged a = {q, k, v, tables, lengths, max_blocks, num_rows, num_heads, num_kv_heads, g, nv,
               padded, room, num_heads > GROUP * g ? num_heads : GROUP * g, window, tasks, 0,
               scale, out, scratch, sinks, starts, grouped, whole_rows};
    int split = !grouped && !whole_rows && num_threads >= 2 && shortest >= SPLIT_MIN_KEYS &&
                num_rows * num_kv_heads < 2 * num_threads;
    wf_parallel(num_threads, split ? split_rows : take_tasks, &a);
}

/* paged_rows for the all-layers call (layers.c) */
void KV_NAME(wf_paged_rows_with)(const float *q, const kv_t *k, const kv_t *v, const int32_t *tables,
                        int64_t max_blocks, const int32_t *lengths, int64_t num_rows,
                        int64_t num_heads, int64_t num_kv_heads, int64_t dim, float scale,
                        float *out, int num_threads, float *scratch, int64_t window,
                        const float *sinks) {
    KV_NAME(paged_rows)(q, k, v, tables, max_blocks, lengths, num_rows, num_heads, num_kv_heads,
                        dim, scale, out, num_threads, scratch, window, sinks);
}

/* paged_rows with scratch of its own: 0, or the bytes it could not allocate (nothing
   done). */
int64_t KV_NAME(wf_paged_rows_windowed)(const float *q, const kv_t *k, const kv_t *v,
                      const int32_t *tables, int64_t max_blocks, const int32_t *lengths,
                      int64_t num_rows, int64_t num_heads, int64_t num_kv_heads, int64_t dim,
                      float scale, float *out, int num_threads, int64_t window,
                      const float *sinks) {
    int64_t floats =
        wf_paged_rows_scratch(lengths, num_rows, num_heads, num_kv_heads, dim, num_threads);
    int64_t bytes = sizeof(float) * ((floats + 15) / 16 * 16);
    float *scratch = aligned_alloc(64, bytes);
    if (!scratch) return bytes;
    KV_NAME(paged_rows)(q, k, v, tables, max_blocks, lengths, num_rows, num_heads, num_kv_heads,
                        dim, scale, out, num_threads, scratch, window, sinks);
    free(scratch);
    return 0;
}

/* Causal attention over every key, scratch of its own */
int64_t KV_NAME(wf_paged_rows)(const float *q, const kv_t *k, const kv_t *v, const int32_t *tables,
                      int64_t max_blocks, const int32_t *lengths, int64_t num_rows,
                      int64_t num_heads, int64_t num_kv_heads, int64_t dim, float scale,
                      float *out, int num_threads) {
    return KV_NAME(wf_paged_rows_windowed)(q, k, v, tables, max_blocks, lengths, num_rows,
                                           num_heads, num_kv_heads, dim, scale, out,
                                           num_threads, 0, NULL);
}
