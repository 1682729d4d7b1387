/* A layer's per-row elementwise steps, each one call over all rows (NumPy takes 6-16
   calls for each): RMS norm (of rows, or of each head's run), rope on split halves,
   SiLU(gate) * up, the residual add; and a step's keys or values into the KV pool. Every
   row is computed by the same instructions whatever the row count and the threads.

   Threads: the rows are split over `threads` only where there are many (a prefill
   chunk's): at decode sizes a thread wake-up costs more than the work. A long chunk's
   steps on one thread also left the other cores idle between the products, their threads
   falling asleep there (8 such steps a layer: ~5% of a 512-token prefill built for AVX2). */

#include <math.h>
#include <stdint.h>

#include "kv_q8.h"
#include "par.h"
#include "vec.h"

#define SPLIT_FLOATS (1 << 15) /* a call's floats out from which its rows are split */

typedef void (*rows_fn)(const void *args, int64_t r0, int64_t r1);

typedef struct {
    rows_fn fn;
    const void *args;
    int64_t rows;
} Split;

static void split_share(void *ctx, int t, int threads) {
    const Split *s = ctx;
    int64_t lo, hi;
    wf_share(s->rows, t, threads, &lo, &hi);
    if (lo < hi) s->fn(s->args, lo, hi);
}

/* fn(args, r0, r1) over rows [0, rows): split over the threads where the call writes
   SPLIT_FLOATS or more (row_floats a row), else on the calling thread. */
static void over_rows(rows_fn fn, const void *args, int64_t rows, int64_t row_floats,
                      int threads) {
    if (threads <= 1 || rows < 2 || rows * row_floats < SPLIT_FLOATS) {
        fn(args, 0, rows);
        return;
    }
    Split s = {fn, args, rows};
    wf_parallel(threads, split_share, &s);
}

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

typedef struct {
    const float *x, *w;
    float eps;
    int64_t dim, stride; /* stride: floats from a row of x to the next (out's: dim) */
    float *out;
} Norm;

static void norm_rows(const void *args, int64_t r0, int64_t r1) {
    const Norm *a = args;
    for (int64_t r = r0; r < r1; r++) {
        const float *xr = a->x + r * a->stride;
        v16f scale = splat(1.0f / sqrtf(sum_squares(xr, a->dim) / (float)a->dim + a->eps));
        for (int64_t i = 0; i < a->dim; i += 16)
            store16(a->out + r * a->dim + i, (load16(xr + i) * scale) * load16(a->w + i));
    }
}

/* out[r] = (x[r] / sqrt(mean(x[r]^2) + eps)) * w; dim % 16 == 0 */
void wf_rms_norm(const float *x, const float *w, float eps, int64_t rows, int64_t dim,
                 float *out, int threads) {
    Norm a = {x, w, eps, dim, dim, out};
    over_rows(norm_rows, &a, rows, dim, threads);
}

typedef struct {
    float *x;
    int64_t stride, col0, heads, d;
    const float *w;
    float eps;
} HeadNorm;

static void head_norm_rows(const void *args, int64_t r0, int64_t r1) {
    const HeadNorm *a = args;
    for (int64_t r = r0; r < r1; r++) { /* each value read before it is written */
        float *runs = a->x + r * a->stride + a->col0;
        Norm n = {runs, a->w, a->eps, a->d, a->d, runs};
        norm_rows(&n, 0, a->heads);
    }
}

/* in place: each of the `heads` runs of d values from x[r * stride + col0] RMS-normed with
   w [d], for every row r (Qwen 3's q and k norms); a run is wf_rms_norm's row; d % 16 == 0 */
void wf_head_rms_norm(float *x, int64_t stride, int64_t col0, int64_t rows, int64_t heads,
                      int64_t d, const float *w, float eps, int threads) {
    HeadNorm a = {x, stride, col0, heads, d, w, eps};
    over_rows(head_norm_rows, &a, rows, heads * d, threads);
}

typedef struct {
    const float *src, *cos_t, *sin_t;
    int64_t src_stride, col0, heads, d;
    const int64_t *pos;
    float *dst;
} Rope;

