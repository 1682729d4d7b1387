"""Llama (Llama 2, Llama 3 and 3.1-3.3, the default model SmolLM2): pre-norm attention with
rotary positions and grouped-query heads, then a SwiGLU MLP, each added to the residual.
The file's q and k rows rotate adjacent pairs: the loader reorders them into halves."""

from __future__ import annotations

from engine.loader.tensors import LayerTensors
from engine.loader.weights import LayerWeights
from engine.models.family import Array, Family, LayerOps


def swiglu(x: Array, lw: LayerWeights, ops: LayerOps) -> Array:
    """The MLP of x [N, dim], normed first: W_down (SiLU(x W_gate) * x W_up)."""
    gate_up = ops.matmul(ops.norm(x, lw.ffn_norm), lw.w_gate_up)  # [N, 2 * ffn]
    return ops.matmul(ops.silu_mul(gate_up), lw.w_down)


def layer(x: Array, lw: LayerWeights, i: int, ops: LayerOps) -> Array:
    qkv = ops.matmul(ops.norm(x, lw.attn_norm), lw.wqkv)  # [N, q_dim + 2 * kv_dim]
    x = ops.residual(x, ops.matmul(ops.attend(qkv, i), lw.wo))
    return ops.residual(x, swiglu(x, lw, ops))


FAMILY = Family(
    architectures=("llama",),
    tensors=LayerTensors(rope_in_pairs=True, qkv_bias=False, qk_norm=False),
    native_layers=True,
    layer=layer,
)
