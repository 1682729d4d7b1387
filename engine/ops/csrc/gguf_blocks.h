/* GGUF weight blocks dequantized 32 weights at a time into 16-lane vectors, each weight
   exactly gguf-py's float32 dequantization: scale * code is exact in float32 (an f16 scale
   has 11 significant bits, a K-quant's sub-scale at most 7 more, a code at most 7, 5 beside
   a sub-scale), so w = (code - bias) * scale (Q4_0, Q5_0, Q8_0, Q6_K) or
   fma(code, scale, offset) (Q4_1, Q5_1, Q4_K, Q5_K) rounds once, as gguf's d * q (+ m)
   does, in every build. Block layouts: gguf-py's gguf/quants.py dequantize_blocks.
   Static inline helpers of experts.c. */
#ifndef WARMFLEET_GGUF_BLOCKS_H
#define WARMFLEET_GGUF_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "vec.h"
#include "widen.h"

/* GGML type ids */
enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
       T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30, T_MXFP4 = 39 };

/* weights a block holds: 256 in the K-quants' super-blocks, else 32 (F32, F16 and BF16 taken
   32 at a time) */
static inline int block_weights(int t) {
    return t == T_Q4_K || t == T_Q5_K || t == T_Q6_K ? 256 : 32;
}

static inline int block_bytes(int t) {
    switch (t) {
    case T_F32: return 128;
    case T_F16:
    case T_BF16: return 64;
    case T_Q4_0: return 18;
    case T_Q4_1: return 20;
    case T_Q5_0: return 22;
    case T_Q5_1: return 24;
    case T_Q8_0: return 34;
    case T_Q4_K: return 144;
    case T_Q5_K: return 176;
    case T_Q6_K: return 210;
    case T_MXFP4: return 17;
    default: return 0;
    }
}

typedef uint8_t v16b __attribute__((vector_size(16)));

/* 16 bytes widened to int32 lanes (and below: int8, uint16, float16): each ISA its
   instruction (GCC 12 makes a widening __builtin_convertvector scalar). */
static inline v16i widen_bytes(v16b b) {
    v16i out;
#if defined(__AVX512F__)
    __m128i raw;
    memcpy(&raw, &b, sizeof raw);
    __m512i w = _mm512_cvtepu8_epi32(raw);
    memcpy(&out, &w, sizeof out);
#elif defined(__AVX2__)
    __m128i raw;
    memcpy(&raw, &b, sizeof raw);
    __m256i w[2] = {_mm256_cvtepu8_epi32(raw), _mm256_cvtepu8_epi32(_mm_srli_si128(raw, 8))};
    memcpy(&out, w, sizeof out);
#else
    for (int i = 0; i < 16; i++) out[i] = b[i];
#endif
    return out;
}

/* the same, the bytes taken as int8 */
static inline v16i widen_signed(v16b b) {
    v16i out;
#if defined(__AVX512F__)
    __m128i raw;
    memcpy(&raw, &b, sizeof raw);
    __m512i w = _mm512_cvtepi8_epi32(raw);
    memcpy(&out, &w, sizeof out);
#elif defined(__AVX2__)
    __m128i raw;
    memcpy(&raw, &b, sizeof raw);
    __m256i w[2] = {_mm256_cvtepi8_epi32(raw), _mm256_cvtepi8_epi32(_mm_srli_si128(raw, 8))};
    memcpy(&out, w, sizeof out);
#else
    for (int i = 0; i < 16; i++) out[i] = (int8_t)b[i];
#endif
    return out;
}

/* bytes shifted as 8 uint16 lanes (x86 has no byte shift; GCC's emulation of one takes an
   add per bit): the bits crossing into the next byte are masked off by every caller. */
static inline v16b shl16(v16b b, int n) {
    typedef uint16_t v8h __attribute__((vector_size(16)));
    v8h h;
    memcpy(&h, &b, sizeof h);
    h = h << n;
    memcpy(&b, &h, sizeof b);
    return b;
}

static inline v16b shr16(v16b b, int n) {
    typedef uint16_t v8h __attribute__((vector_size(16)));
    v8h h;
    memcpy(&h, &b, sizeof h);
    h = h >> n;
    memcpy(&b, &h, sizeof b);
    return b;
}

static inline v16b bytes_at(const uint8_t *p) {
    v16b b;
    memcpy(&b, p, sizeof b);
    return b;
}

static inline v16i widen_u8(const uint8_t *p) { return widen_bytes(bytes_at(p)); }
static inline v16i widen_i8(const uint8_t *p) { return widen_signed(bytes_at(p)); }

static inline float half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    _Float16 f;
    memcpy(&f, &h, sizeof f);
    return (float)f;
