/* A prototype of the products of 32-weight blocks (Q8_0, MXFP4) with the float step
   folded per lane: each block's integer dot product stays in its 8 lanes (4 weights each),
   is converted and multiplied by the block's two scales into float accumulators, and a
   row's lanes are added once at its end, in a fixed tree. The engine's kernels instead
   reduce each block (pair) to one integer sum before its float step. Not the engine's
   code: bench/lane_tree.py times both on the same bytes. AVX-512 VNNI only. */

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

static inline float half_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* MXFP4's E2M1 values doubled, + 128 (the engine's codes), by 4-bit code */
static inline __m256i mxfp4_codes(const uint8_t *q) {
    const __m128i table = _mm_setr_epi8((char)128, (char)129, (char)130, (char)131, (char)132,
                                        (char)134, (char)136, (char)140, (char)128, 127, 126,
                                        125, 124, 122, 120, 116);
    __m128i v = _mm_loadu_si128((const void *)q), low = _mm_set1_epi8(15);
    __m128i lo = _mm_shuffle_epi8(table, _mm_and_si128(v, low));
    __m128i hi = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(v, 4), low));
    return _mm256_set_m128i(hi, lo);
}

static inline float e8m0_half(uint8_t e) { /* 2^(e - 128): the doubled values' scale */
    uint32_t bits = e >= 2 ? (uint32_t)(e - 1) << 23 : 0x00200000u << e;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline __m256i codes_of(int t, const uint8_t *blk) {
    return t == 0 ? _mm256_xor_si256(_mm256_loadu_si256((const void *)(blk + 2)),
                                     _mm256_set1_epi8((char)0x80))
                  : mxfp4_codes(blk + 1);
}

static inline float scale_of(int t, const uint8_t *blk) {
    return t == 0 ? half_at(blk) : e8m0_half(blk[0]);
}

/* out[i, r] = row r of w (rows x nb blocks of type t: 0 Q8_0, 1 MXFP4; nb even) . x[i] for
   the m <= 8 activation rows x, given as int8 codes xq [m, nb * 32], per-block scales xd
   [m, nb] and per-lane sums xsum [m, nb * 8] (each the sum of 4 codes). Two blocks a step
   in one 512-bit vector: 16 float lanes per activation row, the even blocks' in the low
   half and the odd blocks' in the high half, added once a row. */
void wf_lane_rows(int t, const uint8_t *w, int64_t rows, int64_t nb, int m, const int8_t *xq,
                  const float *xd, const int32_t *xsum, float *out, int threads) {
    int64_t bb = t == 0 ? 34 : 17;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const uint8_t *row = w + r * nb * bb;
        __m512 acc[8];
        for (int i = 0; i < m; i++) acc[i] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b += 2) {
            const uint8_t *blk = row + b * bb;
            __m512i cw = _mm512_inserti64x4(_mm512_castsi256_si512(codes_of(t, blk)),
                                            codes_of(t, blk + bb), 1);
            float s0 = scale_of(t, blk), s1 = scale_of(t, blk + bb);
            for (int i = 0; i < m; i++) { /* activation row i: its codes, sums, scales */
                const int8_t *x = xq + i * nb * 32;
                __m512i cx = _mm512_loadu_si512((const void *)(x + b * 32));
                __m512i is = _mm512_dpbusd_epi32(_mm512_setzero_si512(), cw, cx);
                __m512i zero = _mm512_slli_epi32(
                    _mm512_loadu_si512((const void *)(xsum + (i * nb + b) * 8)), 7);
                const float *d = xd + i * nb + b;
                __m512 ds = _mm512_insertf32x8(_mm512_set1_ps(s0 * d[0]),
                                               _mm256_set1_ps(s1 * d[1]), 1);
                __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(is, zero));
                acc[i] = _mm512_add_ps(acc[i], _mm512_mul_ps(f, ds));
            }
        }
        for (int i = 0; i < m; i++) {
            __m256 half = _mm256_add_ps(_mm512_castps512_ps256(acc[i]),
                                        _mm512_extractf32x8_ps(acc[i], 1));
            __m128 s = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
            s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            s = _mm_add_ss(s, _mm_movehdup_ps(s));
            out[i * rows + r] = _mm_cvtss_f32(s);
        }
    }
}
