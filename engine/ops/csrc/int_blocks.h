/* GGUF blocks as unsigned integer codes for the integer products (experts_int.c). A block
   of BW weights (32; a K-quant's super-block 256) becomes BW byte codes c in the weights'
   order, and the integers that say how they meet a block of 8-bit activations q (with its
   sums over each 16, qsum16):

     isum = sum_s sc[s] * (sum of c * q over the 16 weights of s) + sum_s aux[s] * qsum16[s]
            (the zero point folded in: Q6_K's aux = -32 sc, Q4_0/Q5_0/Q8_0's -8/-16/-128)
     msum = sum_s aux[s] * qsum16[s]   (types with a min: Q4_K/Q5_K aux = -min, Q4_1/Q5_1 1)

   and each block adds d * d_x * isum (+ m * d_x * msum) to the output. Codes are unsigned
   (x86's byte products take one unsigned operand): Q8_0's int8 w stored as w + 128.
   Written with GCC vector extensions, so every build unpacks the same integers. */
#ifndef WARMFLEET_INT_BLOCKS_H
#define WARMFLEET_INT_BLOCKS_H

#include <stdint.h>
#include <string.h>

#include "gguf_blocks.h"

typedef uint8_t v32b __attribute__((vector_size(32)));
typedef int16_t v16h __attribute__((vector_size(32)));

/* the block-quantized types: integer products (F32, F16, BF16 stay float32) */
static inline int int_type(int t) {
    return block_bytes(t) > 0 && t != T_F32 && t != T_F16 && t != T_BF16;
}
static inline int k_quant(int t) { return block_weights(t) == 256; }
/* codes stored as w + 128 (a weight's sign in its code): Q8_0's, and MXFP4's values */
static inline int signed_codes(int t) { return t == T_Q8_0 || t == T_MXFP4; }
static inline int has_min(int t) {
    return t == T_Q4_1 || t == T_Q5_1 || t == T_Q4_K || t == T_Q5_K;
}
/* the zero point of the 32-weight types (the K-quants fold theirs into aux) */
static inline int zero_point(int t) {
    return t == T_Q4_0 ? 8 : t == T_Q5_0 ? 16 : signed_codes(t) ? 128 : 0;
}
/* bytes a block takes unpacked: its codes, then a K-quant's per-16 scales as 16-lane int16
   vectors (lanes 0-7 sub-block 2i, 8-15 sub-block 2i + 1: one vector per 32 codes) */
static inline int unpacked_bytes(int t) { return k_quant(t) ? 512 : 32; }

/* One block's codes and numbers (a K-quant's sc and aux: 16 each, one per 16 weights). */
typedef struct {
    uint8_t *codes; /* [unpacked_bytes] */
    int16_t *aux;   /* [16], K-quants only */
    float *d, *m;   /* the file's f16 scale and min (Q4_1/Q5_1: m; Q4_K/Q5_K: dmin) */
} Unpacked;

static inline v32b shr32(v32b b, int n) { /* as 16 uint16 lanes: callers mask the carry */
    typedef uint16_t v16u __attribute__((vector_size(32)));
    v16u h;
    memcpy(&h, &b, sizeof h);
    h = h >> n;
    memcpy(&b, &h, sizeof b);
    return b;
}

static inline v32b shl32(v32b b, int n) {
    typedef uint16_t v16u __attribute__((vector_size(32)));
    v16u h;
    memcpy(&h, &b, sizeof h);
    h = h << n;
    memcpy(&b, &h, sizeof b);
    return b;
}