#endif
}

static inline v16f to_float(v16i v) { return __builtin_convertvector(v, v16f); }

/* A block's scale of each 32 weights (16 in Q6_K) at v[i], its offset at v[8 + i]: the
   file's f16 d times the sub-scale, exact. */
typedef struct {
    float v[16];
} Groups;

/* Q4_K/Q5_K: 8 6-bit scales and 8 mins packed in 12 bytes, unpacked 4 at a time
   (llama.cpp's masks), then scales * d and mins * -dmin as one vector. */
static inline void k_groups(const uint8_t *b, Groups *g) {
    typedef uint32_t v4u __attribute__((vector_size(16)));
    uint32_t u[3];
    memcpy(u, b + 4, sizeof u);
    v4u low = {u[0], u[2], u[1], u[2] >> 4}, high = {0, u[0], 0, u[1]};
    v4u packed = (low & (v4u){0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f}) |
                 ((high >> 6) & 0x03030303) << 4; /* in registers: no store to forward */
    v16b bytes;
    memcpy(&bytes, &packed, sizeof bytes);
    float d = half(b), m = -half(b + 2);
    v16f by = {d, d, d, d, d, d, d, d, m, m, m, m, m, m, m, m};
    store16(g->v, to_float(widen_bytes(bytes)) * by);
}

static inline __attribute__((always_inline)) void block_groups(int t, const uint8_t *b,
                                                              Groups *g) {
    if (t == T_Q4_0 || t == T_Q5_0 || t == T_Q8_0) {
        g->v[0] = half(b);
        g->v[8] = 0.0f;
    } else if (t == T_Q4_1 || t == T_Q5_1) {
        g->v[0] = half(b);
        g->v[8] = half(b + 2);
    } else if (t == T_Q4_K || t == T_Q5_K) {
        k_groups(b, g);
    } else if (t == T_Q6_K) { /* 16 int8 scales */
        store16(g->v, to_float(widen_i8(b + 192)) * splat(half(b + 208)));
    } else if (t == T_MXFP4) { /* an E8M0 exponent: 2^(e - 128), half its power of two, as
                                  the values below are doubled (a subnormal for e < 2) */
        uint32_t bits = b[0] < 2 ? 0x00200000u << b[0] : (uint32_t)(b[0] - 1) << 23;
        memcpy(&g->v[0], &bits, sizeof bits);
    }
}

/* MXFP4's 16 E2M1 values, doubled to integers (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their
   negatives): value * scale is exact (a power of two times at most 12). */
