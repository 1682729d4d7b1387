/* int_tiles.h's products in 256-bit registers (AVX2 with FMA; AVX-512's VNNI forms where
   built for it): 32 weights a step, each output's block sums reduced across lanes 8
   outputs at a time, then their float steps 8 outputs at a time. The AVX-512 path
   (int_avx512.h) shares its float steps. */
#ifndef WARMFLEET_INT_AVX2_H
#define WARMFLEET_INT_AVX2_H

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define INT_VNNI 1
#else
#define INT_VNNI 0
#endif
#define INT_MR (WF_AVX2 ? 2 : 4) /* activation rows a tile: AVX2's 16 registers hold 2 */

/* acc + sum over pairs of (c * x) * s (s per int16 lane): Q4_K's sub-scales and the like */
static inline __m256i dot_scaled(__m256i acc, __m256i c, __m256i x, __m256i s) {
#if INT_VNNI
    return _mm256_dpwssd_epi32(acc, _mm256_maddubs_epi16(c, x), s);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(c, x), s));
#endif
}

/* acc + sum of c * x over each 4 bytes. Without VNNI maddubs would saturate on Q8_0's
   codes (w + 128): there |w| times x with w's sign (dot_zero says so). */
static inline __m256i dot_plain(int t, __m256i acc, __m256i c, __m256i x) {
#if INT_VNNI
    (void)t;
    return _mm256_dpbusd_epi32(acc, c, x);
#else
    if (signed_codes(t)) {
        __m256i w = _mm256_xor_si256(c, _mm256_set1_epi8(-128));
        c = _mm256_abs_epi8(w);
        x = _mm256_sign_epi8(x, w);
    }
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(c, x),
                                                   _mm256_set1_epi16(1)));
#endif
}

/* the zero point dot_plain's sums still carry */
static inline int dot_zero(int t) { return INT_VNNI || !signed_codes(t) ? zero_point(t) : 0; }

/* lane i: the sum of v[i]'s lanes (v[4 .. 7] absent where !two: lanes 4-7 then unused) */
static inline __m256i reduce8(const __m256i *v, int two) {
    __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    __m256i ab = _mm256_hadd_epi32(a, b); /* [v0..v3 low halves | high halves] */
    __m256i cd = ab;
    if (two) {
        __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
        cd = _mm256_hadd_epi32(c, d);
    }
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20),
                            _mm256_permute2x128_si256(ab, cd, 0x31));
}

/* lanes r * 4 + j (rows r0, r0 + 1): d_x of row r, d or m of weight row j */
static inline __m256 row_lanes(const Acts *xs, int r0, int two, int64_t g) {
    return _mm256_set_m128(_mm_set1_ps(xs[r0 + two].d[g]), _mm_set1_ps(xs[r0].d[g]));
}

/* The float steps of one block for rows r0 (and r0 + 1), the weight rows' d and m in d4,
   m4: acc at [r0][0 .. 8). */
static inline void float_steps(int t, __m128 d4, __m128 m4, const Acts *xs, int r0, int two,
                               int64_t g, __m256i isum, __m256i msum, float *acc) {
    /* one row's accumulators loaded as they were stored, 128 bits: a load wider than the
       store before it waits for that store to retire, a stall a block (measured: a quarter
       of a one-row MXFP4 product's time) */
    __m256 a = two ? _mm256_loadu_ps(acc + 4 * r0)
                   : _mm256_zextps128_ps256(_mm_loadu_ps(acc + 4 * r0));
    __m256 dx = row_lanes(xs, r0, two, g);
    __m256 dw = _mm256_set_m128(d4, d4);
    a = _mm256_fmadd_ps(_mm256_mul_ps(dw, dx), _mm256_cvtepi32_ps(isum), a);
    if (has_min(t)) {
        __m256 mw = _mm256_set_m128(m4, m4);
        a = _mm256_fmadd_ps(_mm256_mul_ps(mw, dx), _mm256_cvtepi32_ps(msum), a);
    }
    if (two)
        _mm256_storeu_ps(acc + 4 * r0, a);
    else
        _mm_storeu_ps(acc + 4 * r0, _mm256_castps256_ps128(a));
}

/* K-quant block b: 8 steps of 32 codes, their per-16 scales applied as int16 products */
static inline __attribute__((always_inline)) void k_block256(int t, int mr, const Chunk *c, int b,
                                                          const Acts *xs, int64_t g,
                                                          float *acc) {
    __m256i isum[INT_MR][IROWS] = {}, msum[INT_MR][IROWS] = {};
    for (int i = 0; i < 8; i++) {
        __m256i x[INT_MR];
        for (int r = 0; r < mr; r++)
            x[r] = _mm256_loadu_si256((const void *)(xs[r].q + g * 256 + 32 * i));
        for (int j = 0; j < IROWS; j++) {
            const uint8_t *e = c->codes + (j * c->nb + b) * 512 + 32 * i;
            __m256i cv = _mm256_loadu_si256((const void *)e);
            __m256i sv = _mm256_loadu_si256((const void *)(e + 256));
            for (int r = 0; r < mr; r++) isum[r][j] = dot_scaled(isum[r][j], cv, x[r], sv);
        }
    }
    for (int r = 0; r < mr; r++) { /* aux against the activations' sums per 16 */
        __m256i s16 = _mm256_loadu_si256((const void *)(xs[r].sum16 + g * 16));
        for (int j = 0; j < IROWS; j++) {
            __m256i aux = _mm256_loadu_si256((const void *)(c->aux + (j * c->nb + b) * 16));
            __m256i p = _mm256_madd_epi16(aux, s16);
            if (has_min(t))
                msum[r][j] = p;
            else
                isum[r][j] = _mm256_add_epi32(isum[r][j], p);
        }
    }
    for (int r = 0; r < mr; r += 2) {
        int two = r + 1 < mr;
        float_steps(t, _mm_loadu_ps(c->d + 4 * b), _mm_loadu_ps(c->m + 4 * b), xs, r, two, g,
                    reduce8(isum[r], two), reduce8(msum[r], two), acc);
    }
}

/* 32-weight block b: one step; the zero point and the min from the activations' sums */
static inline __attribute__((always_inline)) void small_block256(int t, int mr,
                                                                  const Chunk *c, int b,
                                                                  const Acts *xs, int64_t g,
                                                                  float *acc) {
    __m256i isum[INT_MR][IROWS] = {};
    __m256i x[INT_MR];
    for (int r = 0; r < mr; r++) x[r] = _mm256_loadu_si256((const void *)(xs[r].q + g * 32));
    for (int j = 0; j < IROWS; j++) {
        __m256i cv = _mm256_loadu_si256((const void *)(c->codes + (j * c->nb + b) * 32));
        for (int r = 0; r < mr; r++) isum[r][j] = dot_plain(t, isum[r][j], cv, x[r]);
    }
    for (int r = 0; r < mr; r += 2) {
        int two = r + 1 < mr, s0 = xs[r].sum16[2 * g] + xs[r].sum16[2 * g + 1];
        int s1 = two ? xs[r + 1].sum16[2 * g] + xs[r + 1].sum16[2 * g + 1] : 0;
        __m256i qsum = _mm256_set_m128i(_mm_set1_epi32(s1), _mm_set1_epi32(s0));
        __m256i is = reduce8(isum[r], two);
        is = _mm256_sub_epi32(is, _mm256_mullo_epi32(qsum, _mm256_set1_epi32(dot_zero(t))));
        float_steps(t, _mm_loadu_ps(c->d + 4 * b), _mm_loadu_ps(c->m + 4 * b), xs, r, two, g, is,
                    qsum, acc);
    }
}

#endif
