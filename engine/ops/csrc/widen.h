/* Loads that widen 16 values into 16 lanes, one instruction where the ISA has it: uint16 to
   int32, float16 to float32 (exact). Shared by the products on codes (qmatmul.c) and on the
   file's blocks (gguf_blocks.h). */
#ifndef WARMFLEET_WIDEN_H
#define WARMFLEET_WIDEN_H

#include <stdint.h>
#include <string.h>

#include "vec.h"
#if defined(__F16C__) && !defined(__AVX512F__) && !defined(__AVX2__)
#include <immintrin.h>
#endif

static inline v16i widen_u16(const uint8_t *p) {
    v16i out;
#if defined(__AVX512F__)
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&out, &w, sizeof out);
#elif defined(__AVX2__)
    __m256i w[2] = {_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)),
                    _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16)))};
    memcpy(&out, w, sizeof out);
#elif defined(__ARM_NEON)
    uint16x8_t lo = vld1q_u16((const uint16_t *)p), hi = vld1q_u16((const uint16_t *)p + 8);
    uint32x4_t w[4] = {vmovl_u16(vget_low_u16(lo)), vmovl_u16(vget_high_u16(lo)),
                       vmovl_u16(vget_low_u16(hi)), vmovl_u16(vget_high_u16(hi))};
    memcpy(&out, w, sizeof out);
#else
    uint16_t h[16];
    memcpy(h, p, sizeof h);
    for (int i = 0; i < 16; i++) out[i] = h[i];
#endif
    return out;
}

static inline v16f half_to_float(const uint8_t *p) {
    v16f out;
#if defined(__AVX512F__)
    __m512 w = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&out, &w, sizeof out);
#elif defined(__F16C__)
    __m256 w[2] = {_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                   _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16)))};
    memcpy(&out, w, sizeof out);
#else
    _Float16 h[16];
    memcpy(h, p, sizeof h);
    for (int i = 0; i < 16; i++) out[i] = (float)h[i];
#endif
    return out;
}

#endif
