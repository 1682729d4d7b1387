/* A layer's per-row elementwise steps, each one call over all rows (NumPy takes 6-16
   calls for each): RMS norm (of rows, or of each head's run), rope on split halves,
   SiLU(gate) * up; and a step's keys or values into the KV pool. Single-threaded: at
   decode sizes a thread wake-up costs more than the work. Every row is computed by the
   same instructions whatever the row count. */

#include <math.h>
#include <stdint.h>

#include "kv_q8.h"
#include "vec.h"

/* The sum of x[0 .. dim)^2 as 16 lanes of multiply-adds and hsum's tree; dim % 16 == 0 */
static inline float sum_squares(const float *x, int64_t dim) {
#if WF_AVX2 /* the same operations on 8-lane halves, where a v16f went through the stack */
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int64_t i = 0; i < dim; i += 16) {
        __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + i + 8);
        lo = _mm256_fmadd_ps(a, a, lo);
        hi = _mm256_fmadd_ps(b, b, hi);
    }
    return hsum_halves(lo, hi);
#else
    v16f acc = {};
    for (int64_t i = 0; i < dim; i += 16) {
        v16f v = load16(x + i);
        acc = fma16(v, v, acc);
    }
    return hsum(acc);
#endif
}

/* out[r] = (x[r] / sqrt(mean(x[r]^2) + eps)) * w; dim % 16 == 0 */
void wf_rms_norm(const float *x, const float *w, float eps, int64_t rows, int64_t dim,
                 float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        v16f scale = splat(1.0f / sqrtf(sum_squares(xr, dim) / (float)dim + eps));
        for (int64_t i = 0; i < dim; i += 16)
            store16(out + r * dim + i, (load16(xr + i) * scale) * load16(w + i));
    }
}

/* in place: each of the `heads` runs of d values from x[r * stride + col0] RMS-normed with
   w [d], for every row r (Qwen 3's q and k norms); a run is wf_rms_norm's row; d % 16 == 0 */
void wf_head_rms_norm(float *x, int64_t stride, int64_t col0, int64_t rows, int64_t heads,
                      int64_t d, const float *w, float eps) {
    for (int64_t r = 0; r < rows; r++) {
        float *runs = x + r * stride + col0;
        wf_rms_norm(runs, w, eps, heads, d, runs); /* each value read before it is written */
    }
}

/* dst[r, h] = rope of src[r, col0 + h * d : ...] at position pos[r], split-half layout:
   [x1 * cos - x2 * sin, x1 * sin + x2 * cos]; tables [context, d / 2]; d / 2 % 16 == 0 */
void wf_rope(const float *src, int64_t src_stride, int64_t col0, int64_t rows, int64_t heads,
             int64_t d, const float *cos_t, const float *sin_t, const int64_t *pos,
             float *dst) {
    int64_t half = d / 2;
    for (int64_t r = 0; r < rows; r++) {
        const float *c = cos_t + pos[r] * half, *s = sin_t + pos[r] * half;
        for (int64_t h = 0; h < heads; h++) {
            const float *x = src + r * src_stride + col0 + h * d;
            float *y = dst + (r * heads + h) * d;
            for (int64_t i = 0; i < half; i += 16) {
                v16f x1 = load16(x + i), x2 = load16(x + half + i);
                v16f cv = load16(c + i), sv = load16(s + i);
                store16(y + i, x1 * cv - x2 * sv);
                store16(y + half + i, x1 * sv + x2 * cv);
            }
        }
    }
}

/* out[r] = silu(gate_up[r, :ffn]) * gate_up[r, ffn:]; ffn % 16 == 0 */
void wf_silu_mul(const float *gate_up, int64_t rows, int64_t ffn, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * ffn, *u = g + ffn;
        for (int64_t i = 0; i < ffn; i += 16) {
            v16f gv = load16(g + i);
            store16(out + r * ffn + i, gv / (splat(1.0f) + exp16(-gv)) * load16(u + i));
        }
    }
}

/* The step's keys or values into the pool of `kind` (wf_kv_put): token t's head h, d values
   at src[t * stride + h * d], to row rows[t * heads + h] of kv (a row: d values, or d / 32
   q8_0 blocks) */
void wf_put_kv_rows(void *kv, int kind, const int64_t *rows, const float *src, int64_t tokens,
                    int64_t heads, int64_t stride, int64_t d) {
    int64_t items = wf_kv_row_items(kind, d);
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++)
            wf_kv_put(kind, kv, rows[t * heads + h] * items, src + t * stride + h * d, d);
}
