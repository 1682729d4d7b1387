"""What bounds a warm resume's speed-up over recompute: the work each does, counted in
floating-point operations from the model's shape, against the time each takes in process.

    .venv/bin/python -m bench.resume_bound [--model PATH] [--context 2000] [--repeats 3]

The KV tiers benchmark's conversation (bench.kv_tiers_session: a log of about --context
tokens and a short question, greedy, MAX_TOKENS tokens a reply) in one Engine with every
core, no cluster. Turn 1 computes its prompt from nothing (what a recompute does); turn 2
resumes warm and computes only its new tokens, each attending to the whole session. For
each, the tokens computed, the keys their rows attend to, the operations of the products
(2 per weight per row, the output head once) and of attention (4 per query head, key and
dimension), the time to first token and the rate. Then the warm step's parts, timed alone
on the same shapes: the products of its rows, and its attention (fresh keys and values
each layer, as a resumed session's are: not in cache). Figures are medians of --repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from bench.kv_tiers_session import MAX_TOKENS, QUESTIONS, long_text
from bench.table import print_table
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv.kv_pool import BLOCK_TOKENS
from engine.model import Model
from engine.ops.attention import AttentionPlan, paged_attention
from engine.ops.kernels import matmul_t
from engine.sequence import Request
from engine.text.chat import render_chat
from engine.text.model_config import ModelConfig
from warmfleet.models import resolve_model

Messages = list[dict[str, str]]


@dataclass(frozen=True, slots=True)
class Work:
    """One turn's computed rows: their count and the keys each attends to."""

    rows: int
    first_key_count: int  # keys the first computed row sees (its position + 1)

    @property
    def keys(self) -> int:
        """Keys attended to, every computed row together (row i sees first + i keys)."""
        return self.rows * self.first_key_count + self.rows * (self.rows - 1) // 2

    def products(self, c: ModelConfig) -> float:
        q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        per_layer = c.dim * (q + 2 * kv) + q * c.dim + 3 * c.dim * c.ffn_dim
        return 2.0 * (self.rows * c.num_layers * per_layer + c.vocab_size * c.dim)

    def attention(self, c: ModelConfig) -> float:
        return 4.0 * self.keys * c.num_layers * c.num_heads * c.head_dim


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", metavar="PATH")
    parser.add_argument("--context", type=int, default=2000, help="tokens of the session")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    model = Model.load(resolve_model(args.model))
    c, tokenizer = model.config, model.tokenizer
    assert tokenizer.chat_template is not None, "the model has no chat template"
    engine = Engine(model, EngineConfig())
    engine.warm_up()
    text = long_text(tokenizer, tokenizer.chat_template, args.context)
    render = lambda m: tokenizer.encode(render_chat(tokenizer.chat_template, m))  # noqa: E731
    turns: dict[str, list[tuple[Work, float]]] = {"recompute": [], "warm": []}
    for r in range(args.repeats):
        log(f"repeat {r + 1}: turn 1 (from nothing), turn 2 (warm)")
        m1: Messages = [{"role": "user", "content": f"(repeat {r}) {text}\n\n{QUESTIONS[0]}"}]
        work, ttft, reply = timed_turn(engine, f"s{r}", render(m1))
        turns["recompute"].append((work, ttft))
        m2 = [
            *m1,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": QUESTIONS[1]},
        ]
        work, ttft, _ = timed_turn(engine, f"s{r}", render(m2))
        turns["warm"].append((work, ttft))
    log("the warm step's parts, and a prefill chunk's, timed alone")
    chunk = Work(EngineConfig().prefill_chunk_tokens, args.context // 2)
    parts = {w: step_parts(model, w, args.repeats) for w in (turns["warm"][0][0], chunk)}
    print_tables(c, turns, parts, os.cpu_count() or 1)


def timed_turn(engine: Engine, session: str, prompt: list[int]) -> tuple[Work, float, str]:
    """Run `prompt` in `session` (its own tenant); its computed rows, time to first token
    and reply text."""
    sampling = SamplingParams(max_tokens=MAX_TOKENS)
    t = time.perf_counter()
    seq = engine.add(Request(f"{session}-{len(prompt)}", prompt, sampling, session, session))
    work = Work(len(prompt) - seq.num_cached, seq.num_cached + 1)
    ttft, tokens = 0.0, []
    while engine.has_work:
        for out in engine.step():
            if out.token_ids and not ttft:
                ttft = time.perf_counter() - t
            tokens += out.token_ids
    return work, ttft, engine.model.tokenizer.decode(tokens)


def best_ms(fn: Callable[[], None], repeats: int) -> float:
    """The fastest of `repeats` calls of fn, in ms."""
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def step_parts(model: Model, warm: Work, repeats: int) -> dict[str, float]:
    """The products of a step computing `warm`'s rows (every layer's matrices and the
    output head's one row) and its attention (every layer, keys and values never read
    before), each timed alone, in ms."""
    c, w = model.config, model.weights
    rng = np.random.default_rng(0)
    x = rng.standard_normal((warm.rows, c.dim), dtype=np.float32)
    act = rng.standard_normal((warm.rows, c.ffn_dim), dtype=np.float32)

    def products() -> None:
        for layer in w.layers:
            matmul_t(x, layer.wqkv), matmul_t(x, layer.wo), matmul_t(x, layer.w_gate_up)
            matmul_t(act, layer.w_down)
        matmul_t(x[-1:], w.output)

    start = warm.first_key_count - 1
    blocks = list(range(-(-(start + warm.rows) // BLOCK_TOKENS)))
    shape = (len(blocks), c.num_kv_heads, BLOCK_TOKENS, c.head_dim)
    kv = [
        [rng.standard_normal(shape, dtype=np.float32) for _ in range(2)]
        for _ in range(c.num_layers)
    ]
    q = rng.standard_normal((warm.rows, c.num_heads, c.head_dim), dtype=np.float32)
    plan = AttentionPlan.build([(blocks, start, warm.rows)], None, compiled=True)

    def attention() -> None:
        for k, v in kv:
            paged_attention(q, k, v, plan, np)

    return {"products": best_ms(products, repeats), "attention": best_ms(attention, repeats)}


def print_tables(
    c: ModelConfig,
    turns: dict[str, list[tuple[Work, float]]],
    parts: dict[Work, dict[str, float]],
    threads: int,
) -> None:
    rows, seconds, flops = [], {}, {}
    for name, runs in turns.items():
        work = runs[0][0]
        seconds[name] = statistics.median(t for _, t in runs)
        prod, att = work.products(c), work.attention(c)
        flops[name] = prod + att
        ms, rate = seconds[name] * 1e3, flops[name] / seconds[name] / 1e9
        rows.append((name, str(work.rows), f"{work.keys / work.rows:.0f}",
                     f"{prod / 1e9:.2f}", f"{att / 1e9:.2f}", f"{(prod + att) / 1e9:.2f}",
                     f"{ms:.1f}", f"{rate:.0f}"))  # fmt: skip
    print(f"Turns in process, 1 engine with {threads} threads, median of {len(turns['warm'])}")
    print_table(("turn", "rows computed", "keys a row (mean)", "products GFLOP",
                 "attention GFLOP", "total GFLOP", "TTFT (ms)", "GFLOP/s"), rows)  # fmt: skip
    print()
    work_ratio = flops["recompute"] / flops["warm"]
    need = flops["warm"] / (seconds["recompute"] / 100)
    times = need / (flops["recompute"] / seconds["recompute"])
    print_table(
        ("figure", "value"),
        [
            ("work: recompute / warm", f"{work_ratio:.1f}x"),
            ("time: recompute / warm", f"{seconds['recompute'] / seconds['warm']:.1f}x"),
            ("warm at the recompute's rate", f"{seconds['recompute'] / work_ratio * 1e3:.1f} ms"),
            ("rate the warm turn needs for 100x",
             f"{need / 1e9:.0f} GFLOP/s ({times:.2f}x the recompute's)"),
        ],
    )  # fmt: skip
    print()
    print("Parts of a step, each timed alone (best of the repeats)")
    table = []
    for work, took in parts.items():
        for part, count in (("products", work.products(c)), ("attention", work.attention(c))):
            table.append((f"{work.rows} rows from position {work.first_key_count - 1}", part,
                          f"{took[part]:.1f}", f"{count / took[part] / 1e6:.0f}"))  # fmt: skip
    print_table(("step", "part", "time (ms)", "GFLOP/s"), table)


if __name__ == "__main__":
    main()
