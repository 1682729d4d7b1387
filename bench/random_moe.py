"""The mixture-of-experts part of the benchmark models (bench.random_model): each layer's
router and experts in place of a dense FFN, and the `{arch}.expert_*` keys.

Per layer, as llama.cpp's qwen3moe loader expects them (numpy shapes, rows last):
- `ffn_gate_inp.weight` [E, dim], F32: the router. Its random weights are small (logits of
  about unit size), so each token's top k is an unbiased draw: tokens route near-uniformly
  over the experts, the worst case for grouping rows by expert (a trained router's favourites
  would let B rows share fewer experts).
- `ffn_gate_exps.weight` and `ffn_up_exps.weight` [E, expert_ffn, dim] and
  `ffn_down_exps.weight` [E, dim, expert_ffn], each expert's weights of root mean square
  1 / sqrt(its row length), as the dense matrices: activations stay near unit size.

Their types follow llama.cpp's quantizer (bench.random_weights): under q4_k_m the gate and up
experts are Q4_K and the down experts Q6_K on use_more_bits layers, Q4_K elsewhere; under
q8_0 all Q8_0. The experts are random valid blocks in every type (as the K-quants elsewhere):
quantizing 600 million normal values a layer would take minutes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gguf
import numpy as np

from bench.random_weights import T, matrix_type, random_blocks

ROUTER_LOGIT_STD = 1.0  # the router's logits' standard deviation, inputs of unit size
BIAS_STD = 0.1  # gpt-oss's router and expert biases


@dataclass(frozen=True, slots=True)
class Experts:
    count: int  # E
    used: int  # each token's top k
    ffn: int  # one expert's width
    qtype: T | None = None  # the experts' type whatever the mix (gpt-oss's MXFP4); None: the mix's
    biases: bool = False  # on the router and each expert's products (gpt-oss)


def expert_tensors(
    rng: np.random.Generator, mix: str, i: int, layers: int, dim: int, experts: Experts
) -> dict[str, tuple[np.ndarray, T]]:
    """Layer i's router and experts by GGUF name: (array, type)."""
    p, e, ffn = f"blk.{i}.", experts.count, experts.ffn
    router_std = np.float32(ROUTER_LOGIT_STD / math.sqrt(dim))
    router = rng.standard_normal((e, dim), dtype=np.float32) * router_std  # [E, dim]
    out: dict[str, tuple[np.ndarray, T]] = {f"{p}ffn_gate_inp.weight": (router, T.F32)}
    # kind: (rows, k) of each expert's matrix
    matrices = {"ffn_gate_exps": (ffn, dim), "ffn_up_exps": (ffn, dim), "ffn_down_exps": (dim, ffn)}
    for kind, (rows, k) in matrices.items():
        qtype = experts.qtype or matrix_type(mix, kind, i, layers, k, tied=False)
        raw = random_blocks(rng, qtype, e * rows, k, 1 / math.sqrt(k))
        out[f"{p}{kind}.weight"] = (raw.reshape(e, rows, -1), qtype)  # [E, rows, row bytes]
        if experts.biases:
            bias = rng.standard_normal((e, rows), dtype=np.float32) * np.float32(BIAS_STD)
            out[f"{p}{kind}.bias"] = (bias, T.F32)
    if experts.biases:
        bias = rng.standard_normal(e, dtype=np.float32) * np.float32(BIAS_STD)
        out[f"{p}ffn_gate_inp.bias"] = (bias, T.F32)
    return out


def add_expert_metadata(w: gguf.GGUFWriter, arch: str, experts: Experts) -> None:
    """The `{arch}.expert_*` keys."""
    w.add_uint32(f"{arch}.expert_count", experts.count)
    w.add_uint32(f"{arch}.expert_used_count", experts.used)
    w.add_uint32(f"{arch}.expert_feed_forward_length", experts.ffn)
