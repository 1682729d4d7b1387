"""GGUF blocks in MLX's affine quantization, which stores w = scale * q + bias per group of
32 weights, q packed little-endian into uint32 words. Q4_0 (scale d, bias -8d), Q4_1 (d, m),
Q5_0 (d, -16d), Q5_1 (d, m), Q8_0 (d, -128d on q + 128), Q4_K and Q5_K (a scale and offset
per 32-weight sub-block) are exactly that form with group 32 and 4, 4, 5, 5, 8, 4 and 5
bits, so their blocks go to `mx.quantized_matmul` and `mx.gather_qmm` as they are. Q6_K has
a scale per 16 weights (MLX's smallest group is 32), and F16/BF16/F32 are not blocks: those
are expanded to the compute dtype at load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gguf
import mlx.core as mx
import numpy as np

T = gguf.GGMLQuantizationType
GROUP = 32  # weights per scale and bias
BITS = {
    T.Q4_0: 4,
    T.Q4_1: 4,
    T.Q5_0: 5,
    T.Q5_1: 5,
    T.Q4_K: 4,
    T.Q5_K: 5,
    T.Q8_0: 8,
    T.MXFP4: 5,
}  # kept: MXFP4's values as codes 0..24, exact (formats.py)


def pack(codes: np.ndarray, bits: int) -> np.ndarray:
    """[N, K] codes < 2**bits -> [N, K * bits / 32] uint32: MLX's layout, a little-endian
    bit stream of `bits` per code."""
    n = codes.shape[0]
    if bits == 8:
        return np.ascontiguousarray(codes).view("<u4")
    if bits == 4:
        pairs = codes.reshape(n, -1, 2)
        return np.ascontiguousarray(pairs[..., 0] | (pairs[..., 1] << 4)).view("<u4")
    stream = np.unpackbits(codes[..., None], axis=-1, count=bits, bitorder="little")
    packed = np.packbits(stream.reshape(n, -1), axis=-1, bitorder="little")
    return np.ascontiguousarray(packed).view("<u4")


@dataclass(frozen=True, slots=True)
class MLXQuant:
    """[N, K] weights in MLX's quantized form (or [E, N, K] of E experts: the same arrays
    with a leading axis)."""

    wq: Any  # [N, K * bits / 32] uint32
    scales: Any  # [N, K / 32]
    biases: Any
    bits: int

    @property
    def arrays(self) -> tuple[Any, Any, Any]:
        return (self.wq, self.scales, self.biases)

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays)

    def matmul(self, x: Any) -> Any:
        return mx.quantized_matmul(
            x, self.wq, self.scales, self.biases, transpose=True, group_size=GROUP, bits=self.bits
        )

    def rows(self, ids: Any) -> Any:
        """The rows `ids` [n] expanded, [n, K] (the embedding's lookup)."""
        return mx.dequantize(
            self.wq[ids], self.scales[ids], self.biases[ids], group_size=GROUP, bits=self.bits
        )
