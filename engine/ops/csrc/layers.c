/* The decoder layers of a step in one call: each layer's norms, products, rope, KV writes,
   paged attention and residual adds, through the same kernels engine/forward.py calls one
   by one from Python (wf_rms_norm, wf_matmul, wf_head_rms_norm, wf_rope, wf_paged_rows,
   wf_silu_mul) in the same order on the same values: the same bits. What it saves is the
   ~14 Python calls per layer between them (about 2 ms of a 10 ms single-row step on 2
   cores). q's width, heads * head_dim, need not be dim (Qwen 3).

   For quantized weights with every row in the kernels (engine/ops/native_layers.py decides).
   Shapes: x [R, dim]; the pool's block groups (engine/kv/block_groups.py), G of them:
   k_groups[g], v_groups[g] [group's layers, its blocks, Hkv, 16, D] (float32, float16, or
   D / 32 q8_0 blocks, as WfShape.kv_kind says); kv_layout [layers, 2]: each layer's group
   and where its keys start in the group's arrays (items); kv_rows [G, R * Hkv]
   (KVPool.flat_rows: the row of D floats in the group's first layer where each (row, KV
   head) goes); tables [G, R, max_blocks] int32; lengths [R] int32; pos [R] int64. */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kv_q8.h"
#include "moe.h"

typedef struct {
    int kind, gshift;
    const uint8_t *codes;
    const void *scale, *offset; /* float32, or float16 for the kinds Q4H and Q8H */
    int64_t n, k;               /* [n, k] */
} WfMatrix;

typedef struct {
    const float *attn_norm, *ffn_norm;
    WfMatrix qkv, wo, gate_up, down;
    const float *qkv_bias; /* [q_dim + 2 * kv_dim] added to the qkv product (Qwen 2), or NULL */
    const float *q_norm, *k_norm; /* [head_dim] per-head q and k norms (Qwen 3), or NULL */
    const WfMoE *moe; /* the experts in place of gate_up and down (unread then), or NULL */
    /* q, k, v and the output matrix read in the file's blocks by the expert kernels (one
       expert each; qkv and wo unread then), products as WF_PRODUCTS_*, where in_place */
    WfExperts attn[4];
    int attn_in_place, attn_products;
    const float *o_bias; /* [dim] added to the output product (gpt-oss), or NULL */
    const float *sinks;  /* [heads] sink logits in the softmax's denominators (gpt-oss), or NULL */
    int64_t window;      /* the layer attends to the last `window` positions (0: all) */
} WfLayer;

typedef struct {
    int64_t dim, heads, kv_heads, head_dim, ffn_dim;
    float eps, scale; /* scale: head_dim^-0.5 */
    int64_t *moe_stats; /* wf_moe_ffn's counts, summed over the layers, or NULL */
    int kv_kind; /* the pool holds 0: float32; 1: float16 (the keys and values rounded to
                    nearest even as they are written, as NumPy's cast); 2: q8_0 blocks of 32
                    values (kv_q8.h), an item each */
} WfShape;

void wf_rms_norm(const float *x, const float *w, float eps, int64_t rows, int64_t dim,
                 float *out, int threads);
void wf_head_rms_norm(float *x, int64_t stride, int64_t col0, int64_t rows, int64_t heads,
                      int64_t d, const float *w, float eps, int threads);
void wf_rope(const float *src, int64_t src_stride, int64_t col0, int64_t rows, int64_t heads,
             int64_t d, const float *cos_t, const float *sin_t, const int64_t *pos, float *dst,
             int threads);
void wf_silu_mul(const float *gate_up, int64_t rows, int64_t ffn, float *out, int threads);
void wf_add(const float *x, const float *y, int64_t rows, int64_t cols, float *out,
            int threads);
int64_t wf_matmul_scratch(int kind, int gshift, int64_t k, int64_t m_rows, int num_threads);
void wf_matmul_with(int kind, int gshift, const uint8_t *codes, const void *scale,
                    const void *offset, int64_t n_rows, int64_t k, const float *x,
                    int64_t m_rows, float *out, int64_t ldo, int num_threads, float *scratch);
int64_t wf_paged_rows_scratch(const int32_t *lengths, int64_t num_rows, int64_t num_heads,
                              int64_t num_kv_heads, int64_t dim, int num_threads);
void wf_paged_rows_with(const float *q, const float *k, const float *v, const int32_t *tables,
                        int64_t max_blocks, const int32_t *lengths, int64_t num_rows,
                        int64_t num_heads, int64_t num_kv_heads, int64_t dim, float scale,
                        float *out, int num_threads, float *scratch, int64_t window,
                        const float *sinks);
void wf_paged_rows_with_f16(const float *q, const _Float16 *k, const _Float16 *v,
                            const int32_t *tables, int64_t max_blocks, const int32_t *lengths,
                            int64_t num_rows, int64_t num_heads, int64_t num_kv_heads,
                            int64_t dim, float scale, float *out, int num_threads,
                            float *scratch, int64_t window, const float *sinks);
