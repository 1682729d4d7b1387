"""A tiny random-weight gpt-oss model: 4 layers alternating a 16-position sliding window
and full attention, a sink logit per head, biases on q, k, v, the attention's output, the
router and the experts, 8 experts of which a token takes 4 (gpt-oss's top 4), stored in
MXFP4 as gpt-oss's files store them, YaRN (factor 32 over 64 original positions, so that
the tiny head's frequencies span the blend), and Qwen 2's vocabulary marked with GPT-4o's
pre-split (gpt-oss's own vocabulary of 201,088 tokens ships in no package here).

llama.cpp's MXFP4 products quantize their activations to 8 bits, so its float32 reference
runs the twin of the file whose experts hold the same values (MXFP4's, decoded exactly) in
F32 (`experts_f32`); everything else is the same bytes. Written the same way by the fixture
maker (tests/reference/make_family_fixtures.py) and by the tests that compare."""

from __future__ import annotations

import json
import lzma
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from tests.tiny_families import FIXTURES, expert_tensors
from tests.tiny_gguf import random_layer, random_matrix, random_norm, write_and_close

ARCH = "gpt-oss"
DIM, HEADS, KV_HEADS, HEAD_DIM, LAYERS, CONTEXT = 128, 4, 2, 64, 4, 512
EXPERTS = (8, 4, 64)  # count, used a token, each one's FFN width
WINDOW = 16  # positions a windowed layer sees: the texts below run past it
ROPE_BASE = 10000.0
SEED = 5
MXFP4 = gguf.GGMLQuantizationType.MXFP4
TEXTS = (
    "Hello world, 12345! " * 3,
    "<|im_start|>user\nWhy is the sky blue? Tell me in two sentences.<|im_end|>\n"
    "<|im_start|>assistant\n",
    "def f(x):\n    return x ** 2  # 日本語, émigré's café\n" * 2,
)
# GPT-4o's split where it differs from the others': case runs, contractions on capitals,
# digits in threes, punctuation with its slashes and line ends
TOKENIZER_TEXTS = (
    "HelloWORLDAgain CamelCaseName XMLHttpRequest",
    "I'M here, you'RE there; don't WON'T",
    "1234567 12 3.14159 2024-12-06",
    "path/to/file.py//\n\n\nnext  \t line",
    "naïve façade Ñandú ÉCOLE",
)


def vocab() -> dict[str, Any]:
    """Qwen 2's `tokenizer.*` metadata (tests/fixtures/qwen2_vocab.json.xz)."""
    data: dict[str, Any] = json.loads(
        lzma.decompress((FIXTURES / "qwen2_vocab.json.xz").read_bytes())
    )
    return data["metadata"]


def layer_tensors(rng: np.random.Generator, i: int) -> dict[str, np.ndarray]:
    """Block i's tensors by GGUF name, drawn from `rng` in file order."""
    p, q_dim, kv_dim = f"blk.{i}.", HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    base = random_layer(rng, p, DIM, kv_dim, 8)
    layer = {p + "attn_norm.weight": base[p + "attn_norm.weight"]}
    layer[p + "attn_q.weight"] = random_matrix(rng, q_dim, DIM, 0.1)
    layer[p + "attn_k.weight"] = base[p + "attn_k.weight"]
    layer[p + "attn_v.weight"] = base[p + "attn_v.weight"]
    for x, rows in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
        layer[f"{p}attn_{x}.bias"] = random_matrix(rng, 1, rows, 0.5)[0]
    layer[p + "attn_output.weight"] = random_matrix(rng, DIM, q_dim, 0.1)
    layer[p + "attn_output.bias"] = random_matrix(rng, 1, DIM, 0.5)[0]
    # sinks from -2 to 4: some heads give a sink most of their attention, some almost none
    layer[p + "attn_sinks.weight"] = rng.uniform(-2.0, 4.0, HEADS).astype(np.float32)
    layer[p + "post_attention_norm.weight"] = random_norm(rng, DIM)
    layer |= expert_tensors(rng, p, DIM, EXPERTS)
    count, _, ffn = EXPERTS
    layer[p + "ffn_gate_inp.bias"] = random_matrix(rng, 1, count, 0.5)[0]
    for kind, width in (("gate", ffn), ("up", ffn), ("down", DIM)):
        layer[f"{p}ffn_{kind}_exps.bias"] = random_matrix(rng, count, width, 0.5)
    return layer


def write_tiny_gpt_oss(
    path: Path, experts_f32: bool = False, chat_template: str | None = None
) -> Path:
    """Write the tiny model to `path` (~75 MB: the embedding is float32): its experts in
    MXFP4, or those values in F32 (`experts_f32`); with `chat_template` when given."""
    meta = vocab()
    w = gguf.GGUFWriter(path, ARCH)
    add_keys(w, meta, chat_template)
    rng = np.random.default_rng(SEED)
    vocab_size = len(meta["tokenizer.ggml.tokens"])
    w.add_tensor("token_embd.weight", random_matrix(rng, vocab_size, DIM, 1.0))
    for i in range(LAYERS):
        for name, array in layer_tensors(rng, i).items():
            if name.endswith("_exps.weight"):
                quantized = gguf.quants.quantize(array, MXFP4)
                if experts_f32:
                    w.add_tensor(name, gguf.quants.dequantize(quantized, MXFP4).astype(np.float32))
                else:
                    w.add_tensor(name, quantized, raw_dtype=MXFP4)
            else:
                w.add_tensor(name, array)
    w.add_tensor("output_norm.weight", random_norm(rng, DIM))
    w.add_tensor("output.weight", random_matrix(rng, vocab_size, DIM, 0.1))
    write_and_close(w)
    return path


def add_keys(
    w: gguf.GGUFWriter, meta: dict[str, Any], chat_template: str | None, layers: int = LAYERS
) -> None:
    """The model's shape, rope and tokenizer keys."""
    sizes = {
        "block_count": layers,
        "context_length": CONTEXT,
        "embedding_length": DIM,
        "feed_forward_length": EXPERTS[2],
        "attention.head_count": HEADS,
        "attention.head_count_kv": KV_HEADS,
        "attention.key_length": HEAD_DIM,
        "attention.value_length": HEAD_DIM,
        "attention.sliding_window": WINDOW,
        "expert_count": EXPERTS[0],
        "expert_used_count": EXPERTS[1],
        "expert_feed_forward_length": EXPERTS[2],
        "rope.scaling.original_context_length": 64,
    }
    for key, value in sizes.items():
        w.add_uint32(f"{ARCH}.{key}", value)
    w.add_uint32(f"{ARCH}.vocab_size", len(meta["tokenizer.ggml.tokens"]))
    w.add_float32(f"{ARCH}.rope.freq_base", ROPE_BASE)
    w.add_string(f"{ARCH}.rope.scaling.type", "yarn")
    w.add_float32(f"{ARCH}.rope.scaling.factor", 32.0)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_string("tokenizer.ggml.model", meta["tokenizer.ggml.model"])
    w.add_string("tokenizer.ggml.pre", "gpt-4o")
    for key in ("tokens", "token_type", "merges"):
        w.add_array(f"tokenizer.ggml.{key}", meta[f"tokenizer.ggml.{key}"])
    for key in ("bos_token_id", "eos_token_id"):
        w.add_uint32(f"tokenizer.ggml.{key}", meta[f"tokenizer.ggml.{key}"])
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    if chat_template is not None:
        w.add_string("tokenizer.chat_template", chat_template)
