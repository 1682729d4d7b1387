/* Mixture-of-experts FFN: the expert tensors read in place from their GGUF blocks
   (experts.c: grouped products; moe.c: the whole FFN of a step). Shapes: E experts, each
   [n, k]; a pair is (activation row, expert) and the pairs are bucketed by expert. */
#ifndef WARMFLEET_MOE_H
#define WARMFLEET_MOE_H

#include <stdint.h>

/* Or'd into a qtype: the matrix's rows repacked by wf_int_pack (its products in integers) */
#define WF_PACKED 0x10000

typedef struct {
    int qtype;           /* GGML type id: F32, F16, BF16, Q4_0..Q8_0, Q4_K, Q5_K, Q6_K, MXFP4;
                            | WF_PACKED where wf_int_pack repacked data */
    const uint8_t *data; /* [E, n, row bytes]: the file's blocks, or as repacked */
    int64_t expert_bytes, n, k;
} WfExperts;

/* How block-quantized weights multiply: in integers with each activation row quantized to
   int8 (llama.cpp's way), or each weight dequantized to float32 (WARMFLEET_EXPERT_PRODUCTS=
   float). F32, F16 and BF16 weights always multiply in float32. */
enum { WF_PRODUCTS_INTEGER = 0, WF_PRODUCTS_FLOAT = 1 };

typedef struct {
    const float *router; /* [E, dim] float32 (ffn_gate_inp) */
    int64_t num_experts, top_k, dim, ffn;
    WfExperts gate, up, down; /* gate/up [E, ffn, dim], down [E, dim, ffn] */
    int products;             /* WF_PRODUCTS_* of the three expert tensors */
    /* gpt-oss (NULL elsewhere): the router's bias [E], the gate's and up's [E, ffn], the
       down's [E, dim]; with them the top k go by raw logit, weighted by the softmax of
       those k, and the activation is gpt-oss's clamped SwiGLU */
    const float *router_bias, *gate_bias, *up_bias, *down_bias;
} WfMoE;

/* Whether this build repacks matrices of `qtype` 16 rows to a group for its integer
   products (int_packed.c: AVX-512 VNNI's Q8_0 and MXFP4). */
int wf_int_packs(int qtype);

/* rows [rows, k] of `qtype` in the file's blocks at w -> `to` (as many bytes), 16 rows to a
   group; 0, or -1 where this build does not pack them (rows % 16, the type). */
int wf_int_pack(int qtype, const uint8_t *w, int64_t rows, int64_t k, uint8_t *to, int threads);

/* Whether rows of k weights of this type are read (k whole blocks, k % 32 == 0). */
int wf_expert_supported(int qtype, int64_t k);

/* Floats of scratch wf_expert_matmul_with takes for activation rows of k below x_rows
   (64-byte aligned; a multiple of 16). */
int64_t wf_expert_matmul_scratch(int64_t num_experts, int64_t x_rows, int64_t k, int threads);

/* pairs p in [starts[e], starts[e+1]) go through expert e's [n, k] matrix, products as
   `products` (WF_PRODUCTS_*) says: out[p * out_stride + j] = sum_i x[rows[p] * x_stride + i]
   * W_e[j, i]. Each output a function of its activation row and weight row alone. */
void wf_expert_matmul_with(int products, int qtype, const uint8_t *w, int64_t expert_bytes,
                           int64_t n, int64_t k, const float *x, int64_t x_stride,
                           const int64_t *rows, const int64_t *starts, int64_t num_experts,
                           float *out, int64_t out_stride, int threads, float *scratch);

/* The same with scratch of its own: 0, the bytes it could not allocate, or -1 for a type or
   k it does not read (nothing done in either case). */
int64_t wf_expert_matmul_as(int products, int qtype, const uint8_t *w, int64_t expert_bytes,
                            int64_t n, int64_t k, const float *x, int64_t x_stride,
                            const int64_t *rows, const int64_t *starts, int64_t num_experts,
                            float *out, int64_t out_stride, int threads);

/* wf_expert_matmul_as with WF_PRODUCTS_INTEGER. */
int64_t wf_expert_matmul(int qtype, const uint8_t *w, int64_t expert_bytes, int64_t n,
                         int64_t k, const float *x, int64_t x_stride, const int64_t *rows,
                         const int64_t *starts, int64_t num_experts, float *out,
                         int64_t out_stride, int threads);

/* Floats of scratch wf_moe_ffn_with takes for `rows` rows (64-byte aligned; a multiple of
   16), wf_expert_matmul_with's included. */
int64_t wf_moe_ffn_scratch(const WfMoE *m, int64_t rows, int threads);

/* out [rows, dim] = the MoE FFN of x [rows, dim] (not added to anything; out may be x: it is
   written after x's last read); stats, when not NULL: stats[0] += 1, stats[1] += distinct
   experts touched, stats[2] += expert bytes read. */
void wf_moe_ffn_with(const WfMoE *m, const float *x, int64_t rows, float *out, int64_t *stats,
                     int threads, float *scratch);

/* The same with scratch of its own: 0, the bytes it could not allocate, or -1 for weights it
   does not read (nothing done in either case). */
int64_t wf_moe_ffn(const WfMoE *m, const float *x, int64_t rows, float *out, int64_t *stats,
                   int threads);

#endif