static void rope_rows(const void *args, int64_t r0, int64_t r1) {
    const Rope *a = args;
    int64_t half = a->d / 2;
    for (int64_t r = r0; r < r1; r++) {
        const float *c = a->cos_t + a->pos[r] * half, *s = a->sin_t + a->pos[r] * half;
        for (int64_t h = 0; h < a->heads; h++) {
            const float *x = a->src + r * a->src_stride + a->col0 + h * a->d;
            float *y = a->dst + (r * a->heads + h) * a->d;
            for (int64_t i = 0; i < half; i += 16) {
                v16f x1 = load16(x + i), x2 = load16(x + half + i);
                v16f cv = load16(c + i), sv = load16(s + i);
                store16(y + i, x1 * cv - x2 * sv);
                store16(y + half + i, x1 * sv + x2 * cv);
            }
        }
    }
}

/* dst[r, h] = rope of src[r, col0 + h * d : ...] at position pos[r], split-half layout:
   [x1 * cos - x2 * sin, x1 * sin + x2 * cos]; tables [context, d / 2]; d / 2 % 16 == 0 */
void wf_rope(const float *src, int64_t src_stride, int64_t col0, int64_t rows, int64_t heads,
             int64_t d, const float *cos_t, const float *sin_t, const int64_t *pos, float *dst,
             int threads) {
    Rope a = {src, cos_t, sin_t, src_stride, col0, heads, d, pos, dst};
    over_rows(rope_rows, &a, rows, heads * d, threads);
}

typedef struct {
    const float *gate_up;
    int64_t ffn;
    float *out;
} Silu;

static void silu_rows(const void *args, int64_t r0, int64_t r1) {
    const Silu *a = args;
    for (int64_t r = r0; r < r1; r++) {
        const float *g = a->gate_up + r * 2 * a->ffn, *u = g + a->ffn;
        for (int64_t i = 0; i < a->ffn; i += 16) {
            v16f gv = load16(g + i);
            store16(a->out + r * a->ffn + i, gv / (splat(1.0f) + exp16(-gv)) * load16(u + i));
        }
    }
}

/* out[r] = silu(gate_up[r, :ffn]) * gate_up[r, ffn:]; ffn % 16 == 0 */
void wf_silu_mul(const float *gate_up, int64_t rows, int64_t ffn, float *out, int threads) {
    Silu a = {gate_up, ffn, out};
    over_rows(silu_rows, &a, rows, ffn, threads);
}

typedef struct {
    const float *x, *y;
    int64_t cols;
    float *out;
} Add;

static void add_rows(const void *args, int64_t r0, int64_t r1) {
    const Add *a = args;
    for (int64_t i = r0 * a->cols; i < r1 * a->cols; i++) a->out[i] = a->x[i] + a->y[i];
}

/* out = x + y, [rows, cols] each (out may be x): the residual stream's adds */
void wf_add(const float *x, const float *y, int64_t rows, int64_t cols, float *out,
            int threads) {
    Add a = {x, y, cols, out};
    over_rows(add_rows, &a, rows, cols, threads);
}

typedef struct {
    void *kv;
    int kind;
    const int64_t *rows;
    const float *src;
    int64_t heads, stride, d, items;
} Put;

static void put_rows(const void *args, int64_t t0, int64_t t1) {
    const Put *a = args;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t h = 0; h < a->heads; h++)
            wf_kv_put(a->kind, a->kv, a->rows[t * a->heads + h] * a->items,
                      a->src + t * a->stride + h * a->d, a->d);
}

/* The step's keys or values into the pool of `kind` (wf_kv_put): token t's head h, d values
   at src[t * stride + h * d], to row rows[t * heads + h] of kv (a row: d values, or d / 32
   q8_0 blocks; distinct rows) */
void wf_put_kv_rows(void *kv, int kind, const int64_t *rows, const float *src, int64_t tokens,
                    int64_t heads, int64_t stride, int64_t d, int threads) {
    Put a = {kv, kind, rows, src, heads, stride, d, wf_kv_row_items(kind, d)};
    over_rows(put_rows, &a, tokens, heads * d, threads);
}
