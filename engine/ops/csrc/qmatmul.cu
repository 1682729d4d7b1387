// Quantized matrix products on the GPU (compiled by CuPy's NVRTC; engine/ops/quant/cuda.py), on
// the kernels' form of engine/ops/quant/formats.py: codes plus a float32 scale and offset per
// group of 16 or 32 weights, w = scale * code + offset (one rounding: the product is
// exact), or f16/bf16 values as they are; for experts on the GPU also float32 values as
// they are (KIND_F32) and MXFP4's E2M1 nibbles through their table (KIND_FP4).
//
// wf_qmatmul: out[M, N] = x[M, K] @ w[N, K]^T. A warp computes one output column (a weight
// row) for TILE_ROWS activation rows; its lanes take the row's 16-weight units in turn
// (unit u: weights lo + [0, 8) and lo + 16 + [0, 8), lo = 32 * (u / 2) + 8 * (u % 2): for
// 4-bit codes the low and the high nibbles of the same 8 bytes), each weight dequantized in
// registers and multiplied into a float32 accumulator per row; the lanes' sums are then
// added by a fixed butterfly. A row's sum takes the same operations in the same order
// whatever rows come with it, and in whichever tile slot: bit for bit batch invariant.
//
// wf_qmatmul_grouped: a mixture of experts' products, every (row, expert) pair of a step in
// one launch. The experts' matrices lie one after another ([E * N, K]); the pairs come
// grouped by expert, and each tile (grid.y) is up to TILE_ROWS pairs of one expert, its
// rows gathered from x by index; a tile of no pairs does nothing. A pair's sum is the one wf_qmatmul gives that row with
// that expert's matrix (the same device function), whatever else is in the step.

#define KIND_Q4 0
#define KIND_Q8 1
#define KIND_F16 2
#define KIND_BF16 3
#define KIND_F32 8  // float32 weights as they are (an MoE file's F32 experts; GPU only)
#define KIND_FP4 9  // MXFP4's E2M1 nibbles (laid out as Q4's) times a block's 2^(e - 128)

__constant__ float FP4_VALUES[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
#define TILE_ROWS 8
#define WARPS 8  // per block: 8 output columns

__device__ __forceinline__ float f16_value(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float bf16_value(unsigned short h) {
    return __uint_as_float(((unsigned int)h) << 16);
}

// 8 codes of one byte each (in a uint2) or 8 nibbles (shift 0: low, 4: high) -> weights
__device__ __forceinline__ void codes8(uint2 b, int shift, unsigned int mask, float s, float o,
                                       float* w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[i] = fmaf(s, (float)((b.x >> (8 * i + shift)) & mask), o);
        w[4 + i] = fmaf(s, (float)((b.y >> (8 * i + shift)) & mask), o);
    }
}

// 8 E2M1 nibbles (shift 0: low, 4: high) of a uint2 -> weights, each exact (s a power of 2)
__device__ __forceinline__ void fp4x8(uint2 b, int shift, float s, float* w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        w[i] = s * FP4_VALUES[(b.x >> (8 * i + shift)) & 0x0fu];
        w[4 + i] = s * FP4_VALUES[(b.y >> (8 * i + shift)) & 0x0fu];
    }
}

// 8 half-precision values (in a uint4) -> weights
__device__ __forceinline__ void halves8(uint4 b, bool bf16, float* w) {
    unsigned int words[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        unsigned short lo = (unsigned short)(words[i] & 0xffffu);
        unsigned short hi = (unsigned short)(words[i] >> 16);
        w[2 * i] = bf16 ? bf16_value(lo) : f16_value(lo);
        w[2 * i + 1] = bf16 ? bf16_value(hi) : f16_value(hi);
    }
}

