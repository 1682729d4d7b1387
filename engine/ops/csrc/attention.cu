// Causal attention over the paged KV pool on the GPU, float32: every row of a step (decode
// rows and prefill chunks alike) in one launch per layer (engine/ops/gpu_ops.py). The pool
// holds float32 (wf_paged_attention), float16 (wf_paged_attention_f16) or q8_0 blocks' bytes
// (wf_paged_attention_q8: a row of D values is D / 32 blocks of 34 bytes, a float16 d and 32
// int8 codes, kv_dtypes.py), each value widened as it is loaded (d * q: exact in float32);
// the queries and the arithmetic are float32. A pool row is `row` elements (D, or
// D / 32 * 34 bytes).
//
// A block per (row, query head), SPLIT warps in it: warp w takes the row's keys in runs of
// KEYS, runs w, w + SPLIT, ... (so a long context is read by SPLIT warps at once, not one).
// In a warp lane l holds dims l, l + 32, ... of the query and of the output; each run's dot
// products are reduced across lanes by a fixed butterfly (every lane has the same scores)
// and go through an online softmax (running max and sum). The warps' partial results are
// then merged by warp 0 in warp order. What a row gets depends on its query, its keys and
// its key count alone, not on the rows launched with it (batch invariant).
//
// gpt-oss's limits: with window > 0 a row sees its last `window` keys only (the keys before
// are skipped, never read); with has_sinks each head's logit sinks[h] joins the softmax as
// one more score with no value (its maximum, and the denominator's first term). Without
// them (window 0, has_sinks 0) every operation is the one of the kernel without them.
//
// Shapes: R rows, H heads, Hkv KV heads, D head_dim (a multiple of 32, at most 128), B block
// size; k, v: one layer [num_blocks, Hkv, B, row]; tables [R, width] int32; lengths [R] int32.

#define MAX_DIMS_PER_LANE 4
#define KEYS 4
#define SPLIT 8  // warps per (row, head); the launch's block is 32 * SPLIT threads

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int step = 16; step > 0; step >>= 1) v += __shfl_xor_sync(0xffffffffu, v, step);
    return v;
}

__device__ __forceinline__ float half_value(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// value i of a pool row
__device__ __forceinline__ float load(const float* row, int i) { return row[i]; }

__device__ __forceinline__ float load(const unsigned short* row, int i) {  // float16 bits
    return half_value(row[i]);
}

__device__ __forceinline__ float load(const unsigned char* row, int i) {  // q8_0 blocks
    const unsigned char* block = row + 34 * (i >> 5);  // 2-byte aligned at best: bytes
    float d = half_value((unsigned short)(block[0] | (block[1] << 8)));
    return d * (float)(signed char)block[2 + (i & 31)];
}

template <typename KV>
__device__ void paged_attention(const float* __restrict__ q,  // [R, H, D]
                                const KV* __restrict__ k, const KV* __restrict__ v,
                                const int* __restrict__ tables, int width,
                                const int* __restrict__ lengths, float scale,
                                float* __restrict__ out,  // [R, H, D]
                                int heads, int hkv, int d, int bs, int row, int window,
                                const float* __restrict__ sinks,  // [H]
                                int has_sinks) {
    __shared__ float part_top[SPLIT], part_total[SPLIT];
    __shared__ float part_acc[SPLIT][32 * MAX_DIMS_PER_LANE];
    int task = blockIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int r = task / heads, h = task % heads, kh = h / (heads / hkv);
    int dpl = d >> 5;  // dims per lane
    const float* qr = q + (long long)task * d;
    float qv[MAX_DIMS_PER_LANE], acc[MAX_DIMS_PER_LANE];
#pragma unroll
    for (int i = 0; i < MAX_DIMS_PER_LANE; ++i) {
        qv[i] = i < dpl ? qr[lane + 32 * i] * scale : 0.0f;
        acc[i] = 0.0f;
    }
    const int* table = tables + (long long)r * width;
    int n = lengths[r];
    int lo = window > 0 && window < n ? n - window : 0;  // the first key the row sees
    const float neg_inf = -__int_as_float(0x7f800000);
    float top = neg_inf, total = 0.0f;
    for (int t0 = lo + warp * KEYS; t0 < n; t0 += SPLIT * KEYS) {
        const KV* kt[KEYS];
        const KV* vt[KEYS];
        float p[KEYS];
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            int t = min(t0 + j, n - 1);  // past the end: the last key again, weighed 0 below
            long long at = (((long long)table[t / bs] * hkv + kh) * bs + t % bs) * row;
            kt[j] = k + at;
            vt[j] = v + at;
            float s = 0.0f;
#pragma unroll
            for (int i = 0; i < MAX_DIMS_PER_LANE; ++i) {
                if (i < dpl) s = fmaf(qv[i], load(kt[j], lane + 32 * i), s);
            }
            p[j] = warp_sum(s);
        }
        float m = top;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            if (t0 + j < n) m = fmaxf(m, p[j]);
        }
        float corr = expf(top - m);  // 0 on the first keys (top = -inf)
        total *= corr;
#pragma unroll
        for (int j = 0; j < KEYS; ++j) {
            p[j] = t0 + j < n ? expf(p[j] - m) : 0.0f;
            total += p[j];
        }
#pragma unroll
        for (int i = 0; i < MAX_DIMS_PER_LANE; ++i) {
            if (i < dpl) {
                float a = acc[i] * corr;
#pragma unroll
                for (int j = 0; j < KEYS; ++j) a = fmaf(p[j], load(vt[j], lane + 32 * i), a);
                acc[i] = a;
            }
        }
        top = m;
    }
    if (lane == 0) {
        part_top[warp] = top;
        part_total[warp] = total;
    }
