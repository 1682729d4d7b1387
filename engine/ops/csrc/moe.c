/* The mixture-of-experts FFN of a step, as llama.cpp's qwen3moe computes it: router
   logits, softmax over every expert, the top k renormalised, each (row, expert) pair through
   the expert's gate and up products, silu(g) * u, the down product, and each row's k outputs
   weighted and added in the row's own rank order. gpt-oss's (the biases given): the
   router's bias added, the top k by logit weighted by the softmax of those k, each product's
   bias added, and its clamped SwiGLU (llama.cpp's swiglu_oai) for silu(g) * u. Every step is batch invariant (the
   products by experts.c's rule, the rest row by row or element by element), so a row's
   output bits never depend on which other rows share the step.

   Shapes: x, out [R, dim]; router [E, dim]; P = R * top_k pairs; g, u [P, ffn]; d [P, dim]. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe.h"
#include "par.h"
#include "vec.h"

#define GGML_F32 0

/* An empty asm that claims to change v: the compiler cannot fuse the product that made v
   into the add that follows (GNU C contracts a * b + c across statements). */
#if defined(__AVX512F__)
#define OPAQUE(v) __asm__("" : "+v"(v))
#else
#define OPAQUE(v) __asm__("" : "+m"(v))
#endif

typedef struct {
    float *logits;   /* [R, E] router products, then probabilities */
    float *weights;  /* [R, K] renormalised probabilities, in rank order */
    int64_t *pair;   /* [R, K] the chosen experts, then the pair each (row, rank) became */
    int64_t *starts; /* [E + 1] pairs of expert e: [starts[e], starts[e + 1]) */
    int64_t *next;   /* [E] where expert e's next pair goes */
    int64_t *rows;   /* [P] the activation row of each pair */
    int64_t *expert; /* [P] the expert of each pair */
    int64_t *ids;    /* [max(R, P)] 0, 1, 2, ...: the router's rows and down's */
    float *g, *u, *d;
    float *kernel; /* wf_expert_matmul_with's scratch */
} Parts;

/* Each part's place from base (64-byte aligned each), the total bytes returned; base NULL
   only measures. */
static int64_t layout(const WfMoE *m, int64_t rows, int threads, char *base, Parts *p) {
    int64_t e = m->num_experts, pairs = rows * m->top_k, at = 0;
    /* the products' activations: x [rows, dim] (router, gate, up), then g [pairs, ffn] */
    int64_t x_rows = pairs > rows ? pairs : rows, k = m->dim > m->ffn ? m->dim : m->ffn;
    struct {
        void **to;
        int64_t bytes;
    } parts[] = {
        {(void **)&p->logits, 4 * rows * e},
        {(void **)&p->weights, 4 * pairs},
        {(void **)&p->pair, 8 * pairs},
        {(void **)&p->starts, 8 * (e + 1)},
        {(void **)&p->next, 8 * e},
        {(void **)&p->rows, 8 * pairs},
        {(void **)&p->expert, 8 * pairs},
        {(void **)&p->ids, 8 * (pairs > rows ? pairs : rows)},
        {(void **)&p->g, 4 * pairs * m->ffn},
        {(void **)&p->u, 4 * pairs * m->ffn},
        {(void **)&p->d, 4 * pairs * m->dim},
        {(void **)&p->kernel, sizeof(float) * wf_expert_matmul_scratch(e, x_rows, k, threads)},
    };
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (base) *parts[i].to = base + at;
        at += (parts[i].bytes + 63) / 64 * 64;
    }
    return at;
}

int64_t wf_moe_ffn_scratch(const WfMoE *m, int64_t rows, int threads) {
    Parts p;
    return layout(m, rows, threads, NULL, &p) / sizeof(float); /* whole 64-byte parts */
}

/* probs[e] = softmax of a row's logits, in place: max subtracted, sum in expert order */
static void softmax(float *l, int64_t e) {
    float top = l[0], sum = 0.0f;
    for (int64_t i = 1; i < e; i++) top = l[i] > top ? l[i] : top;
    for (int64_t i = 0; i < e; i++) {
        l[i] = expf(l[i] - top);
        sum += l[i];
    }
    for (int64_t i = 0; i < e; i++) l[i] = l[i] / sum;
}

/* A row's top k by descending probability (ties: the lower expert first), renormalised by
   their sum in rank order; with `chosen_softmax` (gpt-oss) probs are logits, and the
   weights the softmax of the k chosen (the first the largest), summed in rank order. */
