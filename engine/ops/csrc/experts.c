/* Grouped products on mixture-of-experts weights read in place from their GGUF blocks
   (engine/ops/quant/experts.py): no repacking at load, so a model's resident memory stays
   near its file's size.

   Products: the block-quantized types multiply in integers with int8 activations
   (experts_int.c) unless asked for float32 (WF_PRODUCTS_FLOAT); F32, F16 and BF16, and the
   float32 products, take each weight as gguf-py's float32 dequantization, bit for bit
   (gguf_blocks.h), and multiply as below.

   Tasks: (touched expert, ROWS weight rows), handed out dynamically in runs of contiguous
   rows (at least 8 runs a thread, at most MAX_RUN tasks a run). A bucket of up to
   FUSED_PAIRS pairs (decode) multiplies each 32 weights as they are dequantized, in
   registers. More pairs take the task's rows KC weights at a time into a small float32
   buffer (L1) and pass PAIRS of them over it in MR x ROWS register tiles, the accumulators
   kept in L1 between chunks: the codes are read and dequantized once a call.

   Batch invariance: each output element is one activation row against one weight row: one
   16-lane accumulator over k in order (fma16), its lanes summed by vec.h's tree (hsum and
   reduce16 are the same tree), whatever the bucket's size, the pair's place in it, or the
   thread count; keeping an accumulator in memory between chunks changes none of its
   roundings. No -ffast-math, so the compiler may not reassociate. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "experts_int.h"
#include "gguf_blocks.h"
#include "moe.h"
#include "par.h"
#include "vec.h"

#define ROWS 4 /* weight rows per task */
#define MR 4   /* activation rows per register tile */
/* the most tasks a thread takes at once: a hand-out costs an atomic shared by the threads,
   so decode's ~1,500 tasks of 4 rows go out in ~100 runs, not one by one */
#define MAX_RUN 16
/* weights of a chunk (whole blocks of every type), and the pairs over one pass of the
   chunks: the chunk's rows, the pairs' accumulators and a tile's activations, 8 KB each,
   stay in L1 */
#define KC 512
#define PAIRS 32
/* buckets of up to this many pairs multiply in registers (on AVX2 two pairs' 8 accumulators
   would fill the 16 registers) */
#define FUSED_PAIRS (WF_AVX2 ? 1 : 2)

int wf_expert_supported(int qtype, int64_t k) {
    int t = qtype & ~WF_PACKED;
    if ((qtype & WF_PACKED) && !wf_int_packs(t)) return 0;
    return block_bytes(t) > 0 && k > 0 && k % block_weights(t) == 0;
}

/* Weights [c0, c0 + kc) of rows w[0 .. ROWS) (row bytes rb; rows past nr repeat the last)
   -> buf [ROWS, kc]; c0 and kc whole blocks. */
static inline __attribute__((always_inline)) void deq_chunk(int t, const uint8_t *w, int64_t rb,
                                                           int nr, int64_t c0, int64_t kc,
                                                           float *buf) {
    int bw = block_weights(t), bb = block_bytes(t);
    for (int j = 0; j < ROWS; j++) {
        const uint8_t *row = w + (j < nr ? j : nr - 1) * rb;
        for (int64_t b = c0 / bw; b < (c0 + kc) / bw; b++) {
            Groups g;
            block_groups(t, row + b * bb, &g);
            float *to = buf + j * kc + b * bw - c0;
#pragma GCC unroll 8
            for (int i = 0; i < bw / 32; i++) {
                v16f lo, hi;
                deq32(t, row + b * bb, i, &g, &lo, &hi);
                store16(to + 32 * i, lo);
                store16(to + 32 * i + 16, hi);
            }
        }
    }
}

/* mr (1 or 2) activation rows against rows w[0 .. ROWS), each 32 weights multiplied as
   they are dequantized: the same accumulators and order as dot_tile, without the trip
   through buf; ROWS rows at once, so ROWS * mr multiply-add chains hide their latency. */
