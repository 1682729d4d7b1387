/* The integer products of 32-weight blocks (Q8_0, MXFP4) on weights repacked at load 16 rows
   to a group (AVX-512 with VNNI only; other builds never pack): each 512-bit vector holds 4
   weights of each of 16 rows, row j in lane j, so vpdpbusd against 4 activation bytes
   broadcast leaves each row's block sum in its own lane, exact, with no reduction across
   lanes, and one float step serves 16 outputs:

     acc = fmaf(d_w * d_x, (float)isum, acc),  block after block,

   int_tiles.h's formula for each output, so the same bits as the file's blocks give in
   every build (tests/unit/test_packed_products.py). A group's block takes the bytes of its 16
   rows' blocks: Q8_0 16 float16 scales, then 8 vectors of codes w + 128; MXFP4 16 E8M0
   scale bytes, then 4 vectors of two codes a byte (low nibble: weights 8u + c, high: 8u +
   4 + c of vector u's lane bytes c). So group g of a packed matrix starts where its row 16g
   did. (Q6_K so, its sub-scales applied by vpmulld, was 0.72x / 0.77x / 1.27x the file's
   blocks at 1 / 8 / 32 rows: not built.) */

#include "experts_int.h"

#include <stdint.h>
#include <string.h>

#include "int_tiles.h"
#include "moe.h"
#include "par.h"

#define PMR 8        /* activation rows a pass over a group */

#if INT_SIMD == 512 && INT_VNNI
static int packs(int t) { return t == T_Q8_0 || t == T_MXFP4; }
#else
static int packs(int t) {
    (void)t;
    return 0;
}
#endif

int wf_int_packs(int qtype) { return packs(qtype); }

static int nibble(const uint8_t *blk, int w) { /* MXFP4 weight w's 4-bit code */
    return w < 16 ? blk[1 + w] & 15 : blk[1 + w - 16] >> 4;
}

/* rows 16g .. 16g + 16 of block b (the file's blocks at w, row bytes rb) -> to */
static void pack_block(int t, const uint8_t *w, int64_t rb, int64_t g, int64_t b, uint8_t *to) {
    int bb = block_bytes(t);
    for (int j = 0; j < PACK_ROWS; j++) {
        const uint8_t *blk = w + (g * PACK_ROWS + j) * rb + b * bb;
        if (t == T_Q8_0) {
            memcpy(to + 2 * j, blk, 2);
            for (int v = 0; v < 8; v++)
                for (int c = 0; c < 4; c++) to[32 + 64 * v + 4 * j + c] = blk[2 + 4 * v + c] ^ 0x80;
            continue;
        }
        to[j] = blk[0];
        for (int u = 0; u < 4; u++)
            for (int c = 0; c < 4; c++)
                to[16 + 64 * u + 4 * j + c] =
                    (uint8_t)(nibble(blk, 8 * u + c) | nibble(blk, 8 * u + 4 + c) << 4);
    }
}

typedef struct {
    int t;
    const uint8_t *w;
    uint8_t *to;
    int64_t groups, nb, rb;
} Pack;

static void pack_groups(void *ctx, int id, int threads) {
    const Pack *p = ctx;
    for (int64_t g = p->groups * id / threads; g < p->groups * (id + 1) / threads; g++)
        for (int64_t b = 0; b < p->nb; b++)
            pack_block(p->t, p->w, p->rb, g, b, p->to + (g * p->nb + b) * PACK_ROWS * block_bytes(p->t));
}

int wf_int_pack(int qtype, const uint8_t *w, int64_t rows, int64_t k, uint8_t *to, int threads) {
    int bw = block_weights(qtype);
    if (!packs(qtype) || rows % PACK_ROWS || k % bw || threads < 1) return -1;
    Pack p = {qtype, w, to, rows / PACK_ROWS, k / bw, k / bw * block_bytes(qtype)};
    wf_parallel(threads, pack_groups, &p);
    return 0;
}