static void choose(const float *probs, int64_t e, int64_t k, int64_t *chosen, float *weights,
                   int chosen_softmax) {
    int64_t n = 0;
    for (int64_t i = 0; i < e; i++) {
        int64_t at = n < k ? n : k; /* after every kept expert at least as likely */
        while (at > 0 && probs[chosen[at - 1]] < probs[i]) at--;
        if (at == k) continue;
        for (int64_t j = (n < k ? n : k - 1); j > at; j--) chosen[j] = chosen[j - 1];
        chosen[at] = i;
        n += n < k;
    }
    float sum = 0.0f;
    if (chosen_softmax) {
        for (int64_t j = 0; j < k; j++) {
            weights[j] = expf(probs[chosen[j]] - probs[chosen[0]]);
            sum += weights[j];
        }
        for (int64_t j = 0; j < k; j++) weights[j] = weights[j] / sum;
        return;
    }
    for (int64_t j = 0; j < k; j++) sum += probs[chosen[j]];
    for (int64_t j = 0; j < k; j++) weights[j] = probs[chosen[j]] / sum;
}

/* The pairs bucketed by expert (within one by row): starts, rows, and pair[r, j] the pair
   (row r, rank j) became. Returns the experts touched. */
static int64_t bucket(const WfMoE *m, int64_t rows, const Parts *p) {
    int64_t e = m->num_experts, k = m->top_k, touched = 0;
    memset(p->starts, 0, sizeof(int64_t) * (e + 1));
    for (int64_t i = 0; i < rows * k; i++) p->starts[p->pair[i] + 1]++;
    for (int64_t i = 0; i < e; i++) {
        touched += p->starts[i + 1] > 0;
        p->starts[i + 1] += p->starts[i];
        p->next[i] = p->starts[i];
    }
    for (int64_t i = 0; i < rows * k; i++) {
        int64_t at = p->next[p->pair[i]]++;
        p->rows[at] = i / k;
        p->expert[at] = p->pair[i];
        p->pair[i] = at;
    }
    return touched;
}

static void experts(const WfExperts *w, int products, const float *x, int64_t x_stride,
                    const int64_t *rows, const int64_t *starts, int64_t num_experts, float *out,
                    int threads, float *scratch) {
    wf_expert_matmul_with(products, w->qtype, w->data, w->expert_bytes, w->n, w->k, x, x_stride,
                          rows, starts, num_experts, out, w->n, threads, scratch);
}

/* An elementwise step's arguments, shared by its region's threads. */
typedef struct {
    const WfMoE *m;
    const Parts *p;
    float *g, *out;
    const float *u;
    int64_t n;
} Step;

#define SPREAD_MIN 65536 /* elements a step needs to be spread over the threads */

static void silu_share(void *ctx, int t, int threads) {
    const Step *s = ctx;
    int64_t lo, hi;
    wf_share(s->n, t, threads, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) s->g[i] = s->g[i] / (1.0f + expf(-s->g[i])) * s->u[i];
}

/* g = silu(g) * u, element by element */
static void silu_mul(float *g, const float *u, int64_t n, int threads) {
    Step s = {.g = g, .u = u, .n = n};
    wf_parallel(n >= SPREAD_MIN ? threads : 1, silu_share, &s);
}

#define OAI_ALPHA 1.702f /* gpt-oss's SwiGLU: SiLU's slope, and where gate and up clamp */
#define OAI_LIMIT 7.0f

static void swiglu_oai_share(void *ctx, int t, int threads) {
    const Step *s = ctx;
    const WfMoE *m = s->m;
    const Parts *p = s->p;
    int64_t ffn = m->ffn, lo, hi;
    wf_share(s->n, t, threads, &lo, &hi);
    for (int64_t q = lo; q < hi; q++) {
        int64_t e = p->expert[q];
        for (int64_t i = 0; i < ffn; i++) {
            float x = p->g[q * ffn + i] + m->gate_bias[e * ffn + i];
            float y = p->u[q * ffn + i] + m->up_bias[e * ffn + i];
            x = x < OAI_LIMIT ? x : OAI_LIMIT;
            y = y < -OAI_LIMIT ? -OAI_LIMIT : y > OAI_LIMIT ? OAI_LIMIT : y;
            p->g[q * ffn + i] = x / (1.0f + expf(OAI_ALPHA * -x)) * (y + 1.0f);
        }
    }
}

/* gpt-oss: each pair's gate and up biases added (its expert's), then its clamped SwiGLU
   into g: x = min(g, limit), y = clamp(u, -limit, limit), x sigmoid(alpha x) (y + 1) */
static void swiglu_oai(const WfMoE *m, const Parts *p, int64_t pairs, int threads) {
    Step s = {.m = m, .p = p, .n = pairs};
    wf_parallel(pairs * m->ffn >= SPREAD_MIN ? threads : 1, swiglu_oai_share, &s);
}

