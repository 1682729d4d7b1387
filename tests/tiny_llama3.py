"""A tiny random-weight model shaped as Llama 3.2 is: Meta's 128,256-token vocabulary and
Llama 3's tokenizer (from tests/fixtures/llama3_vocab.json.xz), grouped-query attention, the
output tied to the embedding, and RoPE frequency factors (`rope_freqs.weight`). Written the
same way by the fixture maker that ran llama.cpp on it and by the test that compares."""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.tiny_gguf import random_layer, random_matrix, random_norm, write_and_close

VOCAB_FIXTURE = Path(__file__).parent / "fixtures" / "llama3_vocab.json.xz"
SHAPE = {"block_count": 2, "context_length": 512, "embedding_length": 128,
         "feed_forward_length": 256, "attention.head_count": 4, "attention.head_count_kv": 2,
         "rope.dimension_count": 32}  # fmt: skip
ROPE_BASE = 10000.0  # Llama 3's is 500,000; this one turns more of the 16 frequencies
# frequency i divided by these (Llama 3.1's ramp is 1 for the fast ones and 8 for the slow;
# these differ at every frequency, so a factor applied to the wrong one changes the logits)
ROPE_FACTORS = np.geomspace(1.0, 8.0, 16).astype(np.float32)
SEED = 3
TEXTS = (  # what the reference ran: plain text, Llama 3's chat markup, code and accents
    "Hello world, 12345!",
    "<|start_header_id|>user<|end_header_id|>\n\nWhy is the sky blue?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    "def f(x):\n    return x ** 2  # 日本語, émigré's café\n" * 2,
)


def llama3_vocab() -> dict[str, Any]:
    """The fixture: Llama 3's `tokenizer.*` metadata and llama.cpp's test cases."""
    data: dict[str, Any] = json.loads(lzma.decompress(VOCAB_FIXTURE.read_bytes()))
    return data


def write_tiny_llama3(path: Path) -> Path:
    """Write the model to `path` (a 66 MB file: the embedding is 128,256 x 128 float32)."""
    meta = llama3_vocab()["metadata"]
    tokens = meta["tokenizer.ggml.tokens"]
    w = gguf.GGUFWriter(path, "llama")
    for key, value in SHAPE.items():
        w.add_uint32(f"llama.{key}", value)
    w.add_uint32("llama.vocab_size", len(tokens))
    w.add_float32("llama.rope.freq_base", ROPE_BASE)
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_string("tokenizer.ggml.model", meta["tokenizer.ggml.model"])
    w.add_string("tokenizer.ggml.pre", meta["tokenizer.ggml.pre"])
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", meta["tokenizer.ggml.token_type"])
    w.add_array("tokenizer.ggml.merges", meta["tokenizer.ggml.merges"])
    w.add_uint32("tokenizer.ggml.bos_token_id", meta["tokenizer.ggml.bos_token_id"])
    w.add_uint32("tokenizer.ggml.eos_token_id", meta["tokenizer.ggml.eos_token_id"])
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    rng = np.random.default_rng(SEED)
    dim, kv_dim = SHAPE["embedding_length"], 2 * SHAPE["rope.dimension_count"]
    w.add_tensor("token_embd.weight", random_matrix(rng, len(tokens), dim, 1.0))
    for i in range(SHAPE["block_count"]):
        layer = random_layer(rng, f"blk.{i}.", dim, kv_dim, SHAPE["feed_forward_length"])
        for name, array in layer.items():
            w.add_tensor(name, array)
    w.add_tensor("output_norm.weight", random_norm(rng, dim))
    w.add_tensor("rope_freqs.weight", ROPE_FACTORS)
    write_and_close(w)
    return path
