/* A prototype of the products of 32-weight blocks (Q8_0, MXFP4) on weights repacked 16 rows
   to a group: each 512-bit vector holds 4 weights of each of 16 rows (lane j: row j), so
   vpdpbusd against 4 activation bytes broadcast leaves each row's block sum in its own lane,
   exact, with no reduction across lanes; the float step then runs for 16 outputs at once:
   acc = fma(d_w * d_x, (float)isum, acc), block after block, the engine's own formula per
   output (int_tiles.h), so the outputs should be the engine's bits. Not the engine's code:
   bench/interleaved.py times both on the same bytes. AVX-512 VNNI only. */

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define GROUP 16 /* weight rows a group */
#define MR 8     /* activation rows a pass */

enum { Q8_0 = 0, MXFP4 = 1 };

static int64_t raw_bytes(int t) { return t == Q8_0 ? 34 : 17; }

/* bytes of one group's block: the 16 rows' scales, then their codes */
int64_t wf_il_group_block_bytes(int t) { return t == Q8_0 ? 32 + 512 : 16 + 256; }

static int nibble(const uint8_t *blk, int w) { /* MXFP4 weight w's 4-bit code */
    return w < 16 ? blk[1 + w] & 15 : blk[1 + w - 16] >> 4;
}

/* w [rows][nb blocks] (rows a multiple of 16) -> packed [rows / 16][nb][group block] */
void wf_il_pack(int t, const uint8_t *w, int64_t rows, int64_t nb, uint8_t *packed) {
    int64_t rb = nb * raw_bytes(t), gb = wf_il_group_block_bytes(t);
    for (int64_t g = 0; g < rows / GROUP; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *out = packed + (g * nb + b) * gb;
            for (int j = 0; j < GROUP; j++) {
                const uint8_t *blk = w + (g * GROUP + j) * rb + b * raw_bytes(t);
                if (t == Q8_0) {
                    memcpy(out + 2 * j, blk, 2);
                    for (int v = 0; v < 8; v++)
                        for (int c = 0; c < 4; c++)
                            out[32 + 64 * v + 4 * j + c] = blk[2 + 4 * v + c] ^ 0x80;
                } else {
                    out[j] = blk[0];
                    for (int u = 0; u < 4; u++)
                        for (int c = 0; c < 4; c++)
                            out[16 + 64 * u + 4 * j + c] =
                                (uint8_t)(nibble(blk, 8 * u + c) | nibble(blk, 8 * u + 4 + c) << 4);
                }
            }
        }
}

/* The activations as the engine quantizes them (experts_int.c): per 32 values d = amax /
   127, q = nearest-even of x * (1 / d); here with each block's sum of q times 128. */
void wf_il_quantize(const float *x, int64_t k, int8_t *q, float *d, int32_t *zero) {
    for (int64_t b = 0; b < k / 32; b++) {
        uint32_t top = 0;
        for (int i = 0; i < 32; i++) {
            uint32_t bits;
            memcpy(&bits, x + 32 * b + i, 4);
            bits &= 0x7fffffff;
            top = bits > top ? bits : top;
        }
        float amax;
        memcpy(&amax, &top, 4);
        float scale = amax / 127.0f, inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
        d[b] = scale;
        int32_t sum = 0;
        for (int i = 0; i < 32; i++) {
            float v = nearbyintf(x[32 * b + i] * inverse);
            q[32 * b + i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
            sum += q[32 * b + i];
        }
        zero[b] = 128 * sum;
    }
}

/* The 16 rows' scales of a group's block, as the engine decodes them */
static inline __m512 scales(int t, const uint8_t *gb) {
    if (t == Q8_0) return _mm512_cvtph_ps(_mm256_loadu_si256((const void *)gb));
    __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)gb));
    __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, tiny));
}

/* Vector v (4 weights of each row) of a group's block: u8 codes, w + 128 */
static inline void codes(int t, const uint8_t *gb, __m512i *c) {
    if (t == Q8_0) {
        for (int v = 0; v < 8; v++) c[v] = _mm512_loadu_si512(gb + 32 + 64 * v);
        return;
    }
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(
        (char)128, (char)129, (char)130, (char)131, (char)132, (char)134, (char)136, (char)140,
        (char)128, 127, 126, 125, 124, 122, 120, 116));
    const __m512i low = _mm512_set1_epi8(15);
    for (int u = 0; u < 4; u++) {
        __m512i n = _mm512_loadu_si512(gb + 16 + 64 * u);
        c[2 * u] = _mm512_shuffle_epi8(table, _mm512_and_si512(n, low));
        c[2 * u + 1] = _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16(n, 4), low));
    }
}

static inline __attribute__((always_inline)) void group_rows(int t, int mr, const uint8_t *p,
                                                             int64_t nb, const int8_t *xq,
                                                             const float *xd,
                                                             const int32_t *xz, int64_t k,
                                                             float *out, int64_t rows) {
    int64_t gbytes = wf_il_group_block_bytes(t);
    __m512 acc[MR];
    for (int r = 0; r < mr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *gb = p + b * gbytes;
        __m512i c[8];
        codes(t, gb, c);
        __m512 dw = scales(t, gb);
        for (int r = 0; r < mr; r++) {
            const int8_t *x = xq + r * k + 32 * b;
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            for (int v = 0; v < 8; v += 2) {
                int32_t x0, x1;
                memcpy(&x0, x + 4 * v, 4);
                memcpy(&x1, x + 4 * v + 4, 4);
                s0 = _mm512_dpbusd_epi32(s0, c[v], _mm512_set1_epi32(x0));
                s1 = _mm512_dpbusd_epi32(s1, c[v + 1], _mm512_set1_epi32(x1));
            }
            __m512i is = _mm512_sub_epi32(_mm512_add_epi32(s0, s1),
                                          _mm512_set1_epi32(xz[r * (k / 32) + b]));
            __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(xd[r * (k / 32) + b]));
            acc[r] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(is), acc[r]);
        }
    }
    for (int r = 0; r < mr; r++) _mm512_storeu_ps(out + r * rows, acc[r]);
}

/* out [m][rows] = x [m][k] (quantized: xq, xd, xz) times packed's rows */
void wf_il_rows(int t, const uint8_t *packed, int64_t rows, int64_t nb, int m, const int8_t *xq,
                const float *xd, const int32_t *xz, float *out, int threads) {
    int64_t k = nb * 32, gbytes = wf_il_group_block_bytes(t);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t g = 0; g < rows / GROUP; g++) {
        const uint8_t *p = packed + g * nb * gbytes;
        for (int r0 = 0; r0 < m; r0 += MR) {
            int mr = m - r0 < MR ? m - r0 : MR;
            const int8_t *q = xq + r0 * k;
            const float *d = xd + r0 * (k / 32);
            const int32_t *z = xz + r0 * (k / 32);
            float *o = out + r0 * rows + g * GROUP;
#define CASE(N) \
    case N: group_rows(t, N, p, nb, q, d, z, k, o, rows); break;
            switch (mr) {
                CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)
            }
#undef CASE
        }
    }
}