static inline __attribute__((always_inline)) void fused(int t, int mr, const uint8_t *w,
                                                       int64_t rb, int nr, int64_t k,
                                                       const float *const *xs,
                                                       float *const *outs) {
    int bw = block_weights(t), bb = block_bytes(t);
    v16f acc[2][ROWS] = {};
    for (int64_t b = 0; b < k / bw; b++) {
        const uint8_t *blk[ROWS];
        Groups g[ROWS];
        for (int j = 0; j < ROWS; j++) {
            blk[j] = w + (j < nr ? j : nr - 1) * rb + b * bb;
            block_groups(t, blk[j], &g[j]);
        }
#pragma GCC unroll 8 /* shifts and offsets become constants */
        for (int i = 0; i < bw / 32; i++) {
            v16f x0[2], x1[2];
            for (int r = 0; r < mr; r++) {
                x0[r] = load16(xs[r] + b * bw + 32 * i);
                x1[r] = load16(xs[r] + b * bw + 32 * i + 16);
            }
            for (int j = 0; j < ROWS; j++) {
                v16f lo, hi;
                deq32(t, blk[j], i, &g[j], &lo, &hi);
                for (int r = 0; r < mr; r++) {
                    acc[r][j] = fma16(x0[r], lo, acc[r][j]);
                    acc[r][j] = fma16(x1[r], hi, acc[r][j]);
                }
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < nr; j++) outs[r][j] = hsum(acc[r][j]);
}

/* acc[r * ROWS + j] += activation row r . buf row j over kc weights, for mr (at most MR)
   rows xs[r] (at the chunk), the accumulators in memory between chunks: each one's lanes
   see the same multiply-adds in k order as a lone row's registers. */
#if WF_AVX2
/* AVX2 (16 registers of 8 lanes): a 16-lane accumulator as two 8-lane halves, each half
   through the chunk alone (a 4 x 4 tile of 16-lane vectors would spill): 2 rows x ROWS of
   one half is 8 registers (qmatmul.c's form). */
static inline __attribute__((always_inline)) void half_tile(int mr, const float *const *xs,
                                                            int64_t kc, const float *buf, int h,
                                                            v16f *acc) {
    __m256 a[2][ROWS];
    float *half_acc = (float *)acc + 8 * h; /* lanes 8h .. 8h + 7 of each accumulator */
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < ROWS; j++) a[r][j] = _mm256_loadu_ps(half_acc + 16 * (r * ROWS + j));
    for (int64_t i = 8 * h; i < kc; i += 16) {
        __m256 w[ROWS];
        for (int j = 0; j < ROWS; j++) w[j] = _mm256_loadu_ps(buf + j * kc + i);
        for (int r = 0; r < mr; r++) {
            __m256 xv = _mm256_loadu_ps(xs[r] + i);
            for (int j = 0; j < ROWS; j++) a[r][j] = _mm256_fmadd_ps(xv, w[j], a[r][j]);
        }
    }
    for (int r = 0; r < mr; r++)
        for (int j = 0; j < ROWS; j++) _mm256_storeu_ps(half_acc + 16 * (r * ROWS + j), a[r][j]);
}

static inline __attribute__((always_inline)) void dot_tile(int mr, const float *const *xs,
                                                           int64_t kc, const float *buf,
                                                           v16f *acc) {
    for (int r = 0; r < mr; r += 2)
        for (int h = 0; h < 2; h++)
            half_tile(r + 2 <= mr ? 2 : 1, xs + r, kc, buf, h, acc + r * ROWS);
}
#else
static inline __attribute__((always_inline)) void dot_tile(int mr, const float *const *xs,
                                                           int64_t kc, const float *buf,
                                                           v16f *acc) {
    v16f a[MR * ROWS];
    for (int q = 0; q < mr * ROWS; q++) a[q] = acc[q];
    for (int64_t i = 0; i < kc; i += 16) {
        v16f xv[MR], wv[ROWS];
        for (int r = 0; r < mr; r++) {
            xv[r] = load16(xs[r] + i);
            IN_REGISTER(xv[r]);
        }
        for (int j = 0; j < ROWS; j++) {
            wv[j] = load16(buf + j * kc + i);
            IN_REGISTER(wv[j]);
        }
        for (int j = 0; j < ROWS; j++)
            for (int r = 0; r < mr; r++) a[r * ROWS + j] = fma16(xv[r], wv[j], a[r * ROWS + j]);
    }
    for (int q = 0; q < mr * ROWS; q++) acc[q] = a[q];
}
#endif

/* The chunk's weights in buf against pairs [p0, p1) (at most PAIRS), MR a tile. */
static void dot_pairs(const float *x, int64_t x_stride, const int64_t *rows, int64_t p0,
                      int64_t p1, int64_t c0, int64_t kc, const float *buf, v16f *acc) {
    for (int64_t p = p0; p < p1; p += MR) {
        int mr = p1 - p < MR ? (int)(p1 - p) : MR;
        const float *xs[MR]; /* a narrower tile's unused rows: its first (never read) */
        for (int r = 0; r < MR; r++) xs[r] = x + rows[p + (r < mr ? r : 0)] * x_stride + c0;
        v16f *a = acc + (p - p0) * ROWS;
        switch (mr) {
        case MR: dot_tile(MR, xs, kc, buf, a); break;
        case 3: dot_tile(3, xs, kc, buf, a); break;
        case 2: dot_tile(2, xs, kc, buf, a); break;
        default: dot_tile(1, xs, kc, buf, a);
        }
    }
}

/* out[p, j] = the lanes of acc[(p - p0) * ROWS + j] by the hsum tree (reduce16 is the same
   tree, 16 outputs at a time). */
static void reduce_pairs(const v16f *acc, int64_t p0, int64_t p1, int nr, float *out,
                         int64_t out_stride) {
    int64_t p = p0;
    for (; p + MR <= p1; p += MR) {
        v16f sums = reduce16(acc + (p - p0) * ROWS);
        for (int r = 0; r < MR; r++)
            for (int j = 0; j < nr; j++) out[(p + r) * out_stride + j] = sums[r * ROWS + j];
    }
    for (; p < p1; p++)
        for (int j = 0; j < nr; j++) out[p * out_stride + j] = hsum(acc[(p - p0) * ROWS + j]);
}
_Static_assert(MR * ROWS == 16, "MR pairs' outputs are one reduce16");

/* One task: pairs [p0, p1) of an expert against its rows [n0, n0 + nr), w at row n0,
   out at column n0. Up to FUSED_PAIRS pairs multiply as they dequantize; more take the
   rows a chunk at a time into buf (L1), PAIRS pairs at most over each (acc: PAIRS * ROWS). */
static inline __attribute__((always_inline)) void task(int t, const uint8_t *w, int64_t rb,
                                                      int nr, int64_t k, const float *x,
                                                      int64_t x_stride, const int64_t *rows,
                                                      int64_t p0, int64_t p1, float *out,
                                                      int64_t out_stride, float *buf,
                                                      v16f *acc) {
    if (p1 - p0 <= FUSED_PAIRS) {
        const float *xs[2] = {x + rows[p0] * x_stride, x + rows[p1 - 1] * x_stride};
        float *outs[2] = {out + p0 * out_stride, out + (p1 - 1) * out_stride};
        if (p1 - p0 == 1)
            fused(t, 1, w, rb, nr, k, xs, outs);
        else
            fused(t, 2, w, rb, nr, k, xs, outs);
        return;
    }
    for (int64_t q0 = p0; q0 < p1; q0 += PAIRS) {
        int64_t q1 = p1 - q0 < PAIRS ? p1 : q0 + PAIRS;
        memset(acc, 0, sizeof(v16f) * (q1 - q0) * ROWS);
        for (int64_t c0 = 0; c0 < k; c0 += KC) {
            int64_t kc = k - c0 < KC ? k - c0 : KC;
            deq_chunk(t, w, rb, nr, c0, kc, buf);
            dot_pairs(x, x_stride, rows, q0, q1, c0, kc, buf, acc);
        }
        reduce_pairs(acc, q0, q1, nr, out, out_stride);
    }
}

static void run_task(int t, const uint8_t *w, int64_t rb, int nr, int64_t k, const float *x,
                     int64_t x_stride, const int64_t *rows, int64_t p0, int64_t p1, float *out,
                     int64_t out_stride, float *buf, v16f *acc) {
#define CASE(T)                                                                                \
    case T: task(T, w, rb, nr, k, x, x_stride, rows, p0, p1, out, out_stride, buf, acc); break;
    switch (t) {
        CASE(T_F32) CASE(T_F16) CASE(T_BF16) CASE(T_Q4_0) CASE(T_Q4_1) CASE(T_Q5_0)
        CASE(T_Q5_1) CASE(T_Q8_0) CASE(T_Q4_K) CASE(T_Q5_K) CASE(T_Q6_K) CASE(T_MXFP4)
    default: break;
    }
#undef CASE
}

/* Floats of a thread's scratch: a chunk of ROWS rows, then PAIRS x ROWS accumulators (or
   an integer task's chunk and accumulators). */
#define THREAD_FLOATS (ROWS * KC + PAIRS * ROWS * 16)
_Static_assert(INT_THREAD_BYTES <= sizeof(float) * THREAD_FLOATS, "integer tasks fit");

/* Scratch after the threads': touched experts (int64), which x rows pairs use (bytes),
   then those rows quantized (experts_int.c). */
static int64_t touched_floats(int64_t num_experts) { return (2 * num_experts + 15) / 16 * 16; }
static int64_t used_floats(int64_t x_rows) { return (x_rows + 63) / 64 * 16; }

int64_t wf_expert_matmul_scratch(int64_t num_experts, int64_t x_rows, int64_t k, int threads) {
    return threads * THREAD_FLOATS + touched_floats(num_experts) + used_floats(x_rows) +
           x_rows * wf_int_act_bytes(k) / (int64_t)sizeof(float);
}

/* A grouped product's arguments and plan, shared by its region's threads. */
typedef struct {
    int qtype, in_integers, task_rows; /* task_rows: PACK_ROWS on a packed matrix */
    const uint8_t *w;
    int64_t expert_bytes, n, k, rb, tiles, x_stride, out_stride, num_pairs, x_rows;
    int64_t num_tasks, run, next_row, next_task; /* next_*: the first no thread took yet */
    const float *x;
    const int64_t *rows, *starts, *touched;
    float *out, *scratch;
    uint8_t *used, *acts;
} Grouped;

/* The x rows the pairs use, each quantized once, before any thread's tasks read them. */
static void quantize_rows(Grouped *g, int t) {
    if (t == 0) {
        memset(g->used, 0, g->x_rows);
        for (int64_t p = 0; p < g->num_pairs; p++) g->used[g->rows[p]] = 1;
    }
    wf_barrier();
    int64_t ab = wf_int_act_bytes(g->k);
    for (int64_t r; (r = wf_take(&g->next_row, 1)) < g->x_rows;)
        if (g->used[r]) wf_int_quantize(g->qtype, g->x + r * g->x_stride, g->k, g->acts + r * ab);
    wf_barrier();
}

/* Tasks taken `run` at a time until none is left. */
static void take_tasks(void *ctx, int t, int threads) {
    (void)threads;
    Grouped *g = ctx;
    int64_t n = g->n, rb = g->rb;
    float *buf = g->scratch + t * THREAD_FLOATS;
    v16f *acc = (v16f *)(buf + ROWS * KC);
    if (g->in_integers) quantize_rows(g, t);
    for (int64_t first; (first = wf_take(&g->next_task, g->run)) < g->num_tasks;) {
        int64_t last = first + g->run < g->num_tasks ? first + g->run : g->num_tasks;
        for (int64_t task_id = first; task_id < last; task_id++) {
            int64_t e = g->touched[task_id / g->tiles], n0 = task_id % g->tiles * g->task_rows;
            const uint8_t *we = g->w + e * g->expert_bytes + n0 * rb;
            int64_t p0 = g->starts[e], p1 = g->starts[e + 1];
            if (g->task_rows == PACK_ROWS) {
                wf_int_packed_task(g->qtype, we, g->k, g->acts, g->rows, p0, p1, g->out + n0,
                                   g->out_stride);
                continue;
            }
            int nr = n - n0 < ROWS ? (int)(n - n0) : ROWS;
            /* the next task's rows, most likely this thread's */
            const uint8_t *ahead = n0 + 2 * ROWS <= n ? we + ROWS * rb : NULL;
            if (g->in_integers) {
                wf_int_task(g->qtype, we, rb, nr, g->k, g->acts, g->rows, p0, p1, g->out + n0,
                            g->out_stride, buf, ahead);
                continue;
            }
            for (int64_t off = 0; ahead && off < ROWS * rb; off += 64)
                __builtin_prefetch(ahead + off);
            run_task(g->qtype, we, rb, nr, g->k, g->x, g->x_stride, g->rows, p0, p1, g->out + n0,
                     g->out_stride, buf, acc);
        }
    }
}

void wf_expert_matmul_with(int products, int qtype, const uint8_t *w, int64_t expert_bytes,
                           int64_t n, int64_t k, const float *x, int64_t x_stride,
                           const int64_t *rows, const int64_t *starts, int64_t num_experts,
                           float *out, int64_t out_stride, int threads, float *scratch) {
    int packed = (qtype & WF_PACKED) != 0, task_rows = packed ? PACK_ROWS : ROWS;
    qtype &= ~WF_PACKED; /* a packed matrix's rows take the bytes of the file's */
    int64_t tiles = (n + task_rows - 1) / task_rows, num_pairs = starts[num_experts], x_rows = 0;
    int64_t rb = k / block_weights(qtype) * block_bytes(qtype);
    int64_t *touched = (int64_t *)(scratch + threads * THREAD_FLOATS), num_touched = 0;
    uint8_t *used = (uint8_t *)(scratch + threads * THREAD_FLOATS + touched_floats(num_experts));
    for (int64_t e = 0; e < num_experts; e++) /* experts with no pairs are never read */
        if (starts[e + 1] > starts[e]) touched[num_touched++] = e;
    for (int64_t p = 0; p < num_pairs; p++) x_rows = rows[p] >= x_rows ? rows[p] + 1 : x_rows;
    int64_t num_tasks = num_touched * tiles, run = num_tasks / (8 * threads);
    if (!num_tasks) return;
    Grouped g = {qtype, packed || (products == WF_PRODUCTS_INTEGER && wf_int_products(qtype)),
                 task_rows, w,
                 expert_bytes, n, k, rb, tiles, x_stride, out_stride, num_pairs, x_rows,
                 num_tasks, run < 1 ? 1 : run > MAX_RUN ? MAX_RUN : run, 0, 0, x, rows, starts,
                 touched, out, scratch, used, used + 4 * used_floats(x_rows)};
    wf_parallel(threads, take_tasks, &g);
}

int64_t wf_expert_matmul_as(int products, int qtype, const uint8_t *w, int64_t expert_bytes,
                            int64_t n, int64_t k, const float *x, int64_t x_stride,
                            const int64_t *rows, const int64_t *starts, int64_t num_experts,
                            float *out, int64_t out_stride, int threads) {
    if (!wf_expert_supported(qtype, k) || threads < 1) return -1;
    int64_t x_rows = 0;
    for (int64_t p = 0; p < starts[num_experts]; p++)
        x_rows = rows[p] >= x_rows ? rows[p] + 1 : x_rows;
    int64_t bytes = sizeof(float) * wf_expert_matmul_scratch(num_experts, x_rows, k, threads);
    float *scratch = aligned_alloc(64, bytes);
    if (!scratch) return bytes;
    wf_expert_matmul_with(products, qtype, w, expert_bytes, n, k, x, x_stride, rows, starts,
                          num_experts, out, out_stride, threads, scratch);
    free(scratch);
    return 0;
}

int64_t wf_expert_matmul(int qtype, const uint8_t *w, int64_t expert_bytes, int64_t n,
                         int64_t k, const float *x, int64_t x_stride, const int64_t *rows,
                         const int64_t *starts, int64_t num_experts, float *out,
                         int64_t out_stride, int threads) {
    return wf_expert_matmul_as(WF_PRODUCTS_INTEGER, qtype, w, expert_bytes, n, k, x, x_stride,
                               rows, starts, num_experts, out, out_stride, threads);
}
