/* int_tiles.h's products in 512-bit registers (AVX-512BW; vpdpbusd and vpdpwssd with VNNI):
   64 weights a step (here a 512-bit integer op costs no more than a 256-bit one). A K-quant
   block's weights come straight from the file's block into registers (Q8_0's and MXFP4's
   too, two blocks a step; the other 32-weight types' from the chunk, int_blocks.h's
   unpacking), no stores between; a task of many pairs unpacks its K-quant blocks once into
   the chunk (k_unpack512) and reads two vectors a step from there. Each output's sums then reduced 8 outputs at a time, with int_avx2.h's
   float steps. */
#ifndef WARMFLEET_INT_AVX512_H
#define WARMFLEET_INT_AVX512_H

#include "int_avx2.h"

/* acc + sum over int16 pairs of (c * x) * s */
static inline __m512i dot_scaled512(__m512i acc, __m512i c, __m512i x, __m512i s) {
#if INT_VNNI
    return _mm512_dpwssd_epi32(acc, _mm512_maddubs_epi16(c, x), s);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(c, x), s));
#endif
}

/* acc + sum of c * x over each 4 bytes (Q8_0 without VNNI: |w| times x with w's sign) */
static inline __m512i dot_plain512(int t, __m512i acc, __m512i c, __m512i x) {
#if INT_VNNI
    (void)t;
    return _mm512_dpbusd_epi32(acc, c, x);
#else
    if (signed_codes(t)) {
        __m512i w = _mm512_xor_si512(c, _mm512_set1_epi8(-128));
        x = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w), _mm512_setzero_si512(), x);
        c = _mm512_abs_epi8(w);
    }
    return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(c, x),
                                                   _mm512_set1_epi16(1)));
#endif
}

/* Lanes 0-7: the sums of the low 256 bits of v[0 .. 8); lanes 8-15: of the high 256 bits
   (v[4 .. 8) zero where !two). Pairs, then quads, within 128-bit lanes, then across. */
static inline __m512i reduce8x2(const __m512i *v) {
    __m512i q[2];
    for (int h = 0; h < 2; h++) {
        const __m512i *u = v + 4 * h;
        __m512i a = _mm512_add_epi32(_mm512_unpacklo_epi32(u[0], u[1]),
                                     _mm512_unpackhi_epi32(u[0], u[1]));
        __m512i b = _mm512_add_epi32(_mm512_unpacklo_epi32(u[2], u[3]),
                                     _mm512_unpackhi_epi32(u[2], u[3]));
        q[h] = _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
    } /* q[h]'s 128-bit lane l: u[0 .. 4)'s sums over their lane l */
    __m512i s = _mm512_add_epi32(_mm512_shuffle_i64x2(q[0], q[1], _MM_SHUFFLE(2, 0, 2, 0)),
                                 _mm512_shuffle_i64x2(q[0], q[1], _MM_SHUFFLE(3, 1, 3, 1)));
    return _mm512_shuffle_i64x2(s, s, _MM_SHUFFLE(3, 1, 2, 0));
}

static inline __m256i low256(__m512i v) { return _mm512_castsi512_si256(v); }
static inline __m256i high256(__m512i v) { return _mm512_extracti64x4_epi64(v, 1); }

/* What a K-quant block of one weight row gives its steps, decoded from the file's block
   (raw). sc: int16 scales in lanes 0-15 (Q6_K's 16, one a 16; Q4_K's and Q5_K's 8, one a
   32). */
typedef struct {
    const uint8_t *raw;
    __m512i sc;
    __m256i aux;
} KRow;

/* int16 lane l of step i's scales is sc[16 / per * i + l / per] (per: lanes a scale) */
static inline __m512i scale_index(int i, int per) {
    const __m512i lane = _mm512_set_epi16(31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18,
                                          17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3,
                                          2, 1, 0);
    return _mm512_add_epi16(_mm512_set1_epi16((int16_t)(32 / per * i)),
                            _mm512_srli_epi16(lane, per == 16 ? 4 : 3));
}

/* 16 bytes at each of the rows' blocks b[j], row j in 128-bit lane j */
static inline __m512i lanes_at(const uint8_t *const *b) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)b[0]));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)b[1]), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)b[2]), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)b[3]), 3);
}