// The 16 weights of the unit starting at weight lo of a row: w[0..8) are lo + [0, 8),
// w[8..16) are lo + 16 + [0, 8).
__device__ __forceinline__ void unit_weights(int kind, int gshift,
                                             const unsigned char* __restrict__ row,
                                             const float* __restrict__ scale,
                                             const float* __restrict__ offset, int lo,
                                             float* w) {
    if (kind == KIND_Q4) {
        uint2 b = *(const uint2*)(row + 16 * (lo >> 5) + (lo & 31));
        codes8(b, 0, 0x0fu, scale[lo >> gshift], offset[lo >> gshift], w);
        codes8(b, 4, 0x0fu, scale[(lo + 16) >> gshift], offset[(lo + 16) >> gshift], w + 8);
    } else if (kind == KIND_Q8) {
        codes8(*(const uint2*)(row + lo), 0, 0xffu, scale[lo >> gshift], offset[lo >> gshift],
               w);
        codes8(*(const uint2*)(row + lo + 16), 0, 0xffu, scale[(lo + 16) >> gshift],
               offset[(lo + 16) >> gshift], w + 8);
    } else if (kind == KIND_FP4) {
        uint2 b = *(const uint2*)(row + 16 * (lo >> 5) + (lo & 31));
        fp4x8(b, 0, scale[lo >> gshift], w);
        fp4x8(b, 4, scale[(lo + 16) >> gshift], w + 8);
    } else if (kind == KIND_F32) {
        const float4* a = (const float4*)((const float*)row + lo);
        const float4* b = (const float4*)((const float*)row + lo + 16);
        float4 parts[4] = {a[0], a[1], b[0], b[1]};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            w[4 * i] = parts[i].x;
            w[4 * i + 1] = parts[i].y;
            w[4 * i + 2] = parts[i].z;
            w[4 * i + 3] = parts[i].w;
        }
    } else {
        bool bf16 = kind == KIND_BF16;
        halves8(*(const uint4*)(row + 2 * lo), bf16, w);
        halves8(*(const uint4*)(row + 2 * (lo + 16)), bf16, w + 8);
    }
}

