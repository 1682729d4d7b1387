/* 16-lane float32 vectors (GCC/Clang vector extensions) shared by the engine's kernels:
   -march=native makes them AVX2, AVX-512 or NEON registers. */
#ifndef WARMFLEET_VEC_H
#define WARMFLEET_VEC_H

#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__) || defined(__FMA__)
#include <immintrin.h>
#elif defined(__ARM_NEON)
#include <arm_neon.h>
#endif

/* Built for AVX2 (with FMA) and not AVX-512: 16 registers of 8 lanes, where the kernels'
   16-lane forms spill, so products and attention take their 8-lane-halves forms. */
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define WF_AVX2 1
#else
#define WF_AVX2 0
#endif
/* Built for ARM: 32 registers of 4 lanes, where attention's 16-lane forms spill too, so it
   takes 4-lane-quarters forms. */
#if defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
#define WF_NEON 1
#else
#define WF_NEON 0
#endif

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16f load16(const float *p) { v16f v; memcpy(&v, p, sizeof v); return v; }
static inline void store16(float *p, v16f v) { memcpy(p, &v, sizeof v); }
/* An empty asm that claims to change v, so the compiler holds v in a register: a vector
   used by several multiply-adds is then loaded once instead of folded into each of them
   as a memory operand (on Zen 4 those loads, not the FMAs, bounded the product tiles).
   AVX-512 only: elsewhere a v16f is not one register. */
#if defined(__AVX512F__)
#define IN_REGISTER(v) __asm__("" : "+v"(v))
#else
#define IN_REGISTER(v) ((void)0)
#endif

/* a * b + c rounded once, lane by lane, whatever the compiler's contraction rules (GCC 12
   fused some of the kernels' `acc += a * b` and not others, by loop shape): where the
   kernels' bits must be the same in every build for a CPU, the arithmetic is spelled out
   (on a CPU without an FMA unit there is one build, and it is a * b + c). */
static inline v16f fma16(v16f a, v16f b, v16f c) {
#if defined(__AVX512F__)
    __m512 x, y, z;
    memcpy(&x, &a, sizeof x);
    memcpy(&y, &b, sizeof y);
    memcpy(&z, &c, sizeof z);
    z = _mm512_fmadd_ps(x, y, z);
    memcpy(&c, &z, sizeof c);
#elif defined(__FMA__)
    __m256 x[2], y[2], z[2];
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    memcpy(z, &c, sizeof z);
    for (int h = 0; h < 2; h++) z[h] = _mm256_fmadd_ps(x[h], y[h], z[h]);
    memcpy(&c, z, sizeof c);
#elif defined(__ARM_FEATURE_FMA)
    float32x4_t x[4], y[4], z[4];
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    memcpy(z, &c, sizeof z);
    for (int h = 0; h < 4; h++) z[h] = vfmaq_f32(z[h], x[h], y[h]);
    memcpy(&c, z, sizeof c);
#else
    c = a * b + c; /* no FMA unit (fmaf would be a library call a lane): the compiler's way */
#endif
    return c;
}

static inline v16f splat(float x) { return (v16f){x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

/* A fixed summation tree, the same for every use: halves added lane by lane
   (16 -> 8 -> 4 -> 2 -> 1). Scalar code measured faster here than vector shuffles. */
static inline float hsum(v16f v) {
    float t[16];
    memcpy(t, &v, sizeof t);
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; i++) t[i] += t[i + w];
    return t[0];
}

#if WF_AVX2
/* out[i] = hsum of the 16-lane vector whose lanes 0-7 are lo[i] and 8-15 hi[i], for 8
   vectors, bit for bit: lo + hi is the tree's first level, the others lane-wise adds of
   shuffled vectors (+ 4 across 128-bit halves, then + 2, then + 1), a few instructions
   where 8 scalar trees take about a hundred. */
static inline void hsum_halves8(const __m256 *lo, const __m256 *hi, float *out) {
    __m256 a[4], b[2];
    for (int i = 0; i < 4; i++) { /* [t of 2i | t of 2i + 1], lanes i and i + 4 added */
        __m256 x = _mm256_add_ps(lo[2 * i], hi[2 * i]);
        __m256 y = _mm256_add_ps(lo[2 * i + 1], hi[2 * i + 1]);
        a[i] = _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20),
                             _mm256_permute2f128_ps(x, y, 0x31));
    }
    for (int i = 0; i < 2; i++) /* + 2: each 128-bit half [2 lanes of one | 2 of the next] */
        b[i] = _mm256_add_ps(_mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0x44),
                             _mm256_shuffle_ps(a[2 * i], a[2 * i + 1], 0xEE));
    /* + 1: lanes [0 2 4 6 | 1 3 5 7] */
    __m256 c = _mm256_add_ps(_mm256_shuffle_ps(b[0], b[1], 0x88),
                             _mm256_shuffle_ps(b[0], b[1], 0xDD));
    float t[8];
    _mm256_storeu_ps(t, c);
    for (int i = 0; i < 4; i++) {
        out[2 * i] = t[i];
        out[2 * i + 1] = t[4 + i];
    }
}