#if INT_SIMD == 512 && INT_VNNI
/* The 16 rows' scales of a group's block, as block_groups decodes them */
static inline __m512 group_scales(int t, const uint8_t *gb) {
    if (t == T_Q8_0) return _mm512_cvtph_ps(_mm256_loadu_si256((const void *)gb));
    __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const void *)gb));
    __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    __mmask16 small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, tiny));
}

/* A group's block's 8 vectors of codes (w + 128, small_block's codes) */
static inline void group_codes(int t, const uint8_t *gb, __m512i *c) {
    if (t == T_Q8_0) {
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

/* mr activation rows xs against the group at w: 16 outputs each at outs[r] */
static inline __attribute__((always_inline)) void group_tile(int t, int mr, const uint8_t *w,
                                                             int64_t k, const Acts *xs,
                                                             float *const *outs) {
    int64_t gbytes = PACK_ROWS * block_bytes(t);
    __m512 acc[PMR];
    for (int r = 0; r < mr; r++) acc[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < k / 32; b++) {
        const uint8_t *gb = w + b * gbytes;
        __m512i c[8];
        group_codes(t, gb, c);
        __m512 dw = group_scales(t, gb);
        for (int r = 0; r < mr; r++) {
            const int8_t *x = xs[r].q + 32 * b;
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            for (int v = 0; v < 8; v += 2) {
                int32_t x0, x1;
                memcpy(&x0, x + 4 * v, 4);
                memcpy(&x1, x + 4 * v + 4, 4);
                s0 = _mm512_dpbusd_epi32(s0, c[v], _mm512_set1_epi32(x0));
                s1 = _mm512_dpbusd_epi32(s1, c[v + 1], _mm512_set1_epi32(x1));
            }
            int32_t zero = 128 * (xs[r].sum16[2 * b] + xs[r].sum16[2 * b + 1]);
            __m512i is = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), _mm512_set1_epi32(zero));
            __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(xs[r].d[b]));
            acc[r] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(is), acc[r]);
        }
    }
    for (int r = 0; r < mr; r++) _mm512_storeu_ps(outs[r], acc[r]);
}

static inline __attribute__((always_inline)) void packed_task(int t, const uint8_t *w, int64_t k,
                                                              const uint8_t *acts,
                                                              const int64_t *rows, int64_t p0,
                                                              int64_t p1, float *out,
                                                              int64_t out_stride) {
    int64_t ab = wf_int_act_bytes(k);
    for (int64_t p = p0; p < p1; p += PMR) {
        int mr = p1 - p < PMR ? (int)(p1 - p) : PMR;
        Acts xs[PMR];
        float *outs[PMR];
        for (int r = 0; r < mr; r++) {
            xs[r] = acts_at(acts + rows[p + r] * ab, k);
            outs[r] = out + (p + r) * out_stride;
        }
#define CASE(N) \
    case N: group_tile(t, N, w, k, xs, outs); break;
        switch (mr) { CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) }
#undef CASE
    }
}

void wf_int_packed_task(int qtype, const uint8_t *w, int64_t k, const uint8_t *acts,
                        const int64_t *rows, int64_t p0, int64_t p1, float *out,
                        int64_t out_stride) {
    if (qtype == T_Q8_0)
        packed_task(T_Q8_0, w, k, acts, rows, p0, p1, out, out_stride);
    else if (qtype == T_MXFP4)
        packed_task(T_MXFP4, w, k, acts, rows, p0, p1, out, out_stride);
}
#else
void wf_int_packed_task(int qtype, const uint8_t *w, int64_t k, const uint8_t *acts,
                        const int64_t *rows, int64_t p0, int64_t p1, float *out,
                        int64_t out_stride) {
    (void)qtype, (void)w, (void)k, (void)acts, (void)rows, (void)p0, (void)p1, (void)out,
        (void)out_stride; /* never called: wf_int_packs says no packing in this build */
}
#endif
