// A layer's per-row steps on the GPU, float32, each one launch over all rows (CuPy takes
// 5-12 launches for each): RMS norm (of rows, or of each head's run), SiLU(gate) * up, and
// rope on split halves with the step's keys and values written into the pool (a float32
// pool, or a float16 one: each value rounded to nearest even, as NumPy's astype rounds).
// Compiled by CuPy's NVRTC (engine/ops/gpu_ops.py). A row is computed by the same threads
// in the same order whatever the row count (batch invariant).

#define NORM_THREADS 256  // the launch's block size: the reduction tree below assumes it

// o = (xr / sqrt(mean(xr^2) + eps)) * w over dim values, by the block's NORM_THREADS
// threads; o may be xr (every value is read into the sum before any is written)
__device__ void norm_run(const float* xr, const float* __restrict__ w, float eps, int dim,
                         float* o) {
    __shared__ float part[NORM_THREADS];
    float acc = 0.0f;
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) acc = fmaf(xr[i], xr[i], acc);
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int s = NORM_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) part[threadIdx.x] += part[threadIdx.x + s];
        __syncthreads();
    }
    float scale = 1.0f / sqrtf(part[0] / (float)dim + eps);
    for (int i = threadIdx.x; i < dim; i += NORM_THREADS) o[i] = (xr[i] * scale) * w[i];
}

// out[r] = (x[r] / sqrt(mean(x[r]^2) + eps)) * w; a block per row
extern "C" __global__ void wf_rms_norm(const float* __restrict__ x,
                                       const float* __restrict__ w, float eps, int dim,
                                       float* __restrict__ out) {
    norm_run(x + (long long)blockIdx.x * dim, w, eps, dim, out + (long long)blockIdx.x * dim);
}

// in place: each head's d values at x[r * stride + col0 + h * d] RMS-normed with w [d]
// (Qwen 3's q and k norms); a block per (row, head), rows * heads blocks
extern "C" __global__ void wf_head_rms_norm(float* x, long long stride, long long col0,
                                            int heads, int d, const float* __restrict__ w,
                                            float eps) {
    long long r = blockIdx.x / heads;
    float* run = x + r * stride + col0 + (long long)(blockIdx.x % heads) * d;
    norm_run(run, w, eps, d, run);
}

// out[r] = silu(gate_up[r, :ffn]) * gate_up[r, ffn:]
extern "C" __global__ void wf_silu_mul(const float* __restrict__ gate_up, long long rows,
                                       int ffn, float* __restrict__ out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * ffn) return;
    long long r = i / ffn;
    int j = (int)(i % ffn);
    float g = gate_up[r * 2 * ffn + j];
    out[i] = g / (1.0f + expf(-g)) * gate_up[r * 2 * ffn + ffn + j];
}

__device__ __forceinline__ void store(float* p, float v) { *p = v; }

__device__ __forceinline__ void store(unsigned short* p, float v) {  // float16 bits
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    *p = h;
}

template <typename KV>
__device__ void rope_into_pool(const float* __restrict__ qkv, long long rows_n, int heads,
                               int hkv, int d, const float* __restrict__ cos_t,
                               const float* __restrict__ sin_t,
                               const long long* __restrict__ pos,
                               const long long* __restrict__ rows, long long shift,
                               float* __restrict__ q_out, KV* __restrict__ k_pool,
                               KV* __restrict__ v_pool) {
    int half = d / 2, slots = heads + 2 * hkv;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows_n * slots * half) return;
    long long n = i / ((long long)slots * half);
    int slot = (int)((i / half) % slots), j = (int)(i % half);
    const float* x = qkv + n * (long long)slots * d + (long long)slot * d;
    if (slot >= heads + hkv) {  // a value head: copied as it is
        KV* y = v_pool + (rows[n * hkv + slot - heads - hkv] + shift) * d;
        store(y + j, x[j]);
        store(y + half + j, x[half + j]);
        return;
    }
    float c = cos_t[pos[n] * half + j], s = sin_t[pos[n] * half + j];
    float x1 = x[j], x2 = x[half + j];
    float y1 = x1 * c - x2 * s, y2 = x1 * s + x2 * c;
    if (slot < heads) {
        float* y = q_out + (n * heads + slot) * d;
        y[j] = y1;
        y[half + j] = y2;
    } else {
        KV* y = k_pool + (rows[n * hkv + slot - heads] + shift) * d;
        store(y + j, y1);
        store(y + half + j, y2);
    }
}

#define ROPE_INTO_POOL(name, KV)                                                            \
    extern "C" __global__ void name(const float* __restrict__ qkv, long long rows_n,         \
                                    int heads, int hkv, int d,                               \
                                    const float* __restrict__ cos_t,                         \
                                    const float* __restrict__ sin_t,                         \
                                    const long long* __restrict__ pos,                       \
                                    const long long* __restrict__ rows, long long shift,     \
                                    float* __restrict__ q_out, KV* __restrict__ k_pool,      \
                                    KV* __restrict__ v_pool) {                               \
        rope_into_pool<KV>(qkv, rows_n, heads, hkv, d, cos_t, sin_t, pos, rows, shift, q_out, \
                           k_pool, v_pool);                                                  \
    }

// A step's qkv [N, C] (C = H * D + 2 * Hkv * D) split in one launch: q rotated into q_out
// [N, H, D]; k rotated and v as it is written into one layer of the pool at the rows
// `rows` [N * Hkv] (KVPool.flat_rows: row n's KV head kh goes to rows[n * Hkv + kh] + shift
// of the pool seen as [positions, D]). A thread per (n, head slot, pair); the slots are
// H query heads, then Hkv key heads, then Hkv value heads. Rope on split halves, as
// elementwise.c's wf_rope: [x1 * cos - x2 * sin, x1 * sin + x2 * cos]; tables [context, D/2].
ROPE_INTO_POOL(wf_rope_into_pool, float)
ROPE_INTO_POOL(wf_rope_into_pool_f16, unsigned short)  // a float16 pool
