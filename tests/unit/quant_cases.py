"""Every supported weight type written into a tiny GGUF file with gguf.GGUFWriter and read
back as the loader reads it: values through gguf.quants.quantize where gguf-py can quantize
the type, random valid blocks for the K-quants (gguf-py only dequantizes those). Shared by
the CPU kernels' tests and the GPU kernels' (test_cuda_kernels.py)."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from engine.ops.quant.formats import decode
from engine.ops.quant.matrix import QuantMatrix

T = gguf.GGMLQuantizationType
TYPES = (T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q4_K, T.Q5_K, T.Q6_K, T.F16, T.BF16)
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
N, K = 37, 512  # 37 rows: the last task of 4 rows is short
MAX_ROWS = 64
U = 2.0**-24
Stored = dict[T, tuple[QuantMatrix, np.ndarray]]


def random_blocks(rng: np.random.Generator, qtype: T, rows: int, k: int) -> np.ndarray:
    """[rows, row bytes] of valid blocks: random codes and sub-scales, finite f16 scales."""
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, (rows, k // 256, block_bytes), dtype=np.uint8)
    scale_at = (208,) if qtype == T.Q6_K else (0, 2)  # d (and dmin) of each super-block
    for at in scale_at:
        d = rng.uniform(0.001, 0.05, raw.shape[:2]).astype(np.float16)
        raw[..., at : at + 2] = d.view(np.uint8).reshape(*raw.shape[:2], 2)
    return raw.reshape(rows, -1)


def write_and_read(path: Path) -> Stored:
    """Each type's [N, K] matrix as the loader builds it from the file, with gguf's float32
    dequantization of the same tensor."""
    rng = np.random.default_rng(7)
    writer = gguf.GGUFWriter(path, "llama")
    for qtype in TYPES:
        if qtype in K_QUANTS:
            data = random_blocks(rng, qtype, N, K)
        else:
            data = gguf.quants.quantize(rng.standard_normal((N, K)).astype(np.float32), qtype)
        writer.add_tensor(f"w.{qtype.name}", data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        raw = np.asarray(t.data).reshape(N, -1)
        matrix = QuantMatrix.from_decoded(decode(raw, t.tensor_type), t.tensor_type.name)
        out[t.tensor_type] = (matrix, gguf.quants.dequantize(raw, t.tensor_type))
    return out


def summation_bound(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """gamma_K * |x| @ |w.T|: how far a float32 sum of K products may be from the exact one."""
    k = x.shape[1]
    return k * U / (1 - k * U) * (np.abs(x).astype(np.float64) @ np.abs(w.T).astype(np.float64))
