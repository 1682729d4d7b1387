"""A mixture-of-experts layer's expert matrices as the file stores them: one 3-D GGUF tensor
[E, N, K] of blocks, viewed in place in the file's memory map (never copied, so a loaded
model's resident memory stays near its file's size), read by the grouped kernels
(engine/ops/csrc/experts.c) one expert at a time for all the rows routed to it. An MoE
model's embedding and output matrix are held the same way, as one expert.

Shapes: E experts, N rows (outputs) and K weights per row of each expert's matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
# the block types the grouped kernels read in place: what published MoE files hold
EXPERT_TYPES = (
    T.F32,
    T.F16,
    T.BF16,
    T.Q4_0,
    T.Q4_1,
    T.Q5_0,
    T.Q5_1,
    T.Q8_0,
    T.Q4_K,
    T.Q5_K,
    T.Q6_K,
    T.MXFP4,  # gpt-oss's experts
)


PACK_ROWS = 16  # rows of a group in a packed matrix (engine/ops/csrc/int_packed.c)
PACKED = 0x10000  # moe.h's WF_PACKED: or'd into the kernels' type of a packed matrix


@dataclass(frozen=True, slots=True)
class ExpertMatrix:
    """E experts' [N, K] matrices: `data` is uint8 [E, N, row bytes], the file's blocks, or
    (`packed`) the same bytes repacked 16 rows to a group for the integer products
    (experts_native.packed)."""

    qtype: T
    data: np.ndarray
    k: int
    packed: bool = False

    def __post_init__(self) -> None:
        if self.data.dtype != np.uint8 or self.data.ndim != 3 or not self.data.flags.c_contiguous:
            raise ValueError("expert data must be C-contiguous uint8 [E, N, row bytes]")
        if self.data.shape[2] != row_bytes(self.qtype, self.k):
            raise ValueError(
                f"rows of {self.data.shape[2]} bytes are not {self.k} {self.qtype.name}"
            )
        if self.packed and self.n % PACK_ROWS:
            raise ValueError(f"a packed matrix has rows in groups of {PACK_ROWS}, not {self.n}")

    @property
    def kernel_type(self) -> int:
        """The type as the kernels take it (moe.h's WfExperts.qtype)."""
        return int(self.qtype) | (PACKED if self.packed else 0)

    @property
    def num_experts(self) -> int:
        return int(self.data.shape[0])

    @property
    def n(self) -> int:
        return int(self.data.shape[1])

    @property
    def expert_bytes(self) -> int:
        return int(self.data.shape[1] * self.data.shape[2])

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)

    def dense(self, expert: int, rows: np.ndarray | None = None) -> np.ndarray:
        """Expert `expert`'s matrix [N, K] (or its `rows` [R, K]) as float32, as gguf
        dequantizes it (a copy); not of a packed matrix."""
        if self.packed:
            raise ValueError("a packed matrix is read by the kernels alone")
        raw = np.asarray(self.data[expert] if rows is None else self.data[expert][rows])
        if self.qtype == T.F32:
            return raw.view(np.float32).copy()
        out = gguf.quants.dequantize(raw, self.qtype)
        return np.ascontiguousarray(out, dtype=np.float32).reshape(len(raw), self.k)


@dataclass(frozen=True, slots=True)
class InPlaceRows:
    """Matrices of the same K, each one expert in the file's blocks (their types may
    differ), whose outputs one product puts side by side: an MoE model's q, k and v."""

    parts: tuple[ExpertMatrix, ...]

    @property
    def k(self) -> int:
        return self.parts[0].k

    @property
    def n(self) -> int:
        return sum(p.n for p in self.parts)

    @property
    def shape(self) -> tuple[int, int]:
        return self.n, self.k

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.parts)


def row_bytes(qtype: T, k: int) -> int:
    """Bytes of one row of k weights of `qtype` (k a multiple of the type's block)."""
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    if k % block:
        raise ValueError(f"{k} weights are not whole {qtype.name} blocks of {block}")
    return k // block * size


@dataclass(frozen=True, slots=True)
class GptOssExperts:
    """gpt-oss's additions to a layer's experts, float32: the router's bias [E] and each
    expert's gate and up biases [E, expert_ffn] and down bias [E, dim]. With them the
    router takes its top k by raw logit and weighs them by the softmax of those k, and the
    experts' SwiGLU is clamped (engine/ops/moe.py)."""

    router_bias: np.ndarray
    gate_bias: np.ndarray
    up_bias: np.ndarray
    down_bias: np.ndarray

    @property
    def nbytes(self) -> int:
        parts = (self.router_bias, self.gate_bias, self.up_bias, self.down_bias)
        return sum(int(a.nbytes) for a in parts)


@dataclass(frozen=True, slots=True)
class MoEWeights:
    """One layer's experts: each token goes through the top_k experts the router ranks
    highest, their outputs weighted by the router's probabilities renormalised over the k."""

    router: np.ndarray  # [E, dim] float32 (ffn_gate_inp)
    gate: ExpertMatrix  # [E, expert_ffn, dim]
    up: ExpertMatrix  # [E, expert_ffn, dim]
    down: ExpertMatrix  # [E, dim, expert_ffn]
    top_k: int
    # what the experts' kernels read: calls, distinct experts touched, expert bytes read
    # (int64 [3], one array shared by a model's layers; the benchmarks read it)
    stats: np.ndarray = field(default_factory=lambda: np.zeros(3, dtype=np.int64))
    native: Any = None  # experts_native.MoEKernel where the C kernels are built
    gpt_oss: GptOssExperts | None = None  # gpt-oss's biases, routing and activation

    @property
    def nbytes(self) -> int:
        extra = self.gpt_oss.nbytes if self.gpt_oss is not None else 0
        matrices = self.gate.nbytes + self.up.nbytes + self.down.nbytes
        return int(self.router.nbytes) + matrices + extra
