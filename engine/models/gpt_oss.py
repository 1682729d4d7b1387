"""gpt-oss (gpt-oss-20b and -120b; llama.cpp's openai-moe): biases on q, k, v and the
attention's output, a learned sink logit per head in every softmax's denominator, every
other layer (the first of each pair) attending to a sliding window, YaRN rope (NEOX
halves); then a mixture of experts with biases, routed by the top k of the router's raw
logits weighted by their softmax, through a clamped SwiGLU (engine/ops/moe.py). The FFN's
norm is the file's post_attention_norm."""

from __future__ import annotations

from engine.loader.tensors import LayerTensors
from engine.loader.weights import LayerWeights
from engine.models.family import Array, Family, LayerOps


def layer(x: Array, lw: LayerWeights, i: int, ops: LayerOps) -> Array:
    qkv = ops.add_bias(ops.matmul(ops.norm(x, lw.attn_norm), lw.wqkv), lw.bqkv)
    attended = ops.attend(qkv, i, lw.window, lw.sinks)  # [N, q_dim]
    x = ops.residual(x, ops.add_bias(ops.matmul(attended, lw.wo), lw.bo))
    assert lw.moe is not None  # the loader reads the experts of a family that has them
    return ops.residual(x, ops.experts(ops.norm(x, lw.ffn_norm), lw.moe))


FAMILY = Family(
    architectures=("gpt-oss",),
    tensors=LayerTensors(
        rope_in_pairs=False,
        qkv_bias=True,
        qk_norm=False,
        experts=True,
        out_bias=True,
        sinks=True,
        expert_biases=True,
        ffn_norm="post_attention_norm",
        window_every=2,
    ),
    native_layers=True,
    layer=layer,
)