static inline v32b load32(const uint8_t *p) {
    v32b v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* 16 code bytes (weight j low nibble, j + 16 high) -> 32 codes, with bit j of qh on top as
   16 where `fifth` (Q5_0, Q5_1) */
static inline void nibble_codes(const uint8_t *qs, int fifth, uint32_t qh, uint8_t *codes) {
    v16b q = bytes_at(qs), lo = q & 15, hi = shr16(q, 4) & 15;
    if (fifth) {
        const v16b bit = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        uint8_t b0 = qh, b1 = qh >> 8, b2 = qh >> 16, b3 = qh >> 24;
        v16b h0 = {b0, b0, b0, b0, b0, b0, b0, b0, b1, b1, b1, b1, b1, b1, b1, b1};
        v16b h1 = {b2, b2, b2, b2, b2, b2, b2, b2, b3, b3, b3, b3, b3, b3, b3, b3};
        lo |= (v16b)((h0 & bit) != 0) & 16;
        hi |= (v16b)((h1 & bit) != 0) & 16;
    }
    memcpy(codes, &lo, 16);
    memcpy(codes + 16, &hi, 16);
}

/* MXFP4: the doubled E2M1 values + 128 (Q8_0's codes), low nibbles first: one byte
   shuffle a 16 (pshufb, NEON's tbl) looks each nibble up */
static inline void fp4_codes(const uint8_t *qs, uint8_t *codes) {
    const v16b table = {128, 129, 130, 131, 132, 134, 136, 140,
                        128, 127, 126, 125, 124, 122, 120, 116};
    v16b q = bytes_at(qs), lo = __builtin_shuffle(table, q & 15);
    v16b hi = __builtin_shuffle(table, shr16(q, 4) & 15);
    memcpy(codes, &lo, 16);
    memcpy(codes + 16, &hi, 16);
}

static inline void small_block(int t, const uint8_t *b, const Unpacked *u) {
    if (t == T_MXFP4) {
        Groups g;
        block_groups(t, b, &g);
        *u->d = g.v[0];
        *u->m = 0.0f;
        fp4_codes(b + 1, u->codes);
        return;
    }
    *u->d = half(b);
    *u->m = t == T_Q4_1 || t == T_Q5_1 ? half(b + 2) : 0.0f;
    uint32_t qh = 0;
    if (t == T_Q5_0 || t == T_Q5_1) memcpy(&qh, b + (t == T_Q5_0 ? 2 : 4), sizeof qh);
    switch (t) {
    case T_Q4_0: nibble_codes(b + 2, 0, 0, u->codes); break;
    case T_Q4_1: nibble_codes(b + 4, 0, 0, u->codes); break;
    case T_Q5_0: nibble_codes(b + 6, 1, qh, u->codes); break;
    case T_Q5_1: nibble_codes(b + 8, 1, qh, u->codes); break;
    default: { /* Q8_0 */
        v32b w = load32(b + 2) ^ 0x80;
        memcpy(u->codes, &w, 32);
    }
    }
}

/* a K-quant's per-16 scales sc16 as the 8 vectors its codes meet, after the codes */
static inline void scale_vectors(const int16_t *sc16, uint8_t *to) {
    v16h s;
    memcpy(&s, sc16, sizeof s);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        v16h v = __builtin_shufflevector(s, s, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
        memcpy(to + 32 * i, &v, sizeof v);
        s = __builtin_shufflevector(s, s, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1);
    }
}

/* Q4_K/Q5_K: 8 6-bit scales and mins in 12 bytes (llama.cpp's get_scale_min_k4) */
static inline void k4_scales(const uint8_t *q, int16_t *sc16, int16_t *aux) {
    for (int j = 0; j < 8; j++) {
        int sc = j < 4 ? q[j] & 63 : (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
        int mn = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | (q[j] >> 6) << 4;
        sc16[2 * j] = sc16[2 * j + 1] = (int16_t)sc;
        aux[2 * j] = aux[2 * j + 1] = (int16_t)-mn;
    }
}

/* Q4_K (Q5_K: qh's bit s on top): sub-block s of 32 the low (s even) or high nibbles of
   the 32 bytes at 32 (s / 2) */
static inline void k4_block(int t, const uint8_t *b, const Unpacked *u) {
    int16_t sc16[16];
    *u->d = half(b);
    *u->m = half(b + 2);
    k4_scales(b + 4, sc16, u->aux);
    const uint8_t *qs = b + (t == T_Q5_K ? 48 : 16);
    v32b qh = load32(b + 16);
#pragma GCC unroll 8
    for (int s = 0; s < 8; s++) {
        v32b q = load32(qs + 32 * (s / 2));
        v32b c = (s % 2 ? shr32(q, 4) : q) & 15;
        if (t == T_Q5_K) c |= (s <= 4 ? shl32(qh, 4 - s) : shr32(qh, s - 4)) & 16;
        memcpy(u->codes + 32 * s, &c, sizeof c);
    }
    scale_vectors(sc16, u->codes + 256);
}

/* Q6_K: weights 32i .. 32i + 31 (half h = i / 4, u = i % 4): 32 bytes of ql (low nibbles
   for u < 2), qh's bits 2u, 2u + 1 on top; codes 0..63 for weights code - 32 */
static inline void q6_block(const uint8_t *b, const Unpacked *u) {
    int16_t sc16[16];
    *u->d = half(b + 208);
    *u->m = 0.0f;
    for (int s = 0; s < 16; s++) {
        sc16[s] = (int8_t)b[192 + s];
        u->aux[s] = (int16_t)(-32 * sc16[s]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        int h = i / 4, k = i % 4;
        v32b ql = load32(b + 64 * h + 32 * (k % 2)), qh = load32(b + 128 + 32 * h);
        v32b lo = (k < 2 ? ql : shr32(ql, 4)) & 15;
        v32b hi = (k < 2 ? shl32(qh, 4 - 2 * k) : shr32(qh, 2 * k - 4)) & 0x30;
        v32b c = lo | hi;
        memcpy(u->codes + 32 * i, &c, sizeof c);
    }
    scale_vectors(sc16, u->codes + 256);
}

static inline __attribute__((always_inline)) void unpack_block(int t, const uint8_t *b,
                                                              const Unpacked *u) {
    if (t == T_Q6_K)
        q6_block(b, u);
    else if (k_quant(t))
        k4_block(t, b, u);
    else
        small_block(t, b, u);
}

#endif