/* hsum of the 16-lane vector whose lanes 0-7 are lo and 8-15 hi, bit for bit: its tree's
   levels as adds of 8, 4, 2 and 1 lanes */
static inline float hsum_halves(__m256 lo, __m256 hi) {
    __m256 x = _mm256_add_ps(lo, hi);
    __m128 y = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    y = _mm_add_ps(y, _mm_movehl_ps(y, y));
    return _mm_cvtss_f32(_mm_add_ss(y, _mm_movehdup_ps(y)));
}

/* IN_REGISTER for an 8-lane vector */
#define IN_REGISTER8(v) __asm__("" : "+x"(v))
#endif

/* mask ? a : b, lane by lane (C has no vector ?:) */
static inline v16f select16(v16i mask, v16f a, v16f b) {
    v16i ai, bi;
    memcpy(&ai, &a, sizeof ai);
    memcpy(&bi, &b, sizeof bi);
    v16i r = (mask & ai) | (~mask & bi);
    v16f out;
    memcpy(&out, &r, sizeof out);
    return out;
}

/* a > b ? a : b, lane by lane (maxps's rule, NaN and -0 included): on AVX2 two maxps and
   on NEON four compares and selects, where GCC scalarizes the 16-lane comparison */
static inline v16f max16(v16f a, v16f b) {
#if WF_AVX2
    __m256 x[2], y[2];
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    for (int h = 0; h < 2; h++) x[h] = _mm256_max_ps(x[h], y[h]);
    memcpy(&a, x, sizeof x);
    return a;
#elif defined(__ARM_NEON) /* and NEON (fmax's NaN rule differs: compare and select) */
    float32x4_t x[4], y[4];
    memcpy(x, &a, sizeof x);
    memcpy(y, &b, sizeof y);
    for (int h = 0; h < 4; h++) x[h] = vbslq_f32(vcgtq_f32(x[h], y[h]), x[h], y[h]);
    memcpy(&a, x, sizeof x);
    return a;
#else
    return select16(a > b, a, b);
#endif
}

#if WF_AVX2
/* exp16 on 8 lanes (exp16 below, the same operations on each lane) */
static inline __m256 exp8(__m256 x0) {
    __m256 under = _mm256_cmp_ps(x0, _mm256_set1_ps(-87.0f), _CMP_LT_OQ);
    __m256 x = _mm256_blendv_ps(x0, _mm256_set1_ps(-87.0f), under);
    __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_GT_OQ);
    x = _mm256_blendv_ps(x, _mm256_set1_ps(88.0f), over);
    __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504f), _mm256_set1_ps(0.5f));
    __m256 k = _mm256_cvtepi32_ps(_mm256_cvttps_epi32(t));
    __m256 above = _mm256_cmp_ps(k, t, _CMP_GT_OQ);
    k = _mm256_blendv_ps(k, _mm256_sub_ps(k, _mm256_set1_ps(1.0f)), above); /* floor */
    __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693145752f), x);
    r = _mm256_fnmadd_ps(k, _mm256_set1_ps(1.42860677e-6f), r);
    static const float poly[6] = {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    __m256 p = _mm256_set1_ps(1.0f / 720);
    for (int i = 0; i < 6; i++) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(poly[i]));
    __m256i bits = _mm256_add_epi32(_mm256_cvttps_epi32(k), _mm256_set1_epi32(127));
    __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(bits, 23));
    return _mm256_andnot_ps(under, _mm256_mul_ps(p, scale));
}
#endif

#if defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
/* exp16 on 4 lanes (as exp8) */
static inline float32x4_t exp4(float32x4_t x0) {
    uint32x4_t under = vcltq_f32(x0, vdupq_n_f32(-87.0f));
    float32x4_t x = vbslq_f32(under, vdupq_n_f32(-87.0f), x0);
    x = vbslq_f32(vcgtq_f32(x, vdupq_n_f32(88.0f)), vdupq_n_f32(88.0f), x);
    float32x4_t t = vfmaq_f32(vdupq_n_f32(0.5f), x, vdupq_n_f32(1.44269504f));
    float32x4_t k = vcvtq_f32_s32(vcvtq_s32_f32(t));
    k = vbslq_f32(vcgtq_f32(k, t), vsubq_f32(k, vdupq_n_f32(1.0f)), k); /* floor */
    float32x4_t r = vfmsq_f32(x, k, vdupq_n_f32(0.693145752f));
    r = vfmsq_f32(r, k, vdupq_n_f32(1.42860677e-6f));
    static const float poly[6] = {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    float32x4_t p = vdupq_n_f32(1.0f / 720);
    for (int i = 0; i < 6; i++) p = vfmaq_f32(vdupq_n_f32(poly[i]), p, r);
    int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(k), vdupq_n_s32(127)), 23);
    float32x4_t e = vmulq_f32(p, vreinterpretq_f32_s32(bits));
    return vbslq_f32(under, vdupq_n_f32(0.0f), e);
}
#endif

