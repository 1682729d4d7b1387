"""Qwen 2 and 2.5: Llama's layer with biases on the q, k and v products; the file's q and k
rows rotate halves (NEOX) as the engine does."""

from __future__ import annotations

from engine.loader.tensors import LayerTensors
from engine.loader.weights import LayerWeights
from engine.models.family import Array, Family, LayerOps
from engine.models.llama import swiglu


def layer(x: Array, lw: LayerWeights, i: int, ops: LayerOps) -> Array:
    qkv = ops.matmul(ops.norm(x, lw.attn_norm), lw.wqkv)  # [N, q_dim + 2 * kv_dim]
    qkv = ops.add_bias(qkv, lw.bqkv)
    x = ops.residual(x, ops.matmul(ops.attend(qkv, i), lw.wo))
    return ops.residual(x, swiglu(x, lw, ops))


FAMILY = Family(
    architectures=("qwen2",),
    tensors=LayerTensors(rope_in_pairs=False, qkv_bias=True, qk_norm=False),
    native_layers=True,
    layer=layer,
)