static inline void q6_rows_raw(const uint8_t *const *b, KRow *k, __m128 *d4, __m128 *m4) {
    uint16_t h[IROWS];
    for (int j = 0; j < IROWS; j++) {
        __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b[j] + 192)));
        k[j].raw = b[j];
        k[j].sc = _mm512_zextsi256_si512(sc);
        k[j].aux = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5));
        memcpy(h + j, b[j] + 208, sizeof h[j]);
    }
    *d4 = _mm_cvtph_ps(_mm_set_epi16(0, 0, 0, 0, h[3], h[2], h[1], h[0]));
    *m4 = _mm_setzero_ps();
}

/* The IROWS rows' K-quant blocks b[j]: their scales and aux (k[j]), d and m (a lane a row).
   Q4_K/Q5_K: every row's 6-bit scales and mins at once (llama.cpp's masks on 32-bit words;
   lane j's bytes [sc0 .. sc7, min0 .. min7]), aux -[min0, min0, min1, ..]. */
static inline void k_rows_raw(int t, const uint8_t *const *b, KRow *k, __m128 *d4, __m128 *m4) {
    if (t == T_Q6_K) {
        q6_rows_raw(b, k, d4, m4);
        return;
    }
    __m512i v = lanes_at(b); /* words: d | dmin << 16, u0, u1, u2 */
    __m512i lo = _mm512_srlv_epi32(_mm512_shuffle_epi32(v, _MM_SHUFFLE(3, 2, 3, 1)),
                                   _mm512_set4_epi32(4, 0, 0, 0));
    lo = _mm512_and_si512(lo, _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f));
    __m512i hi = _mm512_srli_epi32(_mm512_shuffle_epi32(v, _MM_SHUFFLE(2, 2, 1, 1)), 6);
    hi = _mm512_and_si512(hi, _mm512_set4_epi32(0x03030303, 0, 0x03030303, 0));
    __m128i packed[IROWS]; /* (a lane by index: no immediate to unroll for) */
    _mm512_storeu_si512(packed, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)));
    const __m256i mins = _mm256_set_epi16(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9,
                                          8, 8);
    for (int j = 0; j < IROWS; j++) {
        __m256i w = _mm256_cvtepu8_epi16(packed[j]);
        k[j].raw = b[j];
        k[j].sc = _mm512_zextsi256_si512(w);
        k[j].aux = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_permutexvar_epi16(mins, w));
    }
    const __m512i firsts = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 12, 8, 4, 0);
    __m128i dm = _mm512_castsi512_si128(_mm512_permutexvar_epi32(firsts, v));
    __m256 both = _mm256_cvtph_ps(dm); /* d0, m0, d1, m1, .. */
    both = _mm256_permutevar8x32_ps(both, _mm256_set_epi32(7, 5, 3, 1, 6, 4, 2, 0));
    *d4 = _mm256_castps256_ps128(both);
    *m4 = _mm256_extractf128_ps(both, 1);
}

/* both 256-bit halves of v shifted left (sllv) or right by their own counts */
static inline __m512i shift_halves(__m512i v, int left, int lo, int hi) {
    __m512i n = _mm512_inserti64x4(_mm512_set1_epi16((int16_t)lo), _mm256_set1_epi16((int16_t)hi),
                                   1);
    return left ? _mm512_sllv_epi16(v, n) : _mm512_srlv_epi16(v, n);
}

static inline __m512i broadcast256(const uint8_t *p) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
}

/* Step i's 64 codes from the file's block (int_blocks.h's k4_block and q6_block, 64 at a
   time) and their scales */
