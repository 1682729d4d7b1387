"""Tiny random-weight llama GGUF files for unit tests, written with `gguf.GGUFWriter`.

The layout follows the real default model: metadata keys under `{arch}.`, a GPT-2 byte-level
tokenizer with ChatML control tokens, and tensors stored as numpy [out, in] (GGUF shape
[in, out]). Q and K are interpreted as ggml's normal rope mode: adjacent pairs (2i, 2i+1).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_ID = 2
BOS_ID = 1
# merges in rank order; each merged token is added to the vocab in this order
MERGES = (("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("e", "r"), ("Ġ", "a"))
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
MATRIX_NAMES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte value 0..255."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in chars]
    chars.update({b: chr(256 + n) for n, b in enumerate(others)})
    return [chars[b] for b in range(256)]


def tiny_vocab() -> tuple[list[str], list[int], list[str]]:
    """Tokens, token types and merges of the tiny tokenizer."""
    tokens = [*CONTROL_TOKENS, *byte_alphabet(), *(a + b for a, b in MERGES)]
    types = [3] * len(CONTROL_TOKENS) + [1] * (len(tokens) - len(CONTROL_TOKENS))
    return tokens, types, [f"{a} {b}" for a, b in MERGES]


VOCAB_SIZE = len(tiny_vocab()[0])


def write_tiny_llama(
    path: str | Path,
    *,
    arch: str = "llama",
    num_layers: int = 2,
    dim: int = 64,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    ffn_dim: int = 128,
    context_length: int = 256,
    seed: int = 0,
    quantize: bool = False,
    drop_tensor: str | None = None,
    tie_embeddings: bool = False,
    rope_base: float = 10000.0,
    rms_eps: float = 1e-5,
    metadata: dict[str, int | None] | None = None,
    tokenizer_model: str = "gpt2",
) -> Path:
    """Write a random-weight llama GGUF file to `path` and return the path.

    With `tie_embeddings=False` an `output.weight` is written whose rows for the control
    tokens are zero, so greedy decoding never picks an end-of-turn token (their logit is 0
    while the best of the others is well above it). `quantize=True` stores the matrices
    (and the embedding) as Q8_0; the norms stay F32. `drop_tensor` leaves that tensor out.
    `metadata` overrides integer keys (without the `{arch}.` prefix for the model's own keys,
    e.g. {"feed_forward_length": 96}); None leaves the key out.
    """
    path = Path(path)
    rng = np.random.default_rng(seed)
    tokens, types, merges = tiny_vocab()
    vocab = len(tokens)
    head_dim = dim // num_heads
    kv_dim = num_kv_heads * head_dim

    w = gguf.GGUFWriter(path, arch)
    ints: dict[str, int | None] = {
        f"{arch}.block_count": num_layers,
        f"{arch}.context_length": context_length,
        f"{arch}.embedding_length": dim,
        f"{arch}.feed_forward_length": ffn_dim,
        f"{arch}.attention.head_count": num_heads,
        f"{arch}.attention.head_count_kv": num_kv_heads,
        f"{arch}.rope.dimension_count": head_dim,
        f"{arch}.vocab_size": vocab,
        "tokenizer.ggml.bos_token_id": BOS_ID,
        "tokenizer.ggml.eos_token_id": EOS_ID,
    }
    for key, value in (metadata or {}).items():
        ints[key if key.startswith("tokenizer.") else f"{arch}.{key}"] = value
    for key, value in ints.items():
        if value is not None:
            w.add_uint32(key, value)
    w.add_float32(f"{arch}.rope.freq_base", rope_base)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", rms_eps)
    w.add_string("tokenizer.ggml.model", tokenizer_model)
    w.add_string("tokenizer.ggml.pre", "smollm")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", CHATML_TEMPLATE)

    def matrix(rows: int, cols: int, scale: float) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tensors: dict[str, np.ndarray] = {"token_embd.weight": matrix(vocab, dim, 1.0)}
    for i in range(num_layers):
        p = f"blk.{i}."
        tensors[p + "attn_norm.weight"] = norm(dim)
        tensors[p + "attn_q.weight"] = matrix(dim, dim, 0.1)
        tensors[p + "attn_k.weight"] = matrix(kv_dim, dim, 0.1)
        tensors[p + "attn_v.weight"] = matrix(kv_dim, dim, 0.1)
        tensors[p + "attn_output.weight"] = matrix(dim, dim, 0.1)
        tensors[p + "ffn_norm.weight"] = norm(dim)
        tensors[p + "ffn_gate.weight"] = matrix(ffn_dim, dim, 0.1)
        tensors[p + "ffn_up.weight"] = matrix(ffn_dim, dim, 0.1)
        tensors[p + "ffn_down.weight"] = matrix(dim, ffn_dim, 0.1)
    tensors["output_norm.weight"] = norm(dim)
    if not tie_embeddings:
        out = matrix(vocab, dim, 0.25)
        out[: len(CONTROL_TOKENS)] = 0.0
        tensors["output.weight"] = out

    for name, array in tensors.items():
        if name == drop_tensor:
            continue
        if quantize and array.ndim == 2:
            q8 = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(array, q8), raw_dtype=q8)
        else:
            w.add_tensor(name, array)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