/* gpt-oss: each pair's down bias added (its expert's) */
static void down_bias(const WfMoE *m, const Parts *p, int64_t pairs) {
    for (int64_t q = 0; q < pairs; q++)
        for (int64_t i = 0; i < m->dim; i++)
            p->d[q * m->dim + i] += m->down_bias[p->expert[q] * m->dim + i];
}

static void combine_share(void *ctx, int t, int threads) {
    const Step *s = ctx;
    const Parts *p = s->p;
    int64_t k = s->m->top_k, dim = s->m->dim, lo, hi;
    wf_share(s->n, t, threads, &lo, &hi);
    for (int64_t r = lo; r < hi; r++)
        for (int64_t i = 0; i < dim; i += 16) {
            v16f acc = splat(p->weights[r * k]) * load16(p->d + p->pair[r * k] * dim + i);
            for (int64_t j = 1; j < k; j++) {
                v16f term = splat(p->weights[r * k + j]) * load16(p->d + p->pair[r * k + j] * dim + i);
                OPAQUE(term);
                acc = acc + term;
            }
            store16(s->out + r * dim + i, acc);
        }
}

/* out[r] = sum over ranks j in order of w[r, j] * d[pair[r, j]]: each product and each add
   rounded on its own. dim % 16 == 0. */
static void combine(const WfMoE *m, int64_t rows, const Parts *p, float *out, int threads) {
    Step s = {.m = m, .p = p, .out = out, .n = rows};
    wf_parallel(rows * m->top_k * m->dim >= SPREAD_MIN ? threads : 1, combine_share, &s);
}

void wf_moe_ffn_with(const WfMoE *m, const float *x, int64_t rows, float *out, int64_t *stats,
                     int threads, float *scratch) {
    Parts p;
    int64_t e = m->num_experts, k = m->top_k, pairs = rows * k, router[2] = {0, rows};
    layout(m, rows, threads, (char *)scratch, &p);
    for (int64_t i = 0; i < (pairs > rows ? pairs : rows); i++) p.ids[i] = i;
    /* logits [R, E]: the router as one float32 expert, each row a batch-invariant product */
    wf_expert_matmul_with(WF_PRODUCTS_FLOAT, GGML_F32, (const uint8_t *)m->router, 0, e, m->dim,
                          x, m->dim, p.ids, router, 1, p.logits, e, threads, p.kernel);
    int gpt_oss = m->router_bias != NULL;
    for (int64_t r = 0; r < rows; r++) {
        float *l = p.logits + r * e;
        if (gpt_oss)
            for (int64_t i = 0; i < e; i++) l[i] = l[i] + m->router_bias[i];
        else
            softmax(l, e);
        choose(l, e, k, p.pair + r * k, p.weights + r * k, gpt_oss);
    }
    int64_t touched = bucket(m, rows, &p);
    experts(&m->gate, m->products, x, m->dim, p.rows, p.starts, e, p.g, threads, p.kernel);
    experts(&m->up, m->products, x, m->dim, p.rows, p.starts, e, p.u, threads, p.kernel);
    if (gpt_oss)
        swiglu_oai(m, &p, pairs, threads);
    else
        silu_mul(p.g, p.u, pairs * m->ffn, threads);
    experts(&m->down, m->products, p.g, m->ffn, p.ids, p.starts, e, p.d, threads, p.kernel);
    if (gpt_oss) down_bias(m, &p, pairs);
    combine(m, rows, &p, out, threads);
    if (stats) {
        stats[0] += 1;
        stats[1] += touched;
        stats[2] += touched * (m->gate.expert_bytes + m->up.expert_bytes + m->down.expert_bytes);
    }
}

static int fits(const WfExperts *w, int64_t n, int64_t k) {
    return wf_expert_supported(w->qtype, k) && w->n == n && w->k == k;
}

int64_t wf_moe_ffn(const WfMoE *m, const float *x, int64_t rows, float *out, int64_t *stats,
                   int threads) {
    if (!fits(&m->gate, m->ffn, m->dim) || !fits(&m->up, m->ffn, m->dim) ||
        !fits(&m->down, m->dim, m->ffn) || !wf_expert_supported(GGML_F32, m->dim) ||
        m->top_k < 1 || m->top_k > m->num_experts || threads < 1)
        return -1;
    if (rows <= 0) return 0;
    int64_t bytes = sizeof(float) * wf_moe_ffn_scratch(m, rows, threads);
    float *scratch = aligned_alloc(64, bytes);
    if (!scratch) return bytes;
    wf_moe_ffn_with(m, x, rows, out, stats, threads, scratch);
    free(scratch);
    return 0;
}
