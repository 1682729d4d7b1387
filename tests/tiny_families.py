"""Tiny random-weight models of the families beside the default model, each with its real
vocabulary and tokenizer (tests/fixtures/*_vocab.json.xz): `llama3`, shaped as Llama 3.2
(architecture llama, BOS, RoPE frequency factors) and `qwen2`, shaped as Qwen 2.5
(architecture qwen2: biases on q, k and v; no BOS); both with grouped-query attention and
the output tied to the embedding. Written the same way by the fixture maker that ran
llama.cpp on them (tests/reference/make_family_fixtures.py) and by the tests that compare."""

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


@dataclass(frozen=True, slots=True)
class Family:
    arch: str
    vocab: str  # the fixture file
    add_bos: bool
    rope_factors: bool
    biases: bool
    texts: tuple[str, ...]  # what the reference ran: plain text, the chat markup, code


CODE = "def f(x):\n    return x ** 2  # 日本語, émigré's café\n" * 2
FAMILIES = {
    "llama3": Family("llama", "llama3_vocab.json.xz", True, True, False, (
        "Hello world, 12345!",
        "<|start_header_id|>user<|end_header_id|>\n\nWhy is the sky blue?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n",
        CODE)),
    "qwen2": Family("qwen2", "qwen2_vocab.json.xz", False, False, True, (
        "Hello world, 12345!",
        "<|im_start|>user\nWhy is the sky blue?<|im_end|>\n<|im_start|>assistant\n",
        CODE)),
}  # fmt: skip


def family_vocab(name: str) -> dict[str, Any]:
    """A family's fixture: its `tokenizer.*` metadata and llama.cpp's test cases."""
    data: dict[str, Any] = json.loads(
        lzma.decompress((FIXTURES / FAMILIES[name].vocab).read_bytes())
    )
    return data


def write_tiny(path: Path, name: str, chat_template: str | None = None) -> Path:
    """Write family `name`'s tiny model to `path` (~75 MB: the embedding is float32), with
    `chat_template` when given."""
    family, meta = FAMILIES[name], family_vocab(name)["metadata"]
    tokens, arch = meta["tokenizer.ggml.tokens"], family.arch
    w = gguf.GGUFWriter(path, arch)
    for key, value in SHAPE.items():
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
    dim, kv_dim = SHAPE["embedding_length"], 2 * SHAPE["rope.dimension_count"]
    w.add_tensor("token_embd.weight", random_matrix(rng, len(tokens), dim, 1.0))
    for i in range(SHAPE["block_count"]):
        layer = random_layer(rng, f"blk.{i}.", dim, kv_dim, SHAPE["feed_forward_length"])
        if family.biases:  # Qwen's are large: they move every query and key
            for x, rows in (("q", dim), ("k", kv_dim), ("v", kv_dim)):
                layer[f"blk.{i}.attn_{x}.bias"] = random_matrix(rng, 1, rows, 1.0)[0]
        for tensor, array in layer.items():
            w.add_tensor(tensor, array)
    w.add_tensor("output_norm.weight", random_norm(rng, dim))
    if family.rope_factors:
        w.add_tensor("rope_freqs.weight", ROPE_FACTORS)
    write_and_close(w)
    return path
