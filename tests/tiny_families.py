"""Tiny random-weight models of the families beside the default model, each with its real
vocabulary and tokenizer (tests/fixtures/*_vocab.json.xz): `llama3`, shaped as Llama 3.2
(architecture llama, BOS, RoPE frequency factors), `qwen2`, shaped as Qwen 2.5
(architecture qwen2: biases on q, k and v; no BOS) and `qwen3`, shaped as Qwen 3 (each
head's q and k RMS-normed before rope; heads x head_dim wider than the embedding, as Qwen 3
0.6B's 16 x 128 on 1024 and 4B's 32 x 128 on 2560; Qwen 2's vocabulary and split); all
with grouped-query attention and the output tied to the embedding. Written the same way by
the fixture maker that ran llama.cpp on them (tests/reference/make_family_fixtures.py) and
by the tests that compare."""

from __future__ import annotations

import json
import lzma
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.tiny_gguf import random_layer, random_matrix, random_norm, write_and_close

FIXTURES = Path(__file__).parent / "fixtures"
SHAPE = {"block_count": 2, "context_length": 512, "embedding_length": 128,
         "feed_forward_length": 256, "attention.head_count": 4, "attention.head_count_kv": 2,
         "rope.dimension_count": 32}  # fmt: skip
ROPE_BASE = 10000.0  # Llama 3's is 500,000, Qwen's 1,000,000: this turns more frequencies
# frequency i divided by these (Llama 3.1's ramp is 1 for the fast ones and 8 for the slow;
# these differ at every frequency, so a factor applied to the wrong one changes the logits)
ROPE_FACTORS = np.geomspace(1.0, 8.0, 16).astype(np.float32)
SEED = 3
EXPERT_KEYS = ("expert_count", "expert_used_count", "expert_feed_forward_length")


@dataclass(frozen=True, slots=True)
class Family:
    arch: str
    vocab: str  # the fixture file
    add_bos: bool
    rope_factors: bool
    biases: bool
    texts: tuple[str, ...]  # what the reference ran: plain text, the chat markup, code
    qk_norms: bool = False
    head_dim: int | None = None  # written as attention.key_length (None: dim / heads)
    experts: tuple[int, int, int] | None = None  # count, used a token, each one's FFN width
    layers: int = SHAPE["block_count"]


CODE = "def f(x):\n    return x ** 2  # 日本語, émigré's café\n" * 2
FAMILIES = {
    "llama3": Family(
        "llama",
        "llama3_vocab.json.xz",
        True,
        True,
        False,
        (
            "Hello world, 12345!",
            "<|start_header_id|>user<|end_header_id|>\n\nWhy is the sky blue?<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n",
            CODE,
        ),
    ),
    "qwen2": Family(
        "qwen2",
        "qwen2_vocab.json.xz",
        False,
        False,
        True,
        (
            "Hello world, 12345!",
            "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n",
            CODE,
        ),
    ),
    "qwen3": Family(
        "qwen3",
        "qwen2_vocab.json.xz",
        False,
        False,
        False,
        (
            "Hello world, 12345!",
            "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n",
            CODE,
        ),
        qk_norms=True,
        head_dim=64,
    ),
    "qwen3moe": Family(
        "qwen3moe",
        "qwen2_vocab.json.xz",
        False,
        False,
        False,
        (
            "Hello world, 12345!",
            "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n",
            CODE,
        ),
        qk_norms=True,
        head_dim=64,
        experts=(8, 2, 64),
        layers=3,
    ),
}


def family_vocab(name: str) -> dict[str, Any]:
    """A family's fixture: its `tokenizer.*` metadata and llama.cpp's test cases."""
    data: dict[str, Any] = json.loads(
        lzma.decompress((FIXTURES / FAMILIES[name].vocab).read_bytes())
    )
    return data


def shape_keys(family: Family) -> dict[str, int]:
    """The `{arch}.*` sizes written for `family`: SHAPE, or with its own head size as
    Qwen 3's files give it (key_length and value_length, no rope.dimension_count)."""
    if family.head_dim is None:
        return SHAPE
    shape = {k: v for k, v in SHAPE.items() if k != "rope.dimension_count"}
    sizes = {"attention.key_length": family.head_dim, "attention.value_length": family.head_dim}
    return {**shape, **sizes}


