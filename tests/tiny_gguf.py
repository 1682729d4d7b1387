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
    matrix_type: gguf.GGMLQuantizationType | None = None,
    drop_tensor: str | None = None,
    tie_embeddings: bool = False,
    rope_base: float = 10000.0,
    rms_eps: float = 1e-5,
    metadata: dict[str, int | None] | None = None,
    tokenizer_model: str = "gpt2",
    extras: dict[str, str | float | np.ndarray] | None = None,
) -> Path:
    """Write a random-weight llama GGUF file to `path` and return the path.

    With `tie_embeddings=False` an `output.weight` is written whose rows for the control
    tokens are zero, so greedy decoding never picks an end-of-turn token (their logit is 0
    while the best of the others is well above it). The matrices (and the embedding) are
    stored as `matrix_type` (a type gguf-py can quantize; None: F32), the norms as F32.
    `drop_tensor` leaves that tensor out. `metadata` overrides integer keys (no `{arch}.`
    prefix for the model's own keys, e.g. {"feed_forward_length": 96}; None drops a key);
    `extras` adds keys (full names; str or float values) and tensors (arrays) as they are."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, arch)
    sizes = {"block_count": num_layers, "context_length": context_length,
             "embedding_length": dim, "feed_forward_length": ffn_dim,
             "attention.head_count": num_heads, "attention.head_count_kv": num_kv_heads,
             "rope.dimension_count": dim // num_heads, "vocab_size": VOCAB_SIZE}  # fmt: skip
    add_integer_keys(w, arch, sizes, metadata)
    floats = {f"{arch}.rope.freq_base": rope_base,
              f"{arch}.attention.layer_norm_rms_epsilon": rms_eps}  # fmt: skip
    add_extras(w, {**floats, **(extras or {})})
    add_tokenizer(w, tokenizer_model)
    kv_dim = num_kv_heads * (dim // num_heads)
    tensors = random_tensors(rng, num_layers, dim, kv_dim, ffn_dim, tie_embeddings)
    add_tensors(w, tensors, matrix_type=matrix_type, drop_tensor=drop_tensor)
    write_and_close(w)
    return path


def add_extras(w: gguf.GGUFWriter, extras: dict[str, str | float | np.ndarray]) -> None:
    """Add each of `extras`: arrays as tensors, strings and floats as keys."""
    for name, value in extras.items():
        if isinstance(value, np.ndarray):
            w.add_tensor(name, value)
        elif isinstance(value, str):
            w.add_string(name, value)
        else:
            w.add_float32(name, value)


def add_integer_keys(
    w: gguf.GGUFWriter,
    arch: str,
    sizes: dict[str, int],
    overrides: dict[str, int | None] | None,
) -> None:
    """Add the model's `sizes` (under `{arch}.`) and the BOS/EOS ids as uint32 keys, with
    `overrides` applied first (a key is prefixed unless it starts with `tokenizer.`; a None
    value leaves the key out)."""
    ints: dict[str, int | None] = {f"{arch}.{key}": value for key, value in sizes.items()}
    ints["tokenizer.ggml.bos_token_id"] = BOS_ID
    ints["tokenizer.ggml.eos_token_id"] = EOS_ID
    for key, value in (overrides or {}).items():
        ints[key if key.startswith("tokenizer.") else f"{arch}.{key}"] = value
    for key, value in ints.items():
        if value is not None:
            w.add_uint32(key, value)


def add_tokenizer(w: gguf.GGUFWriter, tokenizer_model: str) -> None:
    """Add the tiny tokenizer's keys, naming `tokenizer_model` as its model, and the ChatML
    template."""
    tokens, types, merges = tiny_vocab()
    w.add_string("tokenizer.ggml.model", tokenizer_model)
    w.add_string("tokenizer.ggml.pre", "smollm")
    w.add_array("tokenizer.ggml.tokens", tokens)
    w.add_array("tokenizer.ggml.token_type", types)
    w.add_array("tokenizer.ggml.merges", merges)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    w.add_string("tokenizer.chat_template", CHATML_TEMPLATE)


def random_matrix(rng: np.random.Generator, rows: int, cols: int, scale: float) -> np.ndarray:
    """A float32 [rows, cols] matrix of normal values times `scale`."""
    return (rng.standard_normal((rows, cols)) * scale).astype(np.float32)


def random_norm(rng: np.random.Generator, n: int) -> np.ndarray:
    """A float32 norm weight of `n` values near 1."""
    return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)


def random_tensors(
    rng: np.random.Generator,
    num_layers: int,
    dim: int,
    kv_dim: int,
    ffn_dim: int,
    tie_embeddings: bool,
) -> dict[str, np.ndarray]:
    """Every tensor of the model by GGUF name, in file order (which is also the order they
    are drawn from `rng`); `output.weight` has zero rows for the control tokens."""
    tensors = {"token_embd.weight": random_matrix(rng, VOCAB_SIZE, dim, 1.0)}
    for i in range(num_layers):
        tensors.update(random_layer(rng, f"blk.{i}.", dim, kv_dim, ffn_dim))
    tensors["output_norm.weight"] = random_norm(rng, dim)
    if not tie_embeddings:
        out = random_matrix(rng, VOCAB_SIZE, dim, 0.25)
        out[: len(CONTROL_TOKENS)] = 0.0
        tensors["output.weight"] = out
    return tensors


def random_layer(
    rng: np.random.Generator, prefix: str, dim: int, kv_dim: int, ffn_dim: int
) -> dict[str, np.ndarray]:
    """One transformer block's tensors, names starting with `prefix`."""
    return {
        prefix + "attn_norm.weight": random_norm(rng, dim),
        prefix + "attn_q.weight": random_matrix(rng, dim, dim, 0.1),
        prefix + "attn_k.weight": random_matrix(rng, kv_dim, dim, 0.1),
        prefix + "attn_v.weight": random_matrix(rng, kv_dim, dim, 0.1),
        prefix + "attn_output.weight": random_matrix(rng, dim, dim, 0.1),
        prefix + "ffn_norm.weight": random_norm(rng, dim),
        prefix + "ffn_gate.weight": random_matrix(rng, ffn_dim, dim, 0.1),
        prefix + "ffn_up.weight": random_matrix(rng, ffn_dim, dim, 0.1),
        prefix + "ffn_down.weight": random_matrix(rng, dim, ffn_dim, 0.1),
    }


def add_tensors(
    w: gguf.GGUFWriter,
    tensors: dict[str, np.ndarray],
    *,
    matrix_type: gguf.GGMLQuantizationType | None,
    drop_tensor: str | None,
) -> None:
    """Add `tensors` but `drop_tensor`; the matrices as `matrix_type` when given."""
    for name, array in tensors.items():
        if name == drop_tensor:
            continue
        if matrix_type is not None and array.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(array, matrix_type), raw_dtype=matrix_type)
        else:
            w.add_tensor(name, array)


def write_and_close(w: gguf.GGUFWriter) -> None:
    """Write the header, the keys and the tensors to the file, and close it."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