static const float MXFP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 16 MXFP4 codes (the lanes' low 4 bits) to their weights: AVX-512 looks each up in the
   16 values times s (one vpermps), other builds lane by lane; the same products. */
static inline v16f fp4_weights(v16i c, float s) {
    v16f table = load16(MXFP4_VALUES) * splat(s), out;
#if defined(__AVX512F__)
    __m512 tab, w;
    __m512i i;
    memcpy(&tab, &table, sizeof tab);
    memcpy(&i, &c, sizeof i);
    w = _mm512_permutexvar_ps(i, tab);
    memcpy(&out, &w, sizeof w);
#else
    for (int l = 0; l < 16; l++) out[l] = table[c[l] & 15];
#endif
    return out;
}

/* The weights of codes c: (c - bias) * s where the type has no offset (gguf's d * q, the
   sign of a zero weight included), else c * s + o; the product exact, so one rounding: the
   same value in every build. */
static inline v16f weights(v16i c, int bias, float s, float o) {
    if (bias) return to_float(c - bias) * splat(s);
    return fma16(to_float(c), splat(s), splat(o));
}

/* 4-bit codes (the lanes' low 4 bits): with AVX-512 the 16 values a group can take, then
   one lookup a lane (vpermps reads an index's low 4 bits): the same values, fewer steps. */
static inline void nibbles(v16i c0, v16i c1, int bias, float s, float o, v16f *lo, v16f *hi) {
#if defined(__AVX512F__)
    const v16i codes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    v16f table = weights(codes, bias, s, o);
    __m512 tab, l, h;
    __m512i i0, i1;
    memcpy(&tab, &table, sizeof tab);
    memcpy(&i0, &c0, sizeof i0);
    memcpy(&i1, &c1, sizeof i1);
    l = _mm512_permutexvar_ps(i0, tab);
    h = _mm512_permutexvar_ps(i1, tab);
    memcpy(lo, &l, sizeof l);
    memcpy(hi, &h, sizeof h);
#else
    *lo = weights(c0 & 15, bias, s, o);
    *hi = weights(c1 & 15, bias, s, o);
#endif
}

/* bit j of qh on top of 4-bit code j (Q5_0, Q5_1): lanes j0 .. j0 + 15 */
static inline v16i fifth_bit(uint32_t qh, int j0) {
    const v16i lane = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    v16i bits = ((v16i){} + (int32_t)(qh >> j0)) >> lane;
    return (bits & 1) << 4;
}

/* Weights 32i .. 32i + 31 of block b as two 16-lane vectors. */
static inline __attribute__((always_inline)) void deq32(int t, const uint8_t *b, int i,
                                                       const Groups *g, v16f *lo, v16f *hi) {
    const float *s = g->v, *o = g->v + 8;
    if (t == T_Q4_0 || t == T_Q4_1) { /* byte j: weight j (low nibble), j + 16 (high) */
        v16i q = widen_u8(b + (t == T_Q4_0 ? 2 : 4));
        nibbles(q, q >> 4, t == T_Q4_0 ? 8 : 0, s[0], o[0], lo, hi);
    } else if (t == T_Q5_0 || t == T_Q5_1) {
        uint32_t qh;
        memcpy(&qh, b + (t == T_Q5_0 ? 2 : 4), sizeof qh);
        v16i q = widen_u8(b + (t == T_Q5_0 ? 6 : 8));
        *lo = weights((q & 15) | fifth_bit(qh, 0), t == T_Q5_0 ? 16 : 0, s[0], o[0]);
        *hi = weights((q >> 4) | fifth_bit(qh, 16), t == T_Q5_0 ? 16 : 0, s[0], o[0]);
    } else if (t == T_MXFP4) { /* byte j: weight j (low nibble), j + 16 (high) */
        v16i q = widen_u8(b + 1);
        *lo = fp4_weights(q & 15, s[0]);
        *hi = fp4_weights(q >> 4, s[0]);
    } else if (t == T_Q8_0) {
        *lo = to_float(widen_i8(b + 2)) * splat(s[0]);
        *hi = to_float(widen_i8(b + 18)) * splat(s[0]);
    } else if (t == T_Q4_K) { /* 32 bytes per pair of sub-blocks: i even the low nibbles */
        const uint8_t *q = b + 16 + 32 * (i / 2);
        int shift = 4 * (i % 2);
        nibbles(widen_u8(q) >> shift, widen_u8(q + 16) >> shift, 0, s[i], o[i], lo, hi);
    } else if (t == T_Q5_K) { /* Q4_K's nibbles at b + 48, bit i of qh[j] on top of weight j */
        for (int e = 0; e < 2; e++) { /* the codes made as bytes: 16 lanes an instruction */
            v16b l = bytes_at(b + 48 + 32 * (i / 2) + 16 * e), h = bytes_at(b + 16 + 16 * e);
            l = (i % 2 ? shr16(l, 4) : l) & 15;
            h = (i <= 4 ? shl16(h, 4 - i) : shr16(h, i - 4)) & 16;
            (e ? hi : lo)[0] = weights(widen_bytes(l | h), 0, s[i], o[i]);
        }
    } else if (t == T_Q6_K) { /* 128-weight halves h; i % 4: 32 bytes of ql, nibble, qh bits */
        int h = i / 4, u = i % 4;
        const uint8_t *ql = b + 64 * h + 32 * (u % 2), *qh = b + 128 + 32 * h;
        v16i l0 = widen_u8(ql), l1 = widen_u8(ql + 16), h0 = widen_u8(qh), h1 = widen_u8(qh + 16);
        l0 = u < 2 ? l0 & 15 : l0 >> 4; /* bytes: no mask after >> 4 */
        l1 = u < 2 ? l1 & 15 : l1 >> 4;
        h0 = (u < 2 ? h0 << (4 - 2 * u) : h0 >> (2 * u - 4)) & 0x30; /* bits 2u, 2u + 1 -> 4, 5 */
        h1 = (u < 2 ? h1 << (4 - 2 * u) : h1 >> (2 * u - 4)) & 0x30;
        *lo = weights(l0 | h0, 32, s[2 * i], 0.0f);
        *hi = weights(l1 | h1, 32, s[2 * i + 1], 0.0f);
    } else if (t == T_F32) {
        *lo = load16((const float *)b);
        *hi = load16((const float *)b + 16);
    } else if (t == T_F16) {
        *lo = half_to_float(b);
        *hi = half_to_float(b + 32);
    } else { /* BF16: the high half of a float32 */
        v16i l = widen_u16(b) << 16, h = widen_u16(b + 32) << 16;
        memcpy(lo, &l, sizeof l);
        memcpy(hi, &h, sizeof h);
    }
}

#endif
