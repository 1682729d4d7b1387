"""Qwen 3 mixture of experts (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B): dense Qwen 3's attention
(each head's q and k RMS-normed before rope, NEOX halves), then in place of the MLP a
softmax router over E experts whose top k SwiGLU FFNs each token goes through, weighted by
their probabilities renormalised over the k."""

from __future__ import annotations

from engine.loader.tensors import LayerTensors
from engine.loader.weights import LayerWeights
from engine.models.family import Array, Family, LayerOps


def layer(x: Array, lw: LayerWeights, i: int, ops: LayerOps) -> Array:
    qkv = ops.matmul(ops.norm(x, lw.attn_norm), lw.wqkv)  # [N, q_dim + 2 * kv_dim]
    qkv = ops.head_norms(qkv, lw.q_norm, lw.k_norm)
    x = ops.residual(x, ops.matmul(ops.attend(qkv, i), lw.wo))
    assert lw.moe is not None  # the loader reads the experts of a family that has them
    return ops.residual(x, ops.experts(ops.norm(x, lw.ffn_norm), lw.moe))


FAMILY = Family(
    architectures=("qwen3moe",),
    tensors=LayerTensors(rope_in_pairs=False, qkv_bias=False, qk_norm=True, experts=True),
    native_layers=True,
    layer=layer,
)
