"""Random-weight GGUF files of real models' layer shapes, with the real vocabulary's tokenizer
(tests/fixtures/qwen2_vocab.json.xz, which Qwen 2.5 and Qwen 3 share): a new family is
checked on one of these against llama.cpp on the same file (`bench.engine --model OUT`).

    .venv/bin/python -m bench.random_model SHAPE OUT.gguf [--type q8_0|q4_k_m] [--seed N]
                                           [--layers N] [--no-check]

--type q8_0: every matrix Q8_0 (gguf.quants.quantize of normal values; the experts random
valid blocks, bench/random_moe.py). --type q4_k_m: the mix llama.cpp's Q4_K_M gives these
models (bench/random_weights.py): Q4_K, with attn_v and ffn_down in Q6_K on the layers its
use_more_bits picks, the output (or the tied embedding) in Q6_K, and where a row is not a
multiple of 256 (896 wide) its fallbacks, Q5_0 for Q4_K and Q8_0 for Q6_K. K-quant blocks are
random valid blocks (as tests/unit/quant_cases.py makes) whose float16 scales are set so that
a matrix of rows of K weights has a root mean square of 1 / sqrt(K): activations stay near
unit size through every layer. The check then loads the file in warmfleet and in llama.cpp,
asks for finite logits and runs a few greedy tokens on each.

gpt-oss-20b (`gpt-oss`): 2880 wide, 64 query and 8 KV heads of 64 with biases, an output
bias and sinks, every other layer on a 128-position window, YaRN (32 over 4,096), rope base
150,000; 32 experts of 2880, top 4, in MXFP4 whatever --type says (as published files keep
them), router and expert biases; 4 layers by default (24 real); Qwen 2's vocabulary marked
with GPT-4o's split (gpt-oss's has 201,088 tokens).

qwen3-30b-a3b (`qwen3moe`, Qwen3-30B-A3B's layer shape; bench/random_moe.py): embedding 2048,
32 query and 4 KV heads of 128 with q/k RMS norms, 128 experts of 768 with top 8 in place of
the dense FFN (feed_forward_length 6144 as the real file says), an untied output, 8 layers by
default (the real model has 48; --layers sets it). Under q4_k_m: token_embd Q4_K, output
Q6_K, attn_q/k/output and ffn_gate_exps/ffn_up_exps Q4_K, attn_v and ffn_down_exps Q6_K on
use_more_bits layers (0, 3, 6 and 7 of 8) and Q4_K on the others, ffn_gate_inp (the router)
and the norms F32. Its random routers route near-uniformly: the worst case for grouping.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from bench.random_moe import Experts, add_expert_metadata, expert_tensors
from bench.random_weights import T, matrix_type, quantized
from tests.tiny_families import family_vocab

FILE_TYPES = {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M}
EMBED_STD = 0.1  # embedding and output: logits of about 0.1 * sqrt(dim) standard deviation
BIAS_STD = 0.5
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
    tied: bool = True  # the output is the embedding
    experts: Experts | None = None  # a mixture of experts in place of the dense FFN
    # gpt-oss: an output bias, sinks, this sliding window on every other layer, YaRN
    window: int = 0


SHAPES = {
    "qwen3-0.6b": Shape("qwen3", 28, 1024, 16, 8, 128, 3072, 40960, 1e6, qk_norms=True),
    "qwen2.5-coder-0.5b": Shape("qwen2", 24, 896, 14, 2, 64, 4864, 32768, 1e6, biases=True),
    # 48 layers in the real model: 8 by default keep the file near 3.2 GiB
    "qwen3-30b-a3b": Shape(
        "qwen3moe",
        layers=8,
        dim=2048,
        heads=32,
        kv_heads=4,
        head_dim=128,
        ffn=6144,
        context=40960,
        rope_base=1e6,
        qk_norms=True,
        tied=False,
        experts=Experts(count=128, used=8, ffn=768),
    ),
    "gpt-oss-20b": Shape(  # 24 layers in the real model: 4 by default, a 2.6 GiB file
        "gpt-oss",
        layers=4,
        dim=2880,
        heads=64,
        kv_heads=8,
        head_dim=64,
        ffn=2880,
        context=131072,
        rope_base=150000.0,
        biases=True,
        tied=False,
        experts=Experts(count=32, used=4, ffn=2880, qtype=T.MXFP4, biases=True),
        window=128,
    ),
}
YARN = {"factor": 32.0, "original_context_length": 4096}  # gpt-oss's rope scaling


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
    }
    if not shape.experts:
        ffn = shape.ffn
        matrices |= {"ffn_gate": (ffn, dim), "ffn_up": (ffn, dim), "ffn_down": (dim, ffn)}
    out: dict[str, tuple[np.ndarray, T]] = {}
    biased = {"attn_q", "attn_k", "attn_v"} if shape.biases else set()
    biased |= {"attn_output"} if shape.window else set()  # gpt-oss's
    for kind, (rows, k) in matrices.items():
        qtype = matrix_type(mix, kind, i, shape.layers, k, shape.tied)
        out[f"{p}{kind}.weight"] = (quantized(rng, qtype, rows, k, 1 / math.sqrt(k)), qtype)
        if kind in biased:
            bias = rng.standard_normal(rows, dtype=np.float32) * np.float32(BIAS_STD)
            out[f"{p}{kind}.bias"] = (bias, T.F32)
    if shape.experts:
        out |= expert_tensors(rng, mix, i, shape.layers, dim, shape.experts)
    norms = {"attn_norm": dim, "post_attention_norm" if shape.window else "ffn_norm": dim}
    if shape.window:  # sinks of a few units: some heads give them most of their attention
        sinks = rng.uniform(-2.0, 4.0, shape.heads).astype(np.float32)
        out[f"{p}attn_sinks.weight"] = (sinks, T.F32)
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
    if shape.experts:
        add_expert_metadata(w, a, shape.experts)
    if shape.window:
        w.add_uint32(f"{a}.attention.sliding_window", shape.window)
        w.add_string(f"{a}.rope.scaling.type", "yarn")
        w.add_float32(f"{a}.rope.scaling.factor", YARN["factor"])
        w.add_uint32(
            f"{a}.rope.scaling.original_context_length", int(YARN["original_context_length"])
        )
    w.add_float32(f"{a}.rope.freq_base", shape.rope_base)
    w.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    for key in ("tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.chat_template"):
        gpt_4o = key == "tokenizer.ggml.pre" and shape.window  # gpt-oss's split
        w.add_string(key, "gpt-4o" if gpt_4o else meta[key])
    for key in ("tokens", "token_type", "merges"):
        w.add_array(f"tokenizer.ggml.{key}", meta[f"tokenizer.ggml.{key}"])
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        w.add_uint32(f"tokenizer.ggml.{key}", meta[f"tokenizer.ggml.{key}"])
    w.add_bool("tokenizer.ggml.add_bos_token", False)


def write_model(name: str, path: Path, mix: str, seed: int = 0, layers: int | None = None) -> Path:
    """Write shape `name`'s random-weight model (of `layers` layers, or the shape's) to
    `path`, its matrices as `mix` says."""
    shape, rng = SHAPES[name], np.random.default_rng(seed)
    shape = dataclasses.replace(shape, layers=layers or shape.layers)
    n_vocab = len(family_vocab("qwen2")["metadata"]["tokenizer.ggml.tokens"])
    # tensors go to a temporary file as they are made: the MoE files outgrow memory
    w = gguf.GGUFWriter(path, shape.arch, use_temp_file=True)
    add_metadata(w, name, shape, mix, n_vocab)
    embed_type = matrix_type(mix, "token_embd", 0, shape.layers, shape.dim, shape.tied)
    embed = quantized(rng, embed_type, n_vocab, shape.dim, EMBED_STD)
    w.add_tensor("token_embd.weight", embed, raw_dtype=embed_type)
    for i in range(shape.layers):
        for tensor, (array, qtype) in layer_tensors(rng, shape, mix, i).items():
            w.add_tensor(tensor, array, raw_dtype=None if qtype == T.F32 else qtype)
    norm = 1 + 0.1 * rng.standard_normal(shape.dim, dtype=np.float32)
    w.add_tensor("output_norm.weight", norm)
    if not shape.tied:
        out_type = matrix_type(mix, "output", 0, shape.layers, shape.dim, tied=False)
        output = quantized(rng, out_type, n_vocab, shape.dim, EMBED_STD)
        w.add_tensor("output.weight", output, raw_dtype=out_type)
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
    parser.add_argument("--layers", type=int, help="default: the shape's (qwen3-30b-a3b: 8)")
    parser.add_argument("--no-check", action="store_true", help="write the file only")
    args = parser.parse_args()
    t = time.perf_counter()
    write_model(args.shape, args.out, args.mix, args.seed, args.layers)
    size = args.out.stat().st_size / 2**20
    print(f"wrote {args.out} ({size:.0f} MiB) in {time.perf_counter() - t:.0f} s")
    if not args.no_check:
        check(args.out)


if __name__ == "__main__":
    main()
