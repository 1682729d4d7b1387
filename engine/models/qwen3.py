"""Qwen 3 dense: Llama's layer with each head's q and k RMS-normed (one weight of head_dim
for every head) before rope, no biases; heads x head_dim may be wider than the embedding
(0.6B: 16 x 128 on 1024). The file's q and k rows rotate halves (NEOX)."""

from __future__ import annotations

from engine.loader.tensors import LayerTensors
from engine.loader.weights import LayerWeights
from engine.models.family import Array, Family, LayerOps
from engine.models.llama import swiglu


def layer(x: Array, lw: LayerWeights, i: int, ops: LayerOps) -> Array:
    qkv = ops.matmul(ops.norm(x, lw.attn_norm), lw.wqkv)  # [N, q_dim + 2 * kv_dim]
    qkv = ops.head_norms(qkv, lw.q_norm, lw.k_norm)
    x = ops.residual(x, ops.matmul(ops.attend(qkv, i), lw.wo))
    return ops.residual(x, swiglu(x, lw, ops))


FAMILY = Family(
    architectures=("qwen3",),
    tensors=LayerTensors(rope_in_pairs=False, qkv_bias=False, qk_norm=True),
    native_layers=True,
    layer=layer,
)