/* e^x, relative error about 2e-7: x = k ln2 + r, |r| <= ln2 / 2, e^r by a degree-6
   polynomial, 2^k put in the exponent bits. 0 below -87 (e^-inf: masked keys); x above
   88 is taken as 88 (e^88 ~ 1.7e38, finite). Its multiply-adds spelled out (fma16), as
   GCC had contracted them, so that AVX2's 8-lane form (exp8) and NEON's 4-lane one (exp4)
   give the same bits: GCC scalarizes the 16-lane comparisons on both. */
static inline v16f exp16(v16f x0) {
#if WF_AVX2
    __m256 h[2];
    memcpy(h, &x0, sizeof h);
    h[0] = exp8(h[0]);
    h[1] = exp8(h[1]);
    memcpy(&x0, h, sizeof h);
    return x0;
#elif defined(__ARM_NEON) && defined(__ARM_FEATURE_FMA)
    float32x4_t q[4];
    memcpy(q, &x0, sizeof q);
    for (int i = 0; i < 4; i++) q[i] = exp4(q[i]);
    memcpy(&x0, q, sizeof q);
    return x0;
#else
    v16i under = x0 < splat(-87.0f); /* e^x is 0 there (masked keys: -inf) */
    v16f x = select16(under, splat(-87.0f), x0);
    x = select16(x > splat(88.0f), splat(88.0f), x);
    v16f t = fma16(x, splat(1.44269504f), splat(0.5f));
    v16f k = __builtin_convertvector(__builtin_convertvector(t, v16i), v16f);
    k = select16(k > t, k - splat(1.0f), k); /* floor */
    v16f r = fma16(-k, splat(0.693145752f), x);
    r = fma16(-k, splat(1.42860677e-6f), r);
    static const float poly[6] = {1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f, 1.0f};
    v16f p = splat(1.0f / 720);
    for (int i = 0; i < 6; i++) p = fma16(p, r, splat(poly[i]));
    v16i bits = (__builtin_convertvector(k, v16i) + 127) << 23;
    v16f scale;
    memcpy(&scale, &bits, sizeof scale);
    return select16(under, splat(0.0f), p * scale);
#endif
}

/* r[i] = sum of the lanes of a[i], for 16 vectors: four levels of pairwise shuffles, the
   same tree as hsum (lane l + lane l + 8, then + 4, + 2, + 1), so r[i] == hsum(a[i]) bit for
   bit. The first two levels only combine vectors within a quarter (a[4i] .. a[4i+3]), so
   they run per quarter (reduce4: 16 lanes -> 4 per vector) and reduce_quarters finishes. */
static inline v16f reduce4(const v16f *a) {
    v16f b[2];
    for (int i = 0; i < 2; i++) /* lanes 0-7: halves of a[2i]; 8-15: of a[2i+1] */
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17,
                                       18, 19, 20, 21, 22, 23) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 8, 9, 10, 11, 12, 13, 14, 15,
                                       24, 25, 26, 27, 28, 29, 30, 31);
    /* quarters of lanes: a[0], a[1], a[2], a[3] */
    return __builtin_shufflevector(b[0], b[1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25,
                                   26, 27) +
           __builtin_shufflevector(b[0], b[1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28,
                                   29, 30, 31);
}

static inline v16f reduce_quarters(const v16f *c) {
    v16f d[2];
    for (int i = 0; i < 2; i++) /* pairs of lanes: a[8i] .. a[8i+7] */
        d[i] = __builtin_shufflevector(c[2 * i], c[2 * i + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16,
                                       17, 20, 21, 24, 25, 28, 29) +
               __builtin_shufflevector(c[2 * i], c[2 * i + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18,
                                       19, 22, 23, 26, 27, 30, 31);
    /* lane i: a[i] for i < 8 from d[0], a[8 + i] from d[1] */
    return __builtin_shufflevector(d[0], d[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24,
                                   26, 28, 30) +
           __builtin_shufflevector(d[0], d[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25,
                                   27, 29, 31);
}

static inline v16f reduce16(const v16f *a) {
    v16f c[4];
    for (int i = 0; i < 4; i++) c[i] = reduce4(a + 4 * i);
    return reduce_quarters(c);
}

#endif