static inline void k_step_raw(int t, const KRow *k, int i, __m512i *codes, __m512i *scales) {
    const uint8_t *b = k->raw;
    const __m512i low4 = _mm512_set1_epi8(15);
    if (t == T_Q6_K) { /* ql's 64 bytes of half i / 2: low nibbles (i even) or high */
        __m512i ql = _mm512_loadu_si512(b + 64 * (i / 2));
        __m512i lo = _mm512_and_si512(i % 2 ? _mm512_srli_epi16(ql, 4) : ql, low4);
        __m512i qh = broadcast256(b + 128 + 32 * (i / 2)); /* bits 4u', 4u' + 2 -> 4 */
        qh = i % 2 ? shift_halves(qh, 0, 0, 2) : shift_halves(qh, 1, 4, 2);
        *codes = _mm512_or_si512(lo, _mm512_and_si512(qh, _mm512_set1_epi8(0x30)));
        *scales = _mm512_permutexvar_epi16(scale_index(i, 8), k->sc);
        return;
    } /* Q4_K/Q5_K: sub-blocks 2i (low nibbles) and 2i + 1 (high) of 32 bytes */
    __m512i q = broadcast256(b + (t == T_Q5_K ? 48 : 16) + 32 * i);
    __m512i c = _mm512_and_si512(shift_halves(q, 0, 0, 4), low4);
    if (t == T_Q5_K) { /* qh's bit s (2i, 2i + 1) -> bit 4 */
        __m512i qh = broadcast256(b + 16);
        qh = i < 2 ? shift_halves(qh, 1, 4 - 2 * i, 3 - 2 * i)
                   : shift_halves(qh, 0, 2 * i - 4, 2 * i - 3);
        c = _mm512_or_si512(c, _mm512_and_si512(qh, _mm512_set1_epi8(16)));
    }
    *codes = c;
    *scales = _mm512_permutexvar_epi16(scale_index(i, 16), k->sc);
}

/* A K-quant block of IROWS weight rows (k, their d and m in d4, m4) against mr rows; each
   row's block the file's (k[j].raw) or, where `unpacked`, a chunk's (k[j].raw: its 256
   codes, then the scale vectors they meet, int_blocks.h's layout: two loads a step) */
static inline __attribute__((always_inline)) void k_block512(int t, int unpacked, int mr,
                                                             const KRow *k, __m128 d4,
                                                             __m128 m4, const Acts *xs,
                                                             int64_t g, float *acc) {
    __m512i isum[INT_MR][IROWS] = {};
    for (int i = 0; i < 4; i++) {
        __m512i x[INT_MR], cv, sv;
        for (int r = 0; r < mr; r++) x[r] = _mm512_loadu_si512(xs[r].q + g * 256 + 64 * i);
        for (int j = 0; j < IROWS; j++) {
            if (unpacked) {
                cv = _mm512_loadu_si512(k[j].raw + 64 * i);
                sv = _mm512_loadu_si512(k[j].raw + 256 + 64 * i);
            } else {
                k_step_raw(t, k + j, i, &cv, &sv);
            }
            for (int r = 0; r < mr; r++) isum[r][j] = dot_scaled512(isum[r][j], cv, x[r], sv);
        }
    }
    for (int r = 0; r < mr; r += 2) { /* lanes: isum folded to 8, then aux's sum (min) */
        int two = r + 1 < mr;
        __m512i packed[8] = {};
        for (int h = 0; h <= two; h++) {
            __m256i s16 = _mm256_loadu_si256((const __m256i *)(xs[r + h].sum16 + g * 16));
            for (int j = 0; j < IROWS; j++) {
                __m256i f = _mm256_add_epi32(low256(isum[r + h][j]), high256(isum[r + h][j]));
                __m256i p = _mm256_madd_epi16(k[j].aux, s16);
                if (!has_min(t)) {
                    f = _mm256_add_epi32(f, p);
                    p = _mm256_setzero_si256();
                }
                packed[4 * h + j] = _mm512_inserti64x4(_mm512_castsi256_si512(f), p, 1);
            }
        }
        __m512i sums = reduce8x2(packed);
        float_steps(t, d4, m4, xs, r, two, g, low256(sums), high256(sums), acc);
    }
}

/* Block g of the file's rows w[0 .. IROWS) (row bytes rb) against mr rows, unpacked in
   registers */
static inline __attribute__((always_inline)) void k_raw_block(int t, int mr, const uint8_t *w,
                                                              int64_t rb, int nr,
                                                              const Acts *xs, int64_t g,
                                                              float *acc) {
    KRow k[IROWS];
    const uint8_t *b[IROWS];
    __m128 d4, m4;
    for (int j = 0; j < IROWS; j++) b[j] = w + (j < nr ? j : nr - 1) * rb + g * block_bytes(t);
    k_rows_raw(t, b, k, &d4, &m4);
    k_block512(t, 0, mr, k, d4, m4, xs, g, acc);
}