def family_layer(rng: np.random.Generator, family: Family, i: int) -> dict[str, np.ndarray]:
    """Block i's tensors by GGUF name, drawn from `rng` in file order."""
    dim, head_dim = SHAPE["embedding_length"], family.head_dim or SHAPE["rope.dimension_count"]
    q_dim = SHAPE["attention.head_count"] * head_dim
    kv_dim = SHAPE["attention.head_count_kv"] * head_dim
    layer = random_layer(rng, f"blk.{i}.", dim, kv_dim, SHAPE["feed_forward_length"])
    if q_dim != dim:  # the wider q and output of Qwen 3's shape, drawn after the layer's
        layer[f"blk.{i}.attn_q.weight"] = random_matrix(rng, q_dim, dim, 0.1)
        layer[f"blk.{i}.attn_output.weight"] = random_matrix(rng, dim, q_dim, 0.1)
    if family.biases:  # Qwen's are large: they move every query and key
        for x, rows in (("q", dim), ("k", kv_dim), ("v", kv_dim)):
            layer[f"blk.{i}.attn_{x}.bias"] = random_matrix(rng, 1, rows, 1.0)[0]
    if family.qk_norms:  # far from 1 (0.2 to 5): a norm left out or misplaced shows
        for x in "qk":
            scale = np.exp(0.6 * rng.standard_normal(head_dim)).astype(np.float32)
            layer[f"blk.{i}.attn_{x}_norm.weight"] = scale
    if family.experts is not None:
        for kind in ("gate", "up", "down"):
            del layer[f"blk.{i}.ffn_{kind}.weight"]
        layer |= expert_tensors(rng, f"blk.{i}.", dim, family.experts)
    return layer


def expert_tensors(
    rng: np.random.Generator, prefix: str, dim: int, experts: tuple[int, int, int]
) -> dict[str, np.ndarray]:
    """A mixture-of-experts layer's router [E, dim] and experts [E, ffn, dim] and
    [E, dim, ffn]: the router's logits spread wide (a few units) so that no row's k-th and
    k+1-th experts come near a tie that float rounding could flip."""
    count, _, ffn = experts
    return {
        prefix + "ffn_gate_inp.weight": random_matrix(rng, count, dim, 0.5),
        prefix + "ffn_gate_exps.weight": random_experts(rng, count, ffn, dim),
        prefix + "ffn_up_exps.weight": random_experts(rng, count, ffn, dim),
        prefix + "ffn_down_exps.weight": random_experts(rng, count, dim, ffn),
    }


def random_experts(rng: np.random.Generator, count: int, rows: int, cols: int) -> np.ndarray:
    return np.stack([random_matrix(rng, rows, cols, 0.1) for _ in range(count)])


def write_tiny(
    path: Path,
    name: str,
    chat_template: str | None = None,
    matrix_type: gguf.GGMLQuantizationType | None = None,
    extras: dict[str, int | float | bool | np.ndarray] | None = None,
) -> Path:
    """Write family `name`'s tiny model to `path` (~75 MB: the embedding is float32), with
    `chat_template` when given, the layers' matrices as `matrix_type` (None: F32) and
    `extras` after the rest: `{arch}.KEY` values and float32 tensors, by name."""
    family, meta = FAMILIES[name], family_vocab(name)["metadata"]
    tokens, arch = meta["tokenizer.ggml.tokens"], family.arch
    w = gguf.GGUFWriter(path, arch)
    for key, value in shape_keys(family).items():
        w.add_uint32(f"{arch}.{key}", family.layers if key == "block_count" else value)
    if family.experts is not None:
        for key, value in zip(EXPERT_KEYS, family.experts, strict=True):
            w.add_uint32(f"{arch}.{key}", value)
    w.add_uint32(f"{arch}.vocab_size", len(tokens))
    w.add_float32(f"{arch}.rope.freq_base", ROPE_BASE)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    for key in ("model", "pre"):
        w.add_string(f"tokenizer.ggml.{key}", meta[f"tokenizer.ggml.{key}"])
    for key in ("tokens", "token_type", "merges"):
        w.add_array(f"tokenizer.ggml.{key}", meta[f"tokenizer.ggml.{key}"])
    for key in ("bos_token_id", "eos_token_id"):
        w.add_uint32(f"tokenizer.ggml.{key}", meta[f"tokenizer.ggml.{key}"])
    w.add_bool("tokenizer.ggml.add_bos_token", family.add_bos)
    if chat_template is not None:
        w.add_string("tokenizer.chat_template", chat_template)
    rng = np.random.default_rng(SEED)
    w.add_tensor(
        "token_embd.weight", random_matrix(rng, len(tokens), SHAPE["embedding_length"], 1.0)
    )
    for i in range(family.layers):
        for tensor, array in family_layer(rng, family, i).items():
            if matrix_type is not None and array.ndim >= 2 and "ffn_gate_inp" not in tensor:
                quantized = gguf.quants.quantize(array, matrix_type)
                w.add_tensor(tensor, quantized, raw_dtype=matrix_type)
            else:
                w.add_tensor(tensor, array)
    w.add_tensor("output_norm.weight", random_norm(rng, SHAPE["embedding_length"]))
    if family.rope_factors:
        w.add_tensor("rope_freqs.weight", ROPE_FACTORS)
    add_extras(w, arch, extras or {})
    write_and_close(w)
    return path


def add_extras(
    w: gguf.GGUFWriter, arch: str, extras: dict[str, int | float | bool | np.ndarray]
) -> None:
    for name, value in extras.items():
        if isinstance(value, np.ndarray):
            w.add_tensor(name, value)
        elif isinstance(value, bool):
            w.add_bool(f"{arch}.{name}", value)
        elif isinstance(value, int):
            w.add_uint32(f"{arch}.{name}", value)
        else:
            w.add_float32(f"{arch}.{name}", value)
