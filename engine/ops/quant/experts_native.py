"""ctypes bindings of the mixture-of-experts kernels: engine/ops/csrc/experts.c (grouped
products on expert weights read in place from their GGUF blocks) and moe.c (a step's whole
MoE FFN). The C structs of moe.h are mirrored here (WfExperts, WfMoE) so that a layer's
descriptor can embed one. `load()` is None where native.library() is.

Products: the block-quantized types multiply in integers, each activation row quantized to
int8 (as llama.cpp does); WARMFLEET_EXPERT_PRODUCTS=float makes them dequantize each weight
to float32 instead (the slower products of before, for comparison). F32, F16 and BF16
always multiply in float32. Where the build can (AVX-512 VNNI: Q8_0 and MXFP4), `packed`
repacks a matrix at load 16 rows to a group for faster integer products, the same bits.

Shapes: E experts; W_e [N, K]; P pairs (activation row, expert), bucketed by expert.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np
from numba import get_num_threads

from engine.ops import native
from engine.ops.native import address
from engine.ops.quant.experts import PACK_ROWS, ExpertMatrix, GptOssExperts

_ptr, _i64, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
UNSUPPORTED = -1  # what the kernels return for a type or shape they do not read
PRODUCTS_ENV = "WARMFLEET_EXPERT_PRODUCTS"


class Products(IntEnum):
    """moe.h's WF_PRODUCTS_*: how block-quantized weights multiply."""

    INTEGER = 0
    FLOAT = 1


@functools.cache
def expert_products() -> Products:
    """The products WARMFLEET_EXPERT_PRODUCTS names (`integer`, the default, or `float`),
    read once."""
    name = os.environ.get(PRODUCTS_ENV, "integer").strip().lower() or "integer"
    try:
        return Products[name.upper()]
    except KeyError:
        raise ValueError(f"{PRODUCTS_ENV}={name!r}: expected integer or float") from None


class WfExperts(ctypes.Structure):
    """moe.h's WfExperts: one expert tensor, pointing into the file's blocks."""

    _fields_ = [
        ("qtype", _int),
        ("data", _ptr),
        ("expert_bytes", _i64),
        ("n", _i64),
        ("k", _i64),
    ]


class WfMoE(ctypes.Structure):
    """moe.h's WfMoE: a layer's router and its three expert tensors."""

    _fields_ = [
        ("router", _ptr),
        ("num_experts", _i64),
        ("top_k", _i64),
        ("dim", _i64),
        ("ffn", _i64),
        ("gate", WfExperts),
        ("up", WfExperts),
        ("down", WfExperts),
        ("products", _int),
        ("router_bias", _ptr),  # gpt-oss's biases (None elsewhere)
        ("gate_bias", _ptr),
        ("up_bias", _ptr),
        ("down_bias", _ptr),
    ]


def experts_struct(w: ExpertMatrix) -> WfExperts:
    """The descriptor of `w` (its data must outlive the descriptor's use)."""
    return WfExperts(w.kernel_type, address(w.data), w.expert_bytes, w.n, w.k)