/* Blocks [b0, b0 + c->nb) of the file's rows w[0 .. IROWS) (row bytes rb; rows past nr
   repeat the last) into chunk c as k_step_raw reads them: each row's block its 4 steps'
   codes, then their scales (int_blocks.h's layout, in fewer instructions) */
static inline __attribute__((always_inline)) void k_unpack512(int t, const uint8_t *w,
                                                              int64_t rb, int nr, int64_t b0,
                                                              const Chunk *c) {
    for (int b = 0; b < c->nb; b++) {
        KRow k[IROWS];
        const uint8_t *blk[IROWS];
        __m128 d4, m4;
        for (int j = 0; j < IROWS; j++)
            blk[j] = w + (j < nr ? j : nr - 1) * rb + (b0 + b) * block_bytes(t);
        k_rows_raw(t, blk, k, &d4, &m4);
        _mm_storeu_ps(c->d + 4 * b, d4);
        _mm_storeu_ps(c->m + 4 * b, m4);
        for (int j = 0; j < IROWS; j++) {
            uint8_t *to = c->codes + (int64_t)(j * c->nb + b) * 512;
            _mm256_storeu_si256((void *)(c->aux + (j * c->nb + b) * 16), k[j].aux);
            for (int i = 0; i < 4; i++) {
                __m512i cv, sv;
                k_step_raw(t, k + j, i, &cv, &sv);
                _mm512_storeu_si512(to + 64 * i, cv);
                _mm512_storeu_si512(to + 256 + 64 * i, sv);
            }
        }
    }
}

/* K-quant block b of a chunk (int_blocks.h's unpacking) against mr rows: the same sums and
   float steps as k_raw_block on the file's block, so the same bits */
static inline __attribute__((always_inline)) void k_chunk_block512(int t, int mr,
                                                                   const Chunk *c, int b,
                                                                   const Acts *xs, int64_t g,
                                                                   float *acc) {
    KRow k[IROWS];
    for (int j = 0; j < IROWS; j++) {
        k[j].raw = c->codes + (int64_t)(j * c->nb + b) * 512;
        k[j].sc = _mm512_setzero_si512();
        k[j].aux = _mm256_loadu_si256((const void *)(c->aux + (j * c->nb + b) * 16));
    }
    k_block512(t, 1, mr, k, _mm_loadu_ps(c->d + 4 * b), _mm_loadu_ps(c->m + 4 * b), xs, g, acc);
}

/* The float steps of blocks g and g + 1 (g + 1 only where `both`) from their integer sums
   isum[r][j] (block g's in the low 256 bits, g + 1's in the high): d, m the blocks' rows'
   scales and mins, IROWS a block, block g's first */
static inline __attribute__((always_inline)) void pair_steps512(
    int t, int mr, __m512i isum[INT_MR][IROWS], const Acts *xs, int64_t g, int both,
    const float *d, const float *m, float *acc) {
    for (int r = 0; r < mr; r += 2) {
        int two = r + 1 < mr;
        __m512i packed[8] = {};
        for (int h = 0; h <= two; h++)
            for (int j = 0; j < IROWS; j++) packed[4 * h + j] = isum[r + h][j];
        __m512i sums = reduce8x2(packed); /* block g's sums, then g + 1's */
        for (int h = 0; h <= both; h++) {
            const int16_t *s0 = xs[r].sum16 + 2 * (g + h), *s1 = xs[r + two].sum16 + 2 * (g + h);
            __m256i qsum = _mm256_set_m128i(_mm_set1_epi32(s1[0] + s1[1]),
                                            _mm_set1_epi32(s0[0] + s0[1]));
            __m256i is = h ? high256(sums) : low256(sums);
            is = _mm256_sub_epi32(is, _mm256_mullo_epi32(qsum, _mm256_set1_epi32(dot_zero(t))));
            float_steps(t, _mm_loadu_ps(d + 4 * h), _mm_loadu_ps(m + 4 * h), xs, r, two, g + h,
                        is, qsum, acc);
        }
    }
}