void wf_paged_rows_with_q8(const float *q, const wf_q8 *k, const wf_q8 *v,
                           const int32_t *tables, int64_t max_blocks, const int32_t *lengths,
                           int64_t num_rows, int64_t num_heads, int64_t num_kv_heads,
                           int64_t dim, float scale, float *out, int num_threads,
                           float *scratch, int64_t window, const float *sinks);

/* Items of the pool one head's d values take. */
static int64_t row_items(const WfShape *s, int64_t d) {
    return wf_kv_row_items(s->kv_kind, d);
}

/* A layer's attention over its keys and values, `shift` items into its group's arrays (the
   kind s says), with its window and sinks */
static void attend(const WfShape *s, const WfLayer *l, const float *q, const void *k_pool,
                   const void *v_pool, int64_t shift, const int32_t *tables,
                   int64_t max_blocks, const int32_t *lengths, int64_t rows, float *att,
                   int threads, float *scratch) {
    if (s->kv_kind == 1)
        wf_paged_rows_with_f16(q, (const _Float16 *)k_pool + shift,
                               (const _Float16 *)v_pool + shift, tables, max_blocks, lengths,
                               rows, s->heads, s->kv_heads, s->head_dim, s->scale, att,
                               threads, scratch, l->window, l->sinks);
    else if (s->kv_kind == 2)
        wf_paged_rows_with_q8(q, (const wf_q8 *)k_pool + shift, (const wf_q8 *)v_pool + shift,
                              tables, max_blocks, lengths, rows, s->heads, s->kv_heads,
                              s->head_dim, s->scale, att, threads, scratch, l->window,
                              l->sinks);
    else
        wf_paged_rows_with(q, (const float *)k_pool + shift, (const float *)v_pool + shift,
                           tables, max_blocks, lengths, rows, s->heads, s->kv_heads,
                           s->head_dim, s->scale, att, threads, scratch, l->window, l->sinks);
}

/* out [rows, m->n] = x [rows, m->k] @ m.T */
static void product(const WfMatrix *m, const float *x, int64_t rows, float *out, int threads,
                    float *scratch) {
    wf_matmul_with(m->kind, m->gshift, m->codes, m->scale, m->offset, m->n, m->k, x, rows, out,
                   m->n, threads, scratch);
}

/* out [rows, m->n] (rows out_stride apart) = x [rows, m->k] @ m.T, every row one pair of the
   one expert (ids: 0, 1, ..., rows - 1; starts: 0, rows) */
static void in_place(const WfExperts *m, int products, const float *x, int64_t rows,
                     const int64_t *ids, float *out, int64_t out_stride, int threads,
                     float *scratch) {
    int64_t starts[2] = {0, rows};
    wf_expert_matmul_with(products, m->qtype, m->data, m->expert_bytes, m->n, m->k, x, m->k,
                          ids, starts, 1, out, out_stride, threads, scratch);
}

/* The layer's qkv [rows, qkv_cols] and wo products, in place or decoded as it holds them */
static void attn_product(const WfLayer *l, int which, const float *x, int64_t rows,
                         const int64_t *ids, float *out, int64_t out_cols, int threads,
                         float *scratch) {
    if (!l->attn_in_place) {
        product(which ? &l->wo : &l->qkv, x, rows, out, threads, scratch);
        return;
    }
    int64_t col = 0;
    for (int j = which ? 3 : 0; j < (which ? 4 : 3); j++) {
        in_place(l->attn + j, l->attn_products, x, rows, ids, out + col, out_cols, threads,
                 scratch);
        col += l->attn[j].n;
    }
}

static void add_into(float *x, const float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = x[i] + y[i];
}

/* 0, or the bytes of scratch it could not allocate (nothing done): all of it, the
   products' and attention's too, is taken before the first layer. */
