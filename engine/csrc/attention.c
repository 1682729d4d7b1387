/* Attention of single query rows over their sequences' keys in the paged KV pool.

   A task is one (row, KV head): its G query heads walk the row's block table. Scores of a
   block's 16 keys are 16 dot products summed lane-wise (D / 16 fused multiply-adds each)
   and then reduced across lanes together, by a fixed tree of vector shuffles, instead of
   one horizontal sum per key. Softmax with a vector exp (a fixed polynomial), then the
   values weighted in 16-lane vectors. Each row's result depends on its own keys only, and
   is computed by the same instructions whatever other rows the call holds.

   Shapes: q [R, H, D]; k, v [num_blocks, Hkv, 16, D] (one layer); tables [R, max_blocks];
   out [R, H, D]. D a multiple of 16, at most 256; G = H / Hkv at most 16. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vec.h"

#define BLOCK 16
#define MAX_G 16
#define MAX_D 256
static const v16i IOTA16 = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

/* One task: query row `row`, KV head `kh`. `g` and `nv` (D / 16) are constants where the
   caller dispatches on them, so the accumulators live in registers. */
static inline __attribute__((always_inline)) void row_task(
    const float *q, const float *k, const float *v, const int32_t *tables, int64_t max_blocks,
    int64_t n, int64_t row, int64_t kh, int64_t num_heads, int64_t num_kv_heads, int64_t g,
    int64_t nv, float scale, float *p, int64_t padded, float *out) {
    int64_t dim = 16 * nv, nb = (n + BLOCK - 1) / BLOCK;
    const int32_t *table = tables + row * max_blocks;
    v16f qv[MAX_G][MAX_D / 16];
    for (int64_t j = 0; j < g; j++)
        for (int64_t c = 0; c < nv; c++)
            qv[j][c] = load16(q + (row * num_heads + kh * g + j) * dim + 16 * c) * splat(scale);
    v16f top[MAX_G];
    for (int64_t j = 0; j < g; j++) top[j] = splat(-INFINITY);
    for (int64_t b = 0; b < nb; b++) { /* scores, 16 keys at a time */
        const float *kb = k + ((int64_t)table[b] * num_kv_heads + kh) * BLOCK * dim;
        if (b + 1 < nb) { /* the next block's keys: a table walk defeats the prefetcher */
            const char *next = (const char *)(k + ((int64_t)table[b + 1] * num_kv_heads + kh) *
                                                      BLOCK * dim);
            for (int64_t off = 0; off < BLOCK * dim * 4; off += 64) __builtin_prefetch(next + off);
        }
        for (int64_t j = 0; j < g; j++) {
            v16f acc[BLOCK];
            for (int s = 0; s < BLOCK; s++) {
                v16f a = qv[j][0] * load16(kb + s * dim);
                for (int64_t c = 1; c < nv; c++) a += qv[j][c] * load16(kb + s * dim + 16 * c);
                acc[s] = a;
            }
            v16f sc = reduce16(acc);
            if (b == nb - 1) /* keys past the row's length */
                sc = select16(IOTA16 + (int32_t)(b * BLOCK) >= (int32_t)n, splat(-INFINITY), sc);
            top[j] = select16(sc > top[j], sc, top[j]);
            store16(p + j * padded + b * BLOCK, sc);
        }
    }
    v16f acc_v[MAX_G][MAX_D / 16];
    for (int64_t j = 0; j < g; j++) {
        float m = top[j][0];
        for (int i = 1; i < 16; i++) m = top[j][i] > m ? top[j][i] : m;
        v16f total = {};
        for (int64_t b = 0; b < nb; b++) {
            v16f e = exp16(load16(p + j * padded + b * BLOCK) - splat(m));
            total += e;
            store16(p + j * padded + b * BLOCK, e);
        }
        float inv = 1.0f / hsum(total);
        for (int64_t b = 0; b < nb; b++)
            store16(p + j * padded + b * BLOCK, load16(p + j * padded + b * BLOCK) * splat(inv));
        for (int64_t c = 0; c < nv; c++) acc_v[j][c] = (v16f){};
    }
    for (int64_t b = 0; b < nb; b++) { /* the values, weighted */
        const float *vb = v + ((int64_t)table[b] * num_kv_heads + kh) * BLOCK * dim;
        if (b + 1 < nb) {
            const char *next = (const char *)(v + ((int64_t)table[b + 1] * num_kv_heads + kh) *
                                                      BLOCK * dim);
            for (int64_t off = 0; off < BLOCK * dim * 4; off += 64) __builtin_prefetch(next + off);
        }
        int64_t keys = n - b * BLOCK < BLOCK ? n - b * BLOCK : BLOCK;
        for (int64_t s = 0; s < keys; s++) {
            const float *vt = vb + s * dim;
            for (int64_t j = 0; j < g; j++) {
                v16f w = splat(p[j * padded + b * BLOCK + s]);
                for (int64_t c = 0; c < nv; c++) acc_v[j][c] += w * load16(vt + 16 * c);
            }
        }
    }
    for (int64_t j = 0; j < g; j++)
        for (int64_t c = 0; c < nv; c++)
            store16(out + (row * num_heads + kh * g + j) * dim + 16 * c, acc_v[j][c]);
}

/* The task body specialised for common (G, D / 16): the model families' head layouts. */
#define SPECIALISED(G, NV)                                                                   \
    if (g == G && nv == NV) {                                                                \
        row_task(q, k, v, tables, max_blocks, n, row, kh, num_heads, num_kv_heads, G, NV,   \
                 scale, p, padded, out);                                                     \
        continue;                                                                            \
    }

void wf_paged_rows(const float *q, const float *k, const float *v, const int32_t *tables,
                   int64_t max_blocks, const int32_t *lengths, int64_t num_rows,
                   int64_t num_heads, int64_t num_kv_heads, int64_t dim, float scale,
                   float *out, int num_threads) {
    int64_t g = num_heads / num_kv_heads, nv = dim / 16;
    int64_t longest = 0;
    for (int64_t r = 0; r < num_rows; r++) longest = lengths[r] > longest ? lengths[r] : longest;
    int64_t padded = (longest + BLOCK - 1) / BLOCK * BLOCK;
#pragma omp parallel num_threads(num_threads)
    {
        float *p = aligned_alloc(64, sizeof(float) * g * (padded + BLOCK));
#pragma omp for schedule(dynamic, 1)
        for (int64_t task = 0; task < num_rows * num_kv_heads; task++) {
            int64_t row = task / num_kv_heads, kh = task % num_kv_heads, n = lengths[row];
            SPECIALISED(3, 4) SPECIALISED(4, 8) SPECIALISED(8, 8) SPECIALISED(7, 8)
            SPECIALISED(1, 4) SPECIALISED(1, 8) SPECIALISED(2, 8) SPECIALISED(4, 4)
            row_task(q, k, v, tables, max_blocks, n, row, kh, num_heads, num_kv_heads, g, nv,
                     scale, p, padded, out);
        }
        free(p);
    }
}
