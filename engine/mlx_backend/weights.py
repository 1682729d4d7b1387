"""A GGUF model's weights on MLX: each matrix as row blocks in MLX's quantized form where
its GGUF type maps onto it exactly (quant.py) and in the compute dtype otherwise, the
norms in the compute dtype, a mixture-of-experts layer's experts stacked (experts.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from common.errors import InvalidRequestError, UnsupportedModelError
from engine.loader.tensors import LayerTensors, Tensors
from engine.loader.weights import WEIGHT_MODES, LayerWeights, Weights, layer_window, qk_orders
from engine.mlx_backend import mx_dtype
from engine.mlx_backend.experts import MLXExperts, place_experts
from engine.mlx_backend.quant import BITS, GROUP, MLXQuant, pack
from engine.ops.quant.formats import decode
from engine.text.gguf_file import GGUFFile
from engine.text.model_config import ModelConfig

Part = Any  # an MLXQuant, or an mx.array [N, K] in the compute dtype


@dataclass(frozen=True, slots=True)
class MLXMatrix:
    """A weight matrix [N, K] as row blocks, each quantized or dense: a layer's Q, K and V
    in one matrix even where their types differ. x @ W.T is one product per block."""

    parts: tuple[Part, ...]
    source: str  # the GGUF type(s) it came from, e.g. "Q4_1"

    @property
    def nbytes(self) -> int:
        return sum(int(p.nbytes) for p in self.parts)

    @property
    def quantized(self) -> bool:
        return any(isinstance(p, MLXQuant) for p in self.parts)

    def matmul(self, x: Any) -> Any:
        outs = [p.matmul(x) if isinstance(p, MLXQuant) else x @ p.T for p in self.parts]
        return outs[0] if len(outs) == 1 else mx.concatenate(outs, axis=-1)

    def rows(self, ids: Any) -> Any:
        (part,) = self.parts  # the embedding is one tensor
        return part.rows(ids) if isinstance(part, MLXQuant) else part[ids]


def _merge(parts: list[Part]) -> tuple[Part, ...]:
    """Neighbouring blocks of the same form joined into one (fewer products)."""
    out: list[Part] = []
    for p in parts:
        last = out[-1] if out else None
        if isinstance(p, MLXQuant) and isinstance(last, MLXQuant) and last.bits == p.bits:
            pairs = zip(last.arrays, p.arrays, strict=True)
            wq, scales, biases = (mx.concatenate([a, b]) for a, b in pairs)
            out[-1] = MLXQuant(wq, scales, biases, p.bits)
        elif not isinstance(p, MLXQuant) and last is not None and not isinstance(last, MLXQuant):
            out[-1] = mx.concatenate([last, p])
        else:
            out.append(p)
    return tuple(out)


class _Placer:
    def __init__(self, tensors: Tensors, quantized: bool, dtype: np.dtype[Any]) -> None:
        self.tensors, self.quantized, self.dtype = tensors, quantized, dtype
        self.mx_dtype = mx_dtype(dtype)

    def vector(self, name: str) -> Any:
        return mx.array(self.tensors.host(name).astype(self.dtype))

    def maybe(self, a: np.ndarray | None) -> Any:
        return None if a is None else mx.array(a.astype(self.dtype))

    def part(self, name: str, order: np.ndarray | None) -> Part:
        t = self.tensors.tensor(name)
        k = self.tensors.shape(name)[1]
        bits = BITS.get(t.tensor_type)
        if not self.quantized or bits is None or k % GROUP:
            w = self.tensors.host(name)
            return mx.array((w if order is None else w[order]).astype(self.dtype))
        d = decode(np.asarray(t.data).reshape(self.tensors.shape(name)[0], -1), t.tensor_type)
        decoded = (d.codes, d.scale, d.offset)
        codes, scale, offset = (a if order is None else a[order] for a in decoded)
        scales, biases = (mx.array(a.astype(self.dtype)) for a in (scale, offset))
        return MLXQuant(mx.array(pack(codes, bits)), scales, biases, bits)

    def experts(self, prefix: str, top_k: int, biases: bool) -> MLXExperts:
        unread = np.zeros(3, dtype=np.int64)  # the NumPy kernels' read counts: none run here
        moe = self.tensors.experts(prefix, top_k, unread, biases)
        return place_experts(moe, self.quantized, self.dtype)

    def matrix(self, names: Sequence[str], orders: Sequence[np.ndarray | None]) -> MLXMatrix:
        parts = [self.part(n, o) for n, o in zip(names, orders, strict=True)]
        types = dict.fromkeys(self.tensors.tensor(n).tensor_type.name for n in names)
        return MLXMatrix(_merge(parts), "+".join(types))


def _quantized(mode: str, tensors: Tensors) -> bool:
    if mode not in WEIGHT_MODES:
        choices = ", ".join(WEIGHT_MODES)
        raise InvalidRequestError("weights", f"must be one of {choices}, got {mode!r}")
    if mode == "float32":
        return False
    if mode == "quantized" and not any(t.tensor_type in BITS for t in tensors.by_name.values()):
        kinds = ", ".join(t.name for t in BITS)
        raise UnsupportedModelError(
            f"--weights quantized: no matrix of a type MLX reads quantized ({kinds}); "
            "use --weights float32"
        )
    return True


def load_mlx_weights(
    reader: GGUFFile,
    config: ModelConfig,
    spec: LayerTensors,
    dtype: np.dtype[Any],
    mode: str = "auto",
) -> Weights:
    """The matrices of the types in BITS kept quantized (unless mode is "float32"), the
    others and the norms in `dtype`, all as MLX arrays; a family with experts (`spec`) has
    them in each layer's `moe` in place of w_gate_up and w_down."""
    tensors = Tensors(reader, config)
    put = _Placer(tensors, _quantized(mode, tensors), dtype)
    q_order, k_order = qk_orders(config, spec)
    layers = []
    for i in range(config.num_layers):
        p = f"blk.{i}."
        qkv = [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"]
        bias, q_norm, k_norm = tensors.extras(p, spec, (q_order, k_order))
        moe = put.experts(p, config.num_experts_used, spec.expert_biases) if spec.experts else None
        dense = [p + "ffn_gate.weight", p + "ffn_up.weight"]
        layers.append(
            LayerWeights(
                attn_norm=put.vector(p + "attn_norm.weight"),
                wqkv=put.matrix(qkv, [q_order, k_order, None]),
                wo=put.matrix([p + "attn_output.weight"], [None]),
                ffn_norm=put.vector(f"{p}{spec.ffn_norm}.weight"),
                w_gate_up=put.matrix(dense, [None, None]) if moe is None else None,
                w_down=put.matrix([p + "ffn_down.weight"], [None]) if moe is None else None,
                bqkv=put.maybe(bias),
                q_norm=put.maybe(q_norm),
                k_norm=put.maybe(k_norm),
                moe=moe,
                bo=put.vector(p + "attn_output.bias") if spec.out_bias else None,
                sinks=put.vector(p + "attn_sinks.weight") if spec.sinks else None,
                window=layer_window(config, spec, i),
            )
        )
    embed = put.matrix(["token_embd.weight"], [None])
    has_output = "output.weight" in tensors.by_name
    output = put.matrix(["output.weight"], [None]) if has_output else embed
    out_norm = put.vector("output_norm.weight")
    weights = Weights(embed=embed, layers=layers, out_norm=out_norm, output=output, quantized=False)
    weights.quantized = any(
        m.quantized for m in _matrices(weights) if isinstance(m, MLXMatrix | MLXExperts)
    )
    mx.eval([p for m in _matrices(weights) for p in _arrays(m)])  # load now, not at step 1
    return weights


def _matrices(w: Weights) -> list[Any]:
    out: list[Any] = [w.embed, w.output, w.out_norm]
    for lw in w.layers:
        out += [lw.attn_norm, lw.wqkv, lw.wo, lw.ffn_norm]
        optional = (lw.w_gate_up, lw.w_down, lw.moe, lw.bqkv, lw.q_norm, lw.k_norm)
        out += [a for a in optional if a is not None]
    return out


def _arrays(m: Any) -> list[Any]:
    if isinstance(m, MLXMatrix):
        return [a for p in m.parts for a in (p.arrays if isinstance(p, MLXQuant) else (p,))]
    if isinstance(m, MLXExperts):
        return m.arrays
    return [m]
