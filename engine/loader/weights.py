"""A GGUF llama model's weights in the layout the forward pass wants: the matrices kept in
their quantized blocks (engine/ops/quant) or dequantized into the compute dtype."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

import numpy as np

from common.errors import InvalidRequestError, UnsupportedModelError
from engine.loader.experts import pack_experts_asked, packed_from_file
from engine.loader.tensors import LayerTensors, Tensors
from engine.ops.moe_cuda import CudaExperts
from engine.ops.quant import kernels as quant_kernels
from engine.ops.quant.cuda import GpuQuantMatrix, dequant_rows
from engine.ops.quant.experts import ExpertMatrix, InPlaceRows
from engine.ops.quant.experts_native import expert_kernels_read
from engine.ops.quant.formats import SUPPORTED
from engine.ops.quant.matrix import QuantMatrix, concat
from engine.text.gguf_file import GGUFFile, release_header, release_pages
from engine.text.model_config import ModelConfig

Array = Any  # numpy.ndarray or cupy.ndarray
Matrix = Any  # an Array, or a QuantMatrix (CPU) / GpuQuantMatrix (CuPy), --weights quantized
Experts = Any  # a layer's experts: MoEWeights (CPU), CudaExperts, or MLX's form of them
WEIGHT_MODES = ("auto", "quantized", "float32")
EMBED = "token_embd.weight"


@dataclass(slots=True)
class LayerWeights:
    attn_norm: Array  # [dim]
    wqkv: Matrix  # [q_dim + 2 * kv_dim, dim]; q/k rows of each head in split-half rope order
    wo: Matrix  # [dim, q_dim]
    ffn_norm: Array  # [dim]
    w_gate_up: Matrix  # [2 * ffn_dim, dim]; None in a mixture-of-experts layer
    w_down: Matrix  # [dim, ffn_dim]; None in a mixture-of-experts layer
    bqkv: Array | None = None  # [q_dim + 2 kv_dim] added to wqkv's products, in its order (Qwen 2)
    q_norm: Array | None = (
        None  # [head_dim] each head's q RMS-normed with it (Qwen 3); in its order
    )
    k_norm: Array | None = None  # [head_dim] the same for k
    moe: Experts | None = None  # the experts in place of w_gate_up and w_down
    bo: Array | None = None  # [dim] added to wo's products (gpt-oss)
    sinks: Array | None = None  # [H] float32: each head's learned sink logit (gpt-oss)
    window: int = 0  # this layer attends to the last `window` positions only (0: all)


@dataclass(slots=True)
class Weights:
    embed: Matrix  # [vocab, dim]
    layers: list[LayerWeights]
    out_norm: Array  # [dim]
    output: Matrix  # [vocab, dim]; the same object as embed when the model ties them
    quantized: bool  # the matrices are (Gpu)QuantMatrix where their type has a kernel
    native: Any = None  # engine/ops/native_layers.py's C descriptors (False: none), on first use

    @property
    def in_place(self) -> bool:
        """Whether every matrix is multiplied in the file's blocks by the kernels, every row
        of any chunk (an MoE model's): no chunk's products go to BLAS."""
        return all(isinstance(lw.wo, ExpertMatrix) for lw in self.layers)

    @property
    def nbytes(self) -> int:
        arrays = [self.embed, self.out_norm]
        if self.output is not self.embed:
            arrays.append(self.output)
        for layer in self.layers:
            arrays += [layer.attn_norm, layer.wqkv, layer.wo, layer.ffn_norm]
            optional = (
                layer.w_gate_up,
                layer.w_down,
                layer.bqkv,
                layer.q_norm,
                layer.k_norm,
                layer.bo,
                layer.sinks,
            )
            arrays += [a for a in (*optional, layer.moe) if a is not None]
        return sum(int(a.nbytes) for a in arrays)

    def embed_rows(self, tokens: Array, xp: ModuleType) -> Array:
        """[N, dim] float embeddings of the token ids [N]."""
        if isinstance(self.embed, ExpertMatrix):
            return self.embed.dense(0, np.asarray(tokens, dtype=np.int64))
        if isinstance(self.embed, GpuQuantMatrix):
            return dequant_rows(self.embed, tokens)
        if not isinstance(self.embed, QuantMatrix):
            return self.embed[tokens]
        ids = np.ascontiguousarray(tokens, dtype=np.int64)
        out = np.empty((len(ids), self.embed.k), dtype=np.float32)
        quant_kernels().dequant(self.embed, ids, out, 1)
        return out


def qk_orders(
    config: ModelConfig, spec: LayerTensors
) -> tuple[np.ndarray | None, np.ndarray | None]:
    """The row orders that put a file's q and k rows in split halves (None: they are)."""
    if not spec.rope_in_pairs:
        return None, None
    return (rope_halves_order(config.num_heads, config.head_dim),
            rope_halves_order(config.num_kv_heads, config.head_dim))  # fmt: skip


def rope_halves_order(num_heads: int, head_dim: int) -> np.ndarray:
    """Row order that turns GGUF's adjacent-pair rope layout into split halves, per head.

    q.k is unchanged by permuting q and k alike; split halves let rope use contiguous slices.
    """
    per_head = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    return (np.arange(num_heads)[:, None] * head_dim + per_head[None, :]).reshape(-1)


def layer_window(config: ModelConfig, spec: LayerTensors, layer: int) -> int:
    """The sliding window layer `layer` attends to (0: every position): every
    spec.window_every-th layer from the first, where the file gives a window."""
    every = spec.window_every
    return config.sliding_window if every and layer % every == 0 else 0


def use_quantized(mode: str, tensors: Tensors, dtype: np.dtype[Any]) -> bool:
    """Whether `--weights mode` keeps the matrices quantized here; an error names what
    stands in the way when "quantized" was asked for and cannot be had."""
    if mode not in WEIGHT_MODES:
        choices = ", ".join(WEIGHT_MODES)
        raise InvalidRequestError("weights", f"must be one of {choices}, got {mode!r}")
    if mode == "float32":
        return False
    why = ""
    if dtype != np.float32:
        why = f"quantized kernels compute in float32, not {dtype}"
    elif missing := tensors.without_kernel():
        why = f"no quantized kernel for {', '.join(missing[:4])} (kernels: {', '.join(SUPPORTED)})"
    if why and mode == "quantized":
        raise UnsupportedModelError(f"--weights quantized: {why}; use --weights float32")
    return not why


class _Placer:
    """Puts tensors where the forward pass reads them: matrices quantized or expanded,
    everything else in the compute dtype on the device."""

    def __init__(self, tensors: Tensors, quantized: bool, dtype: np.dtype[Any], xp: ModuleType):
        self.tensors, self.quantized, self.dtype, self.xp = tensors, quantized, dtype, xp

    def dev(self, a: np.ndarray) -> Array:
        return self.xp.asarray(np.ascontiguousarray(a, dtype=self.dtype))

    def vector(self, name: str) -> Array:
        return self.dev(self.tensors.host(name))

    def maybe(self, a: np.ndarray | None) -> Array | None:
        return None if a is None else self.dev(a)

    def _matrix(self, name: str, order: np.ndarray | None) -> Matrix:
        m = self.tensors.quant(name) if self.quantized else self.tensors.host(name)
        if order is None:
            return m
        return m.take(order) if isinstance(m, QuantMatrix) else m[order]

    def matrix(self, name: str, order: np.ndarray | None = None) -> Matrix:
        return self.placed(self._matrix(name, order))

    def in_place(self, name: str, pack: bool = True) -> Matrix:
        """The matrix as one expert read in the file's blocks where the expert kernels read
        its type (no copy, and no wider than the file: a K-quant's codes and scales are
        wider, see formats.py) or, with `pack`, repacked where they pack it (as many bytes;
        not for a matrix whose rows are looked up), else as `matrix` places it."""
        t = self.tensors.tensor(name)
        n, k = self.tensors.shape(name)
        if not (self.quantized and self.xp is np and expert_kernels_read(t.tensor_type, k)):
            return self.matrix(name)
        raw = np.asarray(t.data).view(np.uint8).reshape(1, n, -1)
        m = ExpertMatrix(t.tensor_type, raw, k)
        return packed_from_file(m, t.data) if pack else m

    def in_place_rows(self, names: list[str], orders: list[np.ndarray | None]) -> Matrix:
        """The matrices side by side, each read in the file's blocks (InPlaceRows) where
        the expert kernels read them all unpermuted, else as `stacked` joins them."""
        parts = [self.in_place(n) for n in names] if all(o is None for o in orders) else []
        if parts and all(isinstance(m, ExpertMatrix) for m in parts):
            return InPlaceRows(tuple(parts))
        return self.stacked(names, orders)

    def placed(self, m: QuantMatrix | np.ndarray) -> Matrix:
        """A quantized matrix kept as it is (uploaded as it is to a GPU), an array put on
        the device in the compute dtype."""
        if not isinstance(m, QuantMatrix):
            return self.dev(m)
        return m if self.xp is np else GpuQuantMatrix.upload(m, self.xp)

    def stacked(self, names: list[str], orders: list[np.ndarray | None]) -> Matrix:
        """The matrices' rows in one matrix (one product instead of several)."""
        parts = [self._matrix(n, o) for n, o in zip(names, orders, strict=True)]
        if all(isinstance(p, QuantMatrix) for p in parts):
            joined = concat(parts)
            if joined is not None:
                return self.placed(joined)
        return self.dev(np.concatenate([_dense(p) for p in parts]))


def load_weights(
    reader: GGUFFile,
    config: ModelConfig,
    spec: LayerTensors,
    dtype: np.dtype[Any],
    xp: ModuleType,
    mode: str = "auto",
) -> Weights:
    """Every matrix kept quantized (see use_quantized) or dequantized to `dtype` on `xp`'s
    device; norms in `dtype`; the layers' tensors beyond Llama's as `spec` (its family) says."""
    tensors = Tensors(reader, config)
    if spec.experts and dtype != np.float32:
        raise UnsupportedModelError(
            f"{config.architecture}: the experts compute in float32, not {dtype}; "
            "use --dtype float32"
        )
    quantized = use_quantized(mode, tensors, dtype)
    put = _Placer(tensors, quantized, dtype, xp)
    moe_stats = np.zeros(3, dtype=np.int64)  # one for the model's layers
    pack = bool(spec.experts) and xp is np and pack_experts_asked()
    layers = [_layer(put, config, spec, i, moe_stats, pack) for i in range(config.num_layers)]
    # an MoE model's: its experts keep the file mapped anyway, and its vocabulary matrices
    # are a large share of a step's reads at one row
    place = put.in_place if spec.experts else put.matrix
    embed = put.in_place(EMBED, pack=False) if spec.experts else place(EMBED)  # rows looked up
    output = place("output.weight") if "output.weight" in tensors.by_name else embed
    return Weights(embed=embed, layers=layers, out_norm=put.vector("output_norm.weight"),
                   output=output, quantized=quantized)  # fmt: skip


def _layer(
    put: _Placer,
    config: ModelConfig,
    spec: LayerTensors,
    i: int,
    moe_stats: np.ndarray,
    pack: bool,
) -> LayerWeights:
    """Layer i's weights, placed; `moe_stats`: the model's expert counters, `pack`: whether
    its experts are packed (WARMFLEET_PACK_EXPERTS)."""
    tensors, p = put.tensors, f"blk.{i}."
    q_order, k_order = qk_orders(config, spec)
    qkv = [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
    bias, q_norm, k_norm = tensors.extras(p, spec, (q_order, k_order))
    moe: Experts = None
    if spec.experts:
        host = put.xp is np
        moe = tensors.experts(p, config.num_experts_used, moe_stats, spec.expert_biases, pack, host)
        moe = moe if host else CudaExperts.upload(moe, put.xp)
    dense = (p + "ffn_gate.weight", p + "ffn_up.weight")
    # an MoE model's attention matrices too are read in the file's blocks: its products
    # quantize activations anyway (the expert kernels), and the blocks are narrower
    stack = put.in_place_rows if moe else put.stacked
    return LayerWeights(
        attn_norm=put.vector(p + "attn_norm.weight"),
        wqkv=stack(qkv, [q_order, k_order, None]),
        wo=(put.in_place if moe else put.matrix)(p + "attn_output.weight"),
        ffn_norm=put.vector(f"{p}{spec.ffn_norm}.weight"),
        w_gate_up=None if moe else put.stacked(list(dense), [None, None]),
        w_down=None if moe else put.matrix(p + "ffn_down.weight"),
        bqkv=put.maybe(bias),
        q_norm=put.maybe(q_norm),
        k_norm=put.maybe(k_norm),
        moe=moe,
        bo=put.vector(p + "attn_output.bias") if spec.out_bias else None,
        sinks=put.vector(p + "attn_sinks.weight") if spec.sinks else None,
        window=layer_window(config, spec, i),
    )


def release_copied(reader: GGUFFile, weights: Weights) -> None:
    """Drop from resident memory the file's pages of the header and of every tensor the
    weights hold a copy of (all but those read in place), where the map stays open for
    those read in place."""
    in_place = [weights.embed, weights.output]
    for lw in weights.layers:
        qkv = lw.wqkv.parts if isinstance(lw.wqkv, InPlaceRows) else (lw.wqkv,)
        in_place += [*qkv, lw.wo]
        in_place += (lw.moe.gate, lw.moe.up, lw.moe.down) if lw.moe else ()
    kept = {int(m.data.ctypes.data) for m in in_place if isinstance(m, ExpertMatrix)}
    if not kept:
        return
    release_header(reader)
    for t in reader.tensors:
        if int(t.data.ctypes.data) not in kept:
            release_pages(t.data)


def _dense(m: Matrix) -> np.ndarray:
    if not isinstance(m, QuantMatrix):
        return np.asarray(m)
    out = np.empty(m.shape, dtype=np.float32)
    quant_kernels().dequant(m, np.arange(m.shape[0], dtype=np.int64), out, 1)
    return out
