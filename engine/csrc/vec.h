/* 16-lane float32 vectors (GCC/Clang vector extensions) shared by the engine's kernels:
   -march=native makes them AVX2, AVX-512 or NEON registers. */
#ifndef WARMFLEET_VEC_H
#define WARMFLEET_VEC_H

#include <stdint.h>
#include <string.h>

typedef float v16f __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

static inline v16f load16(const float *p) { v16f v; memcpy(&v, p, sizeof v); return v; }
static inline void store16(float *p, v16f v) { memcpy(p, &v, sizeof v); }
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

#endif