class ExpertKernels:
    """wf_expert_matmul and wf_moe_ffn of one compiled library (the engine's, or a test's
    build for another instruction set)."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self._matmul = lib.wf_expert_matmul_as
        self._matmul.argtypes = [_int, _int, _ptr, _i64, _i64, _i64, _ptr, _i64, _ptr, _ptr]
        self._matmul.argtypes += [_i64, _ptr, _i64, _int]
        self._matmul.restype = _i64  # 0, the scratch bytes refused, or UNSUPPORTED
        self._moe = lib.wf_moe_ffn
        self._moe.argtypes = [ctypes.POINTER(WfMoE), _ptr, _i64, _ptr, _ptr, _int]
        self._moe.restype = _i64
        self._supported = lib.wf_expert_supported
        self._supported.argtypes = [_int, _i64]
        self._supported.restype = _int
        self._packs = lib.wf_int_packs
        self._packs.argtypes = [_int]
        self._packs.restype = _int
        self._pack = lib.wf_int_pack
        self._pack.argtypes = [_int, _ptr, _i64, _i64, _ptr, _int]
        self._pack.restype = _int

    def pack(self, w: ExpertMatrix, threads: int) -> ExpertMatrix | None:
        """w (in the file's blocks) repacked 16 rows to a group for int_packed.c's products
        (the same bits as w's; a copy as large); None where this build does not pack it."""
        if w.packed or w.n % PACK_ROWS or not self._packs(int(w.qtype)):
            return None
        data = np.empty(w.data.shape, dtype=np.uint8)
        rows = w.num_experts * w.n  # every expert's rows whole groups: packed as one matrix
        if self._pack(int(w.qtype), address(w.data), rows, w.k, address(data), threads):
            return None
        return ExpertMatrix(w.qtype, data, w.k, packed=True)

    def supported(self, qtype: int, k: int) -> bool:
        """Whether these kernels read rows of k weights of `qtype`."""
        return bool(self._supported(int(qtype), k))

    def matmul(
        self,
        w: ExpertMatrix,
        x: np.ndarray,
        rows: np.ndarray,
        starts: np.ndarray,
        out: np.ndarray,
        threads: int,
        products: Products | None = None,
    ) -> None:
        """out[p] = x[rows[p]] @ W_e.T for the pairs p in [starts[e], starts[e + 1]) of
        each expert e: x [R, K] and out [P, N] float32 with contiguous rows; rows int64 [P];
        starts int64 [E + 1]; products as `products` says (None: the environment's).
        Experts with no pairs are not read. MemoryError (nothing done) where the kernel's
        scratch cannot be allocated."""
        x_stride, out_stride = _row_stride(x, "x"), _row_stride(out, "out")
        if x.shape[1] != w.k or out.shape[1] != w.n:
            raise ValueError(f"x [*, {x.shape[1]}] or out [*, {out.shape[1]}] misfit {w.n}x{w.k}")
        _check_pairs(w, len(x), rows, starts, len(out))
        rows, starts = np.ascontiguousarray(rows), np.ascontiguousarray(starts)
        weights = (w.kernel_type, address(w.data), w.expert_bytes, w.n, w.k)
        pairs = (address(rows), address(starts), w.num_experts)
        how = int(expert_products() if products is None else products)
        if w.packed and how != Products.INTEGER:
            raise ValueError("a packed matrix multiplies in integers only")
        done = self._matmul(
            how, *weights, address(x), x_stride, *pairs, address(out), out_stride, threads
        )
        _check(done, "wf_expert_matmul", f"{len(rows)} pairs of {w.qtype.name} [{w.n}, {w.k}]")

    def moe_ffn(
        self, m: WfMoE, x: np.ndarray, out: np.ndarray, threads: int, stats: np.ndarray | None
    ) -> None:
        """out [R, dim] = wf_moe_ffn of x [R, dim] (both C-contiguous float32)."""
        at = address(stats) if stats is not None else None
        done = self._moe(ctypes.byref(m), address(x), len(x), address(out), at, threads)
        _check(done, "wf_moe_ffn", f"{len(x)} rows through {m.num_experts} experts")


@functools.cache
def load() -> ExpertKernels | None:
    """The engine's compiled MoE kernels; None where the C kernels cannot be built."""
    lib = native.library()
    return ExpertKernels(lib) if lib is not None else None


def _check(done: int, kernel: str, work: str) -> None:
    if done == UNSUPPORTED:
        raise ValueError(f"{kernel} does not read {work}")
    if done:
        raise native.scratch_refused(kernel, done, work)


def _row_stride(a: np.ndarray, name: str) -> int:
    """The row stride, in floats, of a float32 [rows, width] array with contiguous rows."""
    if a.dtype != np.float32 or a.ndim != 2 or (a.shape[1] > 1 and a.strides[1] != 4):
        raise ValueError(f"{name} must be float32 [rows, width] with contiguous rows")
    return a.strides[0] // 4 if a.shape[0] > 1 else a.shape[1]


def _check_pairs(
    w: ExpertMatrix, x_rows: int, rows: np.ndarray, starts: np.ndarray, out_rows: int
) -> None:
    if rows.dtype != np.int64 or starts.dtype != np.int64 or len(starts) != w.num_experts + 1:
        raise ValueError("rows and starts must be int64, starts of E + 1")
    if starts[0] != 0 or np.any(np.diff(starts) < 0) or starts[-1] != len(rows):
        raise ValueError("starts must rise from 0 to the number of pairs")
    if len(rows) > out_rows or (len(rows) and (rows.min() < 0 or rows.max() >= x_rows)):
        raise ValueError("the pairs do not fit x or out")


def expert_matmul(
    w: ExpertMatrix,
    x: np.ndarray,
    rows: np.ndarray,
    starts: np.ndarray,
    out: np.ndarray,
    threads: int,
    products: Products | None = None,
) -> None:
    """ExpertKernels.matmul with the engine's kernels; RuntimeError where they are not
    built here."""
    kernels = load()
    if kernels is None:
        raise RuntimeError("the C kernels are not built here")
    kernels.matmul(w, x, rows, starts, out, threads, products)


@dataclass(frozen=True, slots=True)
class MoEKernel:
    """A layer's MoE FFN in the C kernels: the router [E, dim] float32, top_k, and the gate
    and up [E, ffn, dim] and down [E, dim, ffn] expert tensors, multiplied as `products`
    says (the environment's by default), with gpt-oss's biases, routing and activation
    where `gpt_oss` is given; `struct` points into them."""

    router: np.ndarray
    top_k: int
    gate: ExpertMatrix
    up: ExpertMatrix
    down: ExpertMatrix
    kernels: ExpertKernels
    products: Products = field(default_factory=expert_products)
    gpt_oss: GptOssExperts | None = None
    struct: WfMoE = field(init=False)

    def __post_init__(self) -> None:
        e, dim = self.router.shape
        ffn = self.gate.n
        if self.router.dtype != np.float32 or not self.router.flags.c_contiguous:
            raise ValueError("the router must be C-contiguous float32 [E, dim]")
        shapes = [(w.num_experts, w.n, w.k) for w in (self.gate, self.up, self.down)]
        if shapes != [(e, ffn, dim), (e, ffn, dim), (e, dim, ffn)] or not 0 < self.top_k <= e:
            raise ValueError(f"experts {shapes} and top {self.top_k} do not fit router {e}x{dim}")
        parts = (experts_struct(w) for w in (self.gate, self.up, self.down))
        s = WfMoE(address(self.router), e, self.top_k, dim, ffn, *parts, int(self.products))
        if self.gpt_oss is not None:
            b = self.gpt_oss
            want = ((e,), (e, ffn), (e, ffn), (e, dim))
            biases = (b.router_bias, b.gate_bias, b.up_bias, b.down_bias)
            for bias, shape in zip(biases, want, strict=True):
                if bias.dtype != np.float32 or bias.shape != shape or not bias.flags.c_contiguous:
                    raise ValueError(f"a gpt-oss bias must be C-contiguous float32 {shape}")
            s.router_bias, s.gate_bias, s.up_bias, s.down_bias = (address(a) for a in biases)
        object.__setattr__(self, "struct", s)

    @property
    def dim(self) -> int:
        return int(self.router.shape[1])

    def run(self, x: np.ndarray, threads: int, stats: np.ndarray | None = None) -> np.ndarray:
        """out [R, dim] = the MoE FFN of x [R, dim] (float32, already normed; the residual
        not added). stats, an int64 [3] when given, gains 1 call, the distinct experts
        touched and the expert bytes read. MemoryError (nothing done) where the scratch
        cannot be allocated."""
        if x.dtype != np.float32 or x.ndim != 2 or x.shape[1] != self.dim:
            raise ValueError(f"x must be float32 [rows, {self.dim}]")
        if stats is not None and (stats.dtype != np.int64 or stats.shape != (3,)):
            raise ValueError("stats must be int64 [3]")
        x = np.ascontiguousarray(x)
        out = np.empty_like(x)
        self.kernels.moe_ffn(self.struct, x, out, threads, stats)
        return out


def moe_kernel(
    router: np.ndarray,
    top_k: int,
    gate: ExpertMatrix,
    up: ExpertMatrix,
    down: ExpertMatrix,
    gpt_oss: GptOssExperts | None = None,
) -> MoEKernel | None:
    """The layer's MoE kernel on the engine's compiled kernels; None where they are not
    built here."""
    kernels = load()
    if kernels is None:
        return None
    return MoEKernel(router, top_k, gate, up, down, kernels, gpt_oss=gpt_oss)


def packed(w: ExpertMatrix) -> ExpertMatrix:
    """w repacked for the integer products where this build packs it and the products are
    integer (WARMFLEET_EXPERT_PRODUCTS); else w itself."""
    kernels = load()
    if kernels is None or expert_products() != Products.INTEGER:
        return w
    return kernels.pack(w, get_num_threads()) or w


def expert_kernels_read(qtype: int, k: int) -> bool:
    """Whether the compiled expert kernels are here and read rows of k weights of `qtype`."""
    kernels = load()
    return kernels is not None and kernels.supported(qtype, k)