// One warp's output column n for up to TILE_ROWS activation rows xs[j] (rows of them):
// the sums, reduced across the warp (every lane holds them), in acc.
__device__ __forceinline__ void column_sums(int kind, int gshift,
                                            const unsigned char* __restrict__ row,
                                            const float* __restrict__ s_row,
                                            const float* __restrict__ o_row,
                                            const float* const* xs, int rows, int k, int lane,
                                            float* acc) {
#pragma unroll
    for (int j = 0; j < TILE_ROWS; ++j) acc[j] = 0.0f;
    for (int u = lane; u < k / 16; u += 32) {
        int lo = 32 * (u >> 1) + 8 * (u & 1);
        float w[16];
        unit_weights(kind, gshift, row, s_row, o_row, lo, w);
#pragma unroll
        for (int j = 0; j < TILE_ROWS; ++j) {
            if (j < rows) {
                const float* xr = xs[j];
                float4 a = *(const float4*)(xr + lo), b = *(const float4*)(xr + lo + 4);
                float4 c = *(const float4*)(xr + lo + 16), d = *(const float4*)(xr + lo + 20);
                float t = acc[j];
                t = fmaf(w[0], a.x, t); t = fmaf(w[1], a.y, t);
                t = fmaf(w[2], a.z, t); t = fmaf(w[3], a.w, t);
                t = fmaf(w[4], b.x, t); t = fmaf(w[5], b.y, t);
                t = fmaf(w[6], b.z, t); t = fmaf(w[7], b.w, t);
                t = fmaf(w[8], c.x, t); t = fmaf(w[9], c.y, t);
                t = fmaf(w[10], c.z, t); t = fmaf(w[11], c.w, t);
                t = fmaf(w[12], d.x, t); t = fmaf(w[13], d.y, t);
                t = fmaf(w[14], d.z, t); t = fmaf(w[15], d.w, t);
                acc[j] = t;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < TILE_ROWS; ++j) {
#pragma unroll
        for (int step = 16; step > 0; step >>= 1) {
            acc[j] += __shfl_xor_sync(0xffffffffu, acc[j], step);  // a + b == b + a: lanes agree
        }
    }
}

extern "C" __global__ void wf_qmatmul(const unsigned char* __restrict__ codes,
                                      const float* __restrict__ scale,
                                      const float* __restrict__ offset, int kind,
                                      int gshift, int num_groups,
                                      const float* __restrict__ x,  // [M, K]
                                      float* __restrict__ out,      // [M, N]
                                      int n_out, int k, long long row_bytes, int m_rows) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * WARPS + warp;
    if (n >= n_out) return;  // the whole warp: n is the same for its lanes
    int m0 = blockIdx.y * TILE_ROWS;
    int rows = min(TILE_ROWS, m_rows - m0);
    const float* xs[TILE_ROWS];
#pragma unroll
    for (int j = 0; j < TILE_ROWS; ++j) xs[j] = x + (long long)(m0 + min(j, rows - 1)) * k;
    float acc[TILE_ROWS];
    column_sums(kind, gshift, codes + (long long)n * row_bytes,
                scale + (long long)n * num_groups, offset + (long long)n * num_groups, xs, rows,
                k, lane, acc);
#pragma unroll
    for (int j = 0; j < TILE_ROWS; ++j) {
        if (lane == j && j < rows) out[(long long)(m0 + j) * n_out + n] = acc[j];
    }
}

extern "C" __global__ void wf_qmatmul_grouped(const unsigned char* __restrict__ codes,
                                              const float* __restrict__ scale,
                                              const float* __restrict__ offset, int kind,
                                              int gshift, int num_groups,
                                              const float* __restrict__ x,  // [R, K]
                                              const long long* __restrict__ pair_rows,  // [P]
                                              const int* __restrict__ tiles,  // [3, T]
                                              int num_tiles,
                                              float* __restrict__ out,  // [P, N]
                                              int n_out, int k, long long row_bytes) {
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int n = blockIdx.x * WARPS + warp;
    if (n >= n_out) return;
    int t = blockIdx.y;  // tiles: each one's expert, first pair and pairs
    int expert = tiles[t], p0 = tiles[num_tiles + t], rows = tiles[2 * num_tiles + t];
    if (rows <= 0) return;  // a tile past the step's own (its grid is fixed by its shape)
    const float* xs[TILE_ROWS];
#pragma unroll
    for (int j = 0; j < TILE_ROWS; ++j) xs[j] = x + pair_rows[p0 + min(j, rows - 1)] * k;
    long long w_row = (long long)expert * n_out + n;  // the expert's row n
    float acc[TILE_ROWS];
    column_sums(kind, gshift, codes + w_row * row_bytes, scale + w_row * num_groups,
                offset + w_row * num_groups, xs, rows, k, lane, acc);
#pragma unroll
    for (int j = 0; j < TILE_ROWS; ++j) {
        if (lane == j && j < rows) out[(long long)(p0 + j) * n_out + n] = acc[j];
    }
}

// out[i, :] = row ids[i] of w as float32 (the embedding's rows of a step's tokens).
extern "C" __global__ void wf_dequant_rows(const unsigned char* __restrict__ codes,
                                           const float* __restrict__ scale,
                                           const float* __restrict__ offset, int kind,
                                           int gshift, int num_groups,
                                           const long long* __restrict__ ids,  // [R]
                                           float* __restrict__ out,            // [R, K]
                                           int k, long long row_bytes) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= k) return;
    long long r = ids[blockIdx.y];
    const unsigned char* row = codes + r * row_bytes;
    float v;
    if (kind == KIND_FP4) {
        unsigned int b = row[16 * (c >> 5) + (c & 15)];
        v = scale[r * num_groups + (c >> gshift)] * FP4_VALUES[(c & 16) ? b >> 4 : b & 0x0fu];
    } else if (kind == KIND_F32) {
        v = ((const float*)row)[c];
    } else if (kind == KIND_Q4 || kind == KIND_Q8) {
        unsigned int code;
        if (kind == KIND_Q4) {
            unsigned int b = row[16 * (c >> 5) + (c & 15)];
            code = (c & 16) ? b >> 4 : b & 0x0fu;
        } else {
            code = row[c];
        }
        long long g = r * num_groups + (c >> gshift);
        v = fmaf(scale[g], (float)code, offset[g]);
    } else {
        unsigned short h = *(const unsigned short*)(row + 2 * c);
        v = kind == KIND_BF16 ? bf16_value(h) : f16_value(h);
    }
    out[(long long)blockIdx.y * k + c] = v;
}