#pragma unroll
    for (int i = 0; i < MAX_DIMS_PER_LANE; ++i) part_acc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    if (warp != 0) return;
    float m = part_top[0];
    for (int w = 1; w < SPLIT; ++w) m = fmaxf(m, part_top[w]);
    float sum = 0.0f, merged[MAX_DIMS_PER_LANE] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (has_sinks) {  // the sink first: a score with no value
        m = fmaxf(m, sinks[h]);
        sum = expf(sinks[h] - m);
    }
    for (int w = 0; w < SPLIT; ++w) {  // in warp order; a warp that saw no key weighs 0
        float f = part_top[w] == neg_inf ? 0.0f : expf(part_top[w] - m);
        sum = fmaf(part_total[w], f, sum);
#pragma unroll
        for (int i = 0; i < MAX_DIMS_PER_LANE; ++i) {
            merged[i] = fmaf(part_acc[w][lane + 32 * i], f, merged[i]);
        }
    }
    float inv = 1.0f / sum;
    float* o = out + (long long)task * d;
#pragma unroll
    for (int i = 0; i < MAX_DIMS_PER_LANE; ++i) {
        if (i < dpl) o[lane + 32 * i] = merged[i] * inv;
    }
}

#define PAGED_ATTENTION(name, KV)                                                              \
    extern "C" __global__ void name(const float* __restrict__ q, const KV* __restrict__ k,      \
                                    const KV* __restrict__ v, const int* __restrict__ tables,   \
                                    int width, const int* __restrict__ lengths, float scale,    \
                                    float* __restrict__ out, int heads, int hkv, int d, int bs, \
                                    int row, int window, const float* __restrict__ sinks,       \
                                    int has_sinks) {                                            \
        paged_attention<KV>(q, k, v, tables, width, lengths, scale, out, heads, hkv, d, bs, row, \
                            window, sinks, has_sinks);                                          \
    }

PAGED_ATTENTION(wf_paged_attention, float)
PAGED_ATTENTION(wf_paged_attention_f16, unsigned short)  // a float16 pool
PAGED_ATTENTION(wf_paged_attention_q8, unsigned char)    // a q8_0 pool's bytes