/* 32-weight blocks b and b + 1 (b + 1 absent at the chunk's end: zeros, its steps skipped) */
static inline __attribute__((always_inline)) void small_pair512(int t, int mr, const Chunk *c,
                                                                int b, const Acts *xs,
                                                                int64_t g, float *acc) {
    int both = b + 1 < c->nb;
    __m512i isum[INT_MR][IROWS] = {}, x[INT_MR];
    for (int r = 0; r < mr; r++)
        x[r] = both ? _mm512_loadu_si512(xs[r].q + g * 32)
                    : _mm512_zextsi256_si512(_mm256_loadu_si256((const void *)(xs[r].q + g * 32)));
    for (int j = 0; j < IROWS; j++) {
        const uint8_t *e = c->codes + (j * c->nb + b) * 32;
        __m512i cv = both ? _mm512_loadu_si512(e)
                          : _mm512_zextsi256_si512(_mm256_loadu_si256((const void *)e));
        for (int r = 0; r < mr; r++) isum[r][j] = dot_plain512(t, isum[r][j], cv, x[r]);
    }
    pair_steps512(t, mr, isum, xs, g, both, c->d + 4 * b, c->m + 4 * b, acc);
}

/* The raw path's 32-weight types: Q8_0 and MXFP4 (their codes are one load and one xor, or
   one byte shuffle, from the file's block) */
static inline int small_raw(int t) { return t == T_Q8_0 || t == T_MXFP4; }

/* Block blk's 32 codes, as int_blocks.h's small_block unpacks them (w + 128) */
static inline __m256i small_codes_raw(int t, const uint8_t *blk) {
    if (t == T_Q8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const void *)(blk + 2)),
                                _mm256_set1_epi8((char)0x80));
    const __m128i table = _mm_setr_epi8((char)128, (char)129, (char)130, (char)131, (char)132,
                                        (char)134, (char)136, (char)140, (char)128, 127, 126,
                                        125, 124, 122, 120, 116);
    __m128i q = _mm_loadu_si128((const void *)(blk + 1)), low = _mm_set1_epi8(15);
    __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(q, low));
    __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(q, 4), low));
    return _mm256_set_m128i(hi, lo);
}

/* Block blk's scale, as small_block gives it */
static inline float small_d_raw(int t, const uint8_t *blk) {
    if (t == T_Q8_0) return half(blk);
    Groups g;
    block_groups(t, blk, &g);
    return g.v[0];
}

/* small_pair512 on blocks g and g + 1 (g + 1 past the row's nb blocks: zeros, its steps
   skipped) of the file's rows w[0 .. IROWS) (row bytes rb): the same codes, sums and float
   steps, so the same bits, with no chunk between */
static inline __attribute__((always_inline)) void small_raw_pair512(int t, int mr,
                                                                    const uint8_t *w, int64_t rb,
                                                                    int nr, int64_t nb,
                                                                    const Acts *xs, int64_t g,
                                                                    float *acc) {
    int both = g + 1 < nb, bb = block_bytes(t);
    __m512i isum[INT_MR][IROWS] = {}, x[INT_MR];
    float d[2][IROWS]; /* blocks g's and g + 1's scales, the rows side by side */
    for (int r = 0; r < mr; r++)
        x[r] = both ? _mm512_loadu_si512(xs[r].q + g * 32)
                    : _mm512_zextsi256_si512(_mm256_loadu_si256((const void *)(xs[r].q + g * 32)));
    for (int j = 0; j < IROWS; j++) {
        const uint8_t *blk = w + (j < nr ? j : nr - 1) * rb + g * bb;
        __m512i cv = _mm512_zextsi256_si512(small_codes_raw(t, blk));
        d[0][j] = small_d_raw(t, blk);
        d[1][j] = 0.0f;
        if (both) {
            cv = _mm512_inserti64x4(cv, small_codes_raw(t, blk + bb), 1);
            d[1][j] = small_d_raw(t, blk + bb);
        }
        for (int r = 0; r < mr; r++) isum[r][j] = dot_plain512(t, isum[r][j], cv, x[r]);
    }
    const float m[2 * IROWS] = {0};
    pair_steps512(t, mr, isum, xs, g, both, d[0], m, acc);
}

#endif
