"""Random-weight GGUF files of real models' layer shapes, with the real vocabulary's tokenizer
(tests/fixtures/qwen2_vocab.json.xz, which Qwen 2.5 and Qwen 3 share): a new family is
checked on one of these against llama.cpp on the same file (`bench.engine --model OUT`).

    .venv/bin/python -m bench.random_model SHAPE OUT.gguf [--type q8_0|q4_k_m] [--seed N]
                                           [--no-check]

--type q8_0: every matrix Q8_0 (gguf.quants.quantize of normal values). --type q4_k_m: the
mix llama.cpp's Q4_K_M gives these models: Q4_K, with attn_v and ffn_down in Q6_K on the
layers its use_more_bits picks and the tied embedding in Q6_K, and where a row is not a
multiple of 256 (896 wide) its fallbacks, Q5_0 for Q4_K and Q8_0 for Q6_K. K-quant blocks are
random valid blocks (as tests/unit/quant_cases.py makes) whose float16 scales are set so that
a matrix of rows of K weights has a root mean square of 1 / sqrt(K): activations stay near
unit size through every layer. The check then loads the file in warmfleet and in llama.cpp,
asks for finite logits and runs a few greedy tokens on each.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from tests.tiny_families import family_vocab

T = gguf.GGMLQuantizationType
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
# a K-quant super-block's float16 d (and dmin) and the mean of its codes: dmin = d * mean
# makes each sub-block's weights d * (sc * q - mean * m), zero on average
K_SCALES = {T.Q4_K: (0, 2, 7.5), T.Q5_K: (0, 2, 15.5), T.Q6_K: (208, None, 0.0)}
FALLBACK = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}  # llama.cpp's, for rows not a multiple of 256
FILE_TYPES = {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M}
EMBED_STD = 0.1  # tied output: logits of about 0.1 * sqrt(dim) standard deviation
BIAS_STD = 0.5
CHUNK_ROWS = 8192  # rows quantized at once (the embedding has 151,936)
CHECK_TEXT = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"


@dataclass(frozen=True, slots=True)
class Shape:
    arch: str
    layers: int
    dim: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    context: int
    rope_base: float
    biases: bool = False  # on q, k and v (Qwen 2)
    qk_norms: bool = False  # each head's q and k RMS-normed (Qwen 3)


SHAPES = {
    "qwen3-0.6b": Shape("qwen3", 28, 1024, 16, 8, 128, 3072, 40960, 1e6, qk_norms=True),
    "qwen2.5-coder-0.5b": Shape("qwen2", 24, 896, 14, 2, 64, 4864, 32768, 1e6, biases=True),
}


def use_more_bits(i: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get more bits."""
    return i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2


def matrix_type(mix: str, kind: str, i: int, shape: Shape, k: int) -> T:
    """The type of layer i's matrix `kind` (or the embedding) with rows of k weights."""
    if mix == "q8_0":
        return T.Q8_0
    more_bits = kind in ("attn_v", "ffn_down") and use_more_bits(i, shape.layers)
    qtype = T.Q6_K if kind == "token_embd" or more_bits else T.Q4_K
    return FALLBACK[qtype] if k % 256 else qtype


def set_k_scales(raw: np.ndarray, qtype: T, d: np.ndarray) -> None:
    """Write the super-blocks' d [rows, blocks] (and dmin) into `raw` [rows, blocks, bytes]."""
    d_at, dmin_at, mean = K_SCALES[qtype]
    for at, value in ((d_at, d), (dmin_at, d * mean)):
        if at is not None:
            half = value.astype(np.float16)
            raw[..., at : at + 2] = half.view(np.uint8).reshape(*half.shape, 2)