int64_t wf_layers(const WfLayer *layers, int64_t num_layers, const WfShape *s, float *x,
                  int64_t rows, const int64_t *pos, const float *cos_t, const float *sin_t,
                  void *const *k_groups, void *const *v_groups, const int64_t *kv_layout,
                  const int64_t *kv_rows, const int32_t *tables, int64_t max_blocks,
                  const int32_t *lengths, int threads) {
    int64_t d = s->head_dim, q_dim = s->heads * d, kv_dim = s->kv_heads * d;
    int64_t qkv_cols = q_dim + 2 * kv_dim, wide = s->dim > q_dim ? s->dim : q_dim;
    /* scratch: h [R, dim], qkv [R, qkv_cols], q and attention out [R, q_dim], k [R, kv_dim],
       gate_up [R, 2 * ffn], act [R, ffn], o [R, wide] */
    int64_t floats = rows * (s->dim + qkv_cols + 2 * q_dim + kv_dim + 3 * s->ffn_dim + wide);
    int64_t kernels = 0; /* the most any product takes */
    for (int64_t i = 0; i < num_layers; i++) {
        const WfLayer *l = layers + i;
        const WfMatrix *ms[4] = {&l->qkv, &l->wo, &l->gate_up, &l->down};
        for (int j = l->attn_in_place ? 2 : 0; j < (l->moe ? 2 : 4); j++) {
            int64_t need = wf_matmul_scratch(ms[j]->kind, ms[j]->gshift, ms[j]->k, rows, threads);
            kernels = need > kernels ? need : kernels;
        }
        for (int j = 0; l->attn_in_place && j < 4; j++) {
            int64_t need = wf_expert_matmul_scratch(1, rows, l->attn[j].k, threads);
            kernels = need > kernels ? need : kernels;
        }
        if (l->moe) {
            int64_t need = wf_moe_ffn_scratch(l->moe, rows, threads);
            kernels = need > kernels ? need : kernels;
        }
    }
    int64_t attention = wf_paged_rows_scratch(lengths, rows, s->heads, s->kv_heads, d, threads);
    kernels = kernels > attention ? kernels : attention; /* one at a time */
    floats += 2 * rows;               /* ids: rows int64 */
    floats = (floats + 15) / 16 * 16; /* the kernels' room starts 64-byte aligned */
    int64_t bytes = sizeof(float) * (floats + (kernels + 15) / 16 * 16);
    float *h = aligned_alloc(64, bytes);
    if (!h) return bytes;
    float *scratch = h + floats;
    float *qkv = h + rows * s->dim, *q = qkv + rows * qkv_cols, *att = q + rows * q_dim;
    float *k = att + rows * q_dim, *gate_up = k + rows * kv_dim;
    float *act = gate_up + rows * 2 * s->ffn_dim, *o = act + rows * s->ffn_dim;
    int64_t *ids = (int64_t *)(o + rows * wide);
    for (int64_t r = 0; r < rows; r++) ids[r] = r;
    for (int64_t i = 0; i < num_layers; i++) {
        const WfLayer *l = layers + i;
        wf_rms_norm(x, l->attn_norm, s->eps, rows, s->dim, h, threads);
        attn_product(l, 0, h, rows, ids, qkv, qkv_cols, threads, scratch);
        if (l->qkv_bias) /* one add per value, as forward.py's qkv += bqkv */
            for (int64_t r = 0; r < rows; r++)
                for (int64_t j = 0; j < qkv_cols; j++) qkv[r * qkv_cols + j] += l->qkv_bias[j];
        if (l->q_norm) { /* the calls forward.py makes, in its order */
            wf_head_rms_norm(qkv, qkv_cols, 0, rows, s->heads, d, l->q_norm, s->eps, threads);
            wf_head_rms_norm(qkv, qkv_cols, q_dim, rows, s->kv_heads, d, l->k_norm, s->eps,
                             threads);
        }
        wf_rope(qkv, qkv_cols, 0, rows, s->heads, d, cos_t, sin_t, pos, q, threads);
        wf_rope(qkv, qkv_cols, q_dim, rows, s->kv_heads, d, cos_t, sin_t, pos, k, threads);
        int64_t g = kv_layout[2 * i], shift = kv_layout[2 * i + 1];
        void *k_pool = k_groups[g], *v_pool = v_groups[g];
        const int64_t *at_rows = kv_rows + g * rows * s->kv_heads;
        for (int64_t r = 0; r < rows; r++) /* this step's keys and values first */
            for (int64_t j = 0; j < s->kv_heads; j++) {
                int64_t at = shift + at_rows[r * s->kv_heads + j] * row_items(s, d);
                wf_kv_put(s->kv_kind, k_pool, at, k + (r * s->kv_heads + j) * d, d);
                const float *v = qkv + r * qkv_cols + q_dim + kv_dim + j * d;
                wf_kv_put(s->kv_kind, v_pool, at, v, d);
            }
        attend(s, l, q, k_pool, v_pool, shift, tables + g * rows * max_blocks, max_blocks,
               lengths, rows, att, threads, scratch);
        attn_product(l, 1, att, rows, ids, o, s->dim, threads, scratch);
        if (l->o_bias) /* as forward.py's o += bo */
            for (int64_t r = 0; r < rows; r++) add_into(o + r * s->dim, l->o_bias, s->dim);
        wf_add(x, o, rows, s->dim, x, threads);
        wf_rms_norm(x, l->ffn_norm, s->eps, rows, s->dim, h, threads);
        if (l->moe) {
            wf_moe_ffn_with(l->moe, h, rows, o, s->moe_stats, threads, scratch);
        } else {
            product(&l->gate_up, h, rows, gate_up, threads, scratch);
            wf_silu_mul(gate_up, rows, s->ffn_dim, act, threads);
            product(&l->down, act, rows, o, threads, scratch);
        }
        wf_add(x, o, rows, s->dim, x, threads);
    }
    free(h);
    return 0;
}
