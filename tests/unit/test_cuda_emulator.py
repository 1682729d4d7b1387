"""The CPU stand-in for CuPy (tests/cuda_emu) that runs the GPU tests where no GPU is found:
its threads meet at barriers and exchange through shuffles as a GPU's do, and what a GPU
or CuPy would refuse it refuses, so a GPU test that passes on it fails for a real reason."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from tests.cuda_emu import build, cupy_module

cp: Any = cupy_module.module()
SOURCE = r"""
// out[b] = the sum of x[b * 256 .. b * 256 + 256): each warp's sum by a butterfly of
// shuffles, the warps' sums through shared memory after a barrier
extern "C" __global__ void block_sums(const float* x, float* out) {
    __shared__ float warps[8];
    float v = x[blockIdx.x * 256 + threadIdx.x];
    for (int step = 16; step > 0; step >>= 1) v += __shfl_xor_sync(0xffffffffu, v, step);
    if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < 8; ++w) total += warps[w];
        out[blockIdx.x] = total;
    }
}

extern "C" __global__ void a_barrier_beside_a_shuffle(float* out) {
    float v = 1.0f;
    if (threadIdx.x == 0) __syncthreads();
    else v = __shfl_xor_sync(0xffffffffu, v, 1);
    out[threadIdx.x] = v;
}

extern "C" __global__ void lanes_at_two_shuffles(float* out) {
    float v = 1.0f;
    if (threadIdx.x & 1) v = __shfl_xor_sync(0xffffffffu, v, 1);
    v = __shfl_xor_sync(0xffffffffu, v, 2);
    out[threadIdx.x] = v;
}

extern "C" __global__ void scale(float* x, int n, float by, long long offset) {
    int i = blockIdx.x * blockDim.x + threadIdx.x + (int)offset;
    if (i < n) x[i] *= by;
}
"""


def kernel(name: str) -> Any:
    return cp.RawModule(code=SOURCE, name="emulator_cases.cu").get_function(name)


def test_threads_meet_at_barriers_and_exchange_through_shuffles() -> None:
    x = np.random.default_rng(0).standard_normal(3 * 256).astype(np.float32)
    out = cp.empty(3, dtype=np.float32)
    kernel("block_sums")((3,), (256,), (cp.asarray(x), out))
    np.testing.assert_allclose(out.get(), x.reshape(3, 256).sum(1), rtol=1e-5, atol=1e-5)


def test_what_would_hang_a_gpu_is_an_error_and_the_next_launch_runs() -> None:
    out = cp.zeros(32, dtype=np.float32)
    with pytest.raises(RuntimeError, match="deadlock"):
        kernel("a_barrier_beside_a_shuffle")((1,), (32,), (out,))
    with pytest.raises(RuntimeError, match="different shuffles"):
        kernel("lanes_at_two_shuffles")((1,), (32,), (out,))
    x = cp.asarray(np.ones(40, dtype=np.float32))
    kernel("scale")((2,), (32,), (x, np.int32(40), np.float32(3), np.int64(0)))
    assert x.get().tolist() == [3.0] * 40


def test_launches_past_cudas_limits_are_refused() -> None:
    x = cp.zeros(4, dtype=np.float32)
    args = (x, np.int32(4), np.float32(2), np.int64(0))
    with pytest.raises(RuntimeError, match="at most 65535"):
        kernel("scale")((1, 65536), (32,), args)
    with pytest.raises(RuntimeError, match="1 to 1024"):
        kernel("scale")((1,), (2048,), args)


def test_arguments_of_another_type_than_the_kernels_are_refused() -> None:
    x = cp.zeros(8, dtype=np.float32)
    scale = kernel("scale")
    with pytest.raises(TypeError, match=r"argument 1 \(int\).*int64"):
        scale((1,), (8,), (x, np.int64(8), np.float32(2), np.int64(0)))
    with pytest.raises(TypeError, match=r"argument 3 \(long long\): a float \(float64\)"):
        scale((1,), (8,), (x, np.int32(8), np.float32(2), 0.0))
    with pytest.raises(TypeError, match="not a device array"):
        scale((1,), (8,), (np.zeros(8, np.float32), np.int32(8), np.float32(2), np.int64(0)))
    with pytest.raises(ValueError, match="not contiguous"):
        scale((1,), (8,), (cp.zeros(16, np.float32)[::2], np.int32(8), np.float32(2), 0))
    with pytest.raises(TypeError, match="takes 4 arguments"):
        scale((1,), (8,), (x,))
    with pytest.raises(RuntimeError, match="named symbol not found"):
        kernel("no_such_kernel")


def test_host_and_device_arrays_do_not_mix_as_cupy_refuses() -> None:
    device, host = cp.asarray(np.ones(3, np.float32)), np.ones(3, np.float32)
    with pytest.raises(TypeError, match="device arrays only"):
        device + host
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(device)
    with pytest.raises(TypeError, match=r"expected cupy\.ndarray"):
        cp.ascontiguousarray(host)
    assert isinstance(device * 2 + device, cupy_module.ndarray)
    assert type(device).__module__ == "cupy" and not isinstance(device, np.ndarray)
    assert cp.concatenate([device, device]).get().tolist() == [1.0] * 6


def test_inline_ptx_it_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match="does not know"):
        build.without_ptx('asm("mov.u32 %0, %%laneid;" : "=r"(lane));')


def test_a_captured_graph_replays_its_launches_and_operations_on_the_memorys_contents() -> None:
    x, out = cp.asarray(np.ones(40, dtype=np.float32)), cp.zeros(40, dtype=np.float32)
    stream = cp.cuda.Stream()
    stream.begin_capture()
    kernel("scale")((2,), (32,), (x, np.int32(40), np.float32(3), np.int64(0)))
    out[:] = x + 1  # an operation, then a write into an array captured before
    total = out.sum()
    with pytest.raises(RuntimeError, match=r"read back \(float\(\)\)"):
        float(total)
    with pytest.raises(RuntimeError, match="copy from the host"):
        cp.asarray(np.ones(3))
    graph = stream.end_capture()
    x[:] = 2  # new inputs in the same memory: a replay reads them
    graph.launch(stream)
    assert out.get().tolist() == [7.0] * 40 and float(total) == 280.0
    graph.launch(stream)
    assert out.get().tolist() == [19.0] * 40  # x was scaled again: 18 + 1