def k_blocks(rng: np.random.Generator, qtype: T, rows: int, k: int, std: float) -> np.ndarray:
    """[rows, row bytes] of random valid blocks whose weights' root mean square is `std`."""
    block_bytes = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, (rows, k // 256, block_bytes), dtype=np.uint8)
    d = rng.uniform(0.5, 1.5, raw.shape[:2]).astype(np.float32)
    set_k_scales(raw, qtype, d)
    sample = gguf.quants.dequantize(raw[:16].reshape(min(rows, 16), -1), qtype)
    set_k_scales(raw, qtype, d * (std / float(np.sqrt(np.mean(sample**2)))))
    return raw.reshape(rows, -1)


def quantized(rng: np.random.Generator, qtype: T, rows: int, k: int, std: float) -> np.ndarray:
    """A random [rows, k] matrix of weights of root mean square `std`, as `qtype`'s bytes."""
    if qtype in K_QUANTS:
        return k_blocks(rng, qtype, rows, k, std)
    parts = []
    for start in range(0, rows, CHUNK_ROWS):
        values = rng.standard_normal((min(CHUNK_ROWS, rows - start), k), dtype=np.float32)
        values *= np.float32(std)
        parts.append(gguf.quants.quantize(values, qtype))
    return np.concatenate(parts)


def layer_tensors(
    rng: np.random.Generator, shape: Shape, mix: str, i: int
) -> dict[str, tuple[np.ndarray, T]]:
    """Block i's tensors by GGUF name: (array, type); norms and biases in F32."""
    dim, p = shape.dim, f"blk.{i}."
    q_dim, kv_dim = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    matrices = {
        "attn_q": (q_dim, dim),
        "attn_k": (kv_dim, dim),
        "attn_v": (kv_dim, dim),
        "attn_output": (dim, q_dim),
        "ffn_gate": (shape.ffn, dim),
        "ffn_up": (shape.ffn, dim),
        "ffn_down": (dim, shape.ffn),
    }
    out: dict[str, tuple[np.ndarray, T]] = {}
    for kind, (rows, k) in matrices.items():
        qtype = matrix_type(mix, kind, i, shape, k)
        out[f"{p}{kind}.weight"] = (quantized(rng, qtype, rows, k, 1 / math.sqrt(k)), qtype)
        if shape.biases and kind in ("attn_q", "attn_k", "attn_v"):
            bias = rng.standard_normal(rows, dtype=np.float32) * np.float32(BIAS_STD)
            out[f"{p}{kind}.bias"] = (bias, T.F32)
    norms = {"attn_norm": dim, "ffn_norm": dim}
    if shape.qk_norms:
        norms |= {"attn_q_norm": shape.head_dim, "attn_k_norm": shape.head_dim}
    for kind, n in norms.items():
        out[f"{p}{kind}.weight"] = (1 + 0.1 * rng.standard_normal(n, dtype=np.float32), T.F32)
    return out


def add_metadata(w: gguf.GGUFWriter, name: str, shape: Shape, mix: str, n_vocab: int) -> None:
    """The model's `{arch}.*` sizes and the real vocabulary's `tokenizer.*` keys."""
    a, meta = shape.arch, family_vocab("qwen2")["metadata"]
    w.add_name(f"random {name} {mix}")
    w.add_file_type(FILE_TYPES[mix])
    sizes = {
        "block_count": shape.layers,
        "context_length": shape.context,
        "embedding_length": shape.dim,
        "feed_forward_length": shape.ffn,
        "attention.head_count": shape.heads,
        "attention.head_count_kv": shape.kv_heads,
        "vocab_size": n_vocab,
    }
    if shape.head_dim * shape.heads != shape.dim:  # as Qwen 3's files give it
        sizes |= {"attention.key_length": shape.head_dim, "attention.value_length": shape.head_dim}
    for key, value in sizes.items():
        w.add_uint32(f"{a}.{key}", value)
    w.add_float32(f"{a}.rope.freq_base", shape.rope_base)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        w.add_string(key, meta[key])
    for key in ("tokens", "token_type", "merges"):
        w.add_array(f"tokenizer.ggml.{key}", meta[f"tokenizer.ggml.{key}"])
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        w.add_uint32(f"tokenizer.ggml.{key}", meta[f"tokenizer.ggml.{key}"])
    w.add_bool("tokenizer.ggml.add_bos_token", False)


def write_model(name: str, path: Path, mix: str, seed: int = 0) -> Path:
    """Write shape `name`'s random-weight model to `path`, its matrices as `mix` says."""
    shape, rng = SHAPES[name], np.random.default_rng(seed)
    n_vocab = len(family_vocab("qwen2")["metadata"]["tokenizer.ggml.tokens"])
    w = gguf.GGUFWriter(path, shape.arch)
    add_metadata(w, name, shape, mix, n_vocab)
    embed_type = matrix_type(mix, "token_embd", 0, shape, shape.dim)
    embed = quantized(rng, embed_type, n_vocab, shape.dim, EMBED_STD)
    w.add_tensor("token_embd.weight", embed, raw_dtype=embed_type)
    for i in range(shape.layers):
        for tensor, (array, qtype) in layer_tensors(rng, shape, mix, i).items():
            w.add_tensor(tensor, array, raw_dtype=None if qtype == T.F32 else qtype)
    norm = 1 + 0.1 * rng.standard_normal(shape.dim, dtype=np.float32)
    w.add_tensor("output_norm.weight", norm)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def check_warmfleet(path: Path, ids: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
    """warmfleet's logits after `ids` and its greedy continuation of `steps` tokens."""
    from common.sampling import SamplingParams
    from engine.engine import Engine
    from engine.model import Model
    from engine.sequence import Request
    from engine.step import Segment

    model = Model.load(path)
    pool = model.new_pool((len(ids) + 16) * model.bytes_per_token)
    kv = pool.new_kv()
    kv.prepare_write(0, len(ids))
    logits = model.run(pool, ids, list(range(len(ids))), [Segment(kv, 0, len(ids), True)])[0]
    params = SamplingParams(max_tokens=steps, ignore_eos=True)
    outputs = Engine(model).generate([Request("check", ids, params)])["check"]
    return logits, [t for out in outputs for t in out.token_ids]


def check_llamacpp(path: Path, ids: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
    """llama.cpp's logits after `ids` and its greedy continuation of `steps` tokens."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=str(path),
        n_ctx=len(ids) + steps + 16,
        n_threads=2,
        verbose=False,
        logits_all=False,
    )
    try:
        n_vocab = llm.n_vocab()

        def last() -> np.ndarray:
            ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
            return np.ctypeslib.as_array(ptr, shape=(n_vocab,)).copy()

        llm.eval(ids)
        logits, tokens = last(), []
        for _ in range(steps):
            tokens.append(int(last().argmax()))
            llm.eval(tokens[-1:])
        return logits, tokens
    finally:
        llm.close()


def check(path: Path, steps: int = 8) -> None:
    """Finite logits and a greedy run on warmfleet and on llama.cpp; exits on a bad one."""
    from engine.text.gguf_file import open_gguf, read_metadata
    from engine.text.tokenizer import Tokenizer

    ids = Tokenizer.from_metadata(read_metadata(open_gguf(path))).encode(CHECK_TEXT)
    for who, run in (("warmfleet", check_warmfleet), ("llama.cpp", check_llamacpp)):
        t = time.perf_counter()
        logits, tokens = run(path, ids, steps)
        top = np.sort(logits)[-2:]
        print(
            f"{who}: {len(ids)}-token prompt, logits finite {bool(np.isfinite(logits).all())},"
            f" std {logits.std():.2f}, top-1 margin {top[1] - top[0]:.3f}; greedy {tokens}"
            f" ({time.perf_counter() - t:.0f} s)"
        )
        if not np.isfinite(logits).all() or len(tokens) != steps:
            raise SystemExit(f"{who}: non-finite logits or a short greedy run")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("out", type=Path, metavar="OUT.gguf")
    parser.add_argument("--type", choices=sorted(FILE_TYPES), default="q8_0", dest="mix")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-check", action="store_true", help="write the file only")
    args = parser.parse_args()
    t = time.perf_counter()
    write_model(args.shape, args.out, args.mix, args.seed)
    size = args.out.stat().st_size / 2**20
    print(f"wrote {args.out} ({size:.0f} MiB) in {time.perf_counter() - t:.0f} s")
    if not args.no_check:
        check(args.out)


if __name__ == "__main__":
    main()
