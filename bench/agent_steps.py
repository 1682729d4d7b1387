"""The multi-agent workload (bench.agents': 8 agents, ~600-token system prompts, 4 turns of
64 tokens) replayed in one Engine, no cluster: where a step's time goes, by kind of step,
under one or more settings of WARMFLEET_CHUNK_ROWS (how long a prefill chunk stays in the
kernels, engine/ops/chunks.py).

    .venv/bin/python -m bench.agent_steps [--chunk-rows default 32 all] [--repeats 1]
        [--agents 8] [--turns 4] [--tokens 64] [--step-budget-ms 250]

Every agent's next turn (the whole conversation again, its session's KV reused) is added as
soon as its reply ends. Each setting runs in a process of its own, alternated --repeats
times (`default`: the build's own bound); the figures are each setting's fastest run. Per
setting: wall time, steps that prefilled (their time, prompt rows and decode rows), steps
that only decoded (time, rows), and the wall time against the first setting's.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from bench.agent_prompts import system_prompts, user_turn
from bench.settings_run import measured
from bench.table import print_table
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.model import Model
from engine.ops.chunks import CHUNK_ROWS_ENV
from engine.ops.native import isa
from engine.sequence import Request
from engine.text.chat import render_chat
from warmfleet.models import resolve_model

Step = tuple[int, int, float]  # prompt rows, decode rows, seconds


def system(text: str) -> dict[str, str]:
    return {"role": "system", "content": text}


def user(agent: int, turn: int) -> dict[str, str]:
    return {"role": "user", "content": user_turn(agent, turn)}


class Agents:
    """The agents' conversations, each turn added to the engine as the last one ends."""

    def __init__(self, engine: Engine, args: argparse.Namespace) -> None:
        self.engine, self.turns, self.tokens = engine, args.turns, args.tokens
        tokenizer = engine.model.tokenizer
        assert tokenizer.chat_template is not None
        self.tokenizer, self.template = tokenizer, tokenizer.chat_template
        prompts = system_prompts(args.agents, 600)
        self.chats = [[system(text), user(i, 0)] for i, text in enumerate(prompts)]
        self.turn = [0] * args.agents
        self.reply: list[list[int]] = [[] for _ in range(args.agents)]
        self.steps: list[Step] = []

    def add(self, agent: int) -> None:
        ids = self.tokenizer.encode(render_chat(self.template, self.chats[agent]))
        sampling = SamplingParams(max_tokens=self.tokens, ignore_eos=True)
        rid = f"a{agent}-{self.turn[agent]}"
        self.engine.add(Request(rid, ids, sampling, cache_key=f"agent-{agent}"))

    def run(self) -> None:
        for agent in range(len(self.chats)):
            self.add(agent)
        stats = self.engine.stats
        while self.engine.has_work:
            before = (stats.num_steps, stats.num_prefill_tokens, stats.num_decode_tokens)
            for out in self.engine.step():
                agent = int(out.request_id[1:].split("-")[0])
                self.reply[agent] += out.token_ids
                if out.completion is not None:
                    self.ended(agent)
            if stats.num_steps > before[0]:
                prompt, decode = (
                    stats.num_prefill_tokens - before[1],
                    stats.num_decode_tokens - before[2],
                )
                self.steps.append((prompt, decode, stats.last_step_s))

    def ended(self, agent: int) -> None:
        text = self.tokenizer.decode(self.reply[agent])
        self.chats[agent].append({"role": "assistant", "content": text})
        self.reply[agent], self.turn[agent] = [], self.turn[agent] + 1
        if self.turn[agent] < self.turns:
            self.chats[agent].append(user(agent, self.turn[agent]))
            self.add(agent)


def measure(args: argparse.Namespace) -> None:
    """The workload once under this process's settings: its figures as JSON."""
    model = Model.load(resolve_model(None), kv_dtype="float16")
    budget = args.step_budget_ms / 1000 if args.step_budget_ms else None
    engine = Engine(model, EngineConfig(step_budget_s=budget))
    engine.warm_up()
    agents = Agents(engine, args)
    start = time.perf_counter()
    agents.run()
    wall = time.perf_counter() - start
    prefill = [s for s in agents.steps if s[0]]
    decode = [s for s in agents.steps if not s[0]]
    print(json.dumps({"wall": wall, "prefill": totals(prefill), "decode": totals(decode)}))


def totals(steps: list[Step]) -> list[float]:
    """count, seconds, prompt rows, decode rows"""
    return [
        len(steps),
        sum(s[2] for s in steps),
        sum(s[0] for s in steps),
        sum(s[1] for s in steps),
    ]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--chunk-rows", nargs="+", default=["default"], help="WARMFLEET_CHUNK_ROWS values"
    )
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument(
        "--step-budget-ms", type=float, default=250.0, help="0: none (the worker's default is 250)"
    )
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.measure:
        return measure(args)
    forwarded = ["--measure", "--agents", str(args.agents), "--turns", str(args.turns)]
    forwarded += ["--tokens", str(args.tokens), "--step-budget-ms", str(args.step_budget_ms)]
    best: dict[str, Any] = {}
    for repeat in range(args.repeats):
        for rows in args.chunk_rows:
            print(f"repeat {repeat + 1}: {CHUNK_ROWS_ENV}={rows}", file=sys.stderr)
            settings = {} if rows == "default" else {CHUNK_ROWS_ENV: rows}
            got = measured("bench.agent_steps", forwarded, settings)
            if rows not in best or got["wall"] < best[rows]["wall"]:
                best[rows] = got
    report(args, best)


def report(args: argparse.Namespace, best: dict[str, Any]) -> None:
    print(
        f"{args.agents} agents x {args.turns} turns of {args.tokens} tokens in one engine, "
        f"kernels built for {isa()}; fastest of {args.repeats}"
    )
    first = best[args.chunk_rows[0]]["wall"]
    rows = []
    for setting, got in best.items():
        (pn, ps, pp, pd), (dn, ds, _, dd) = got["prefill"], got["decode"]
        rows.append(
            [
                setting,
                f"{got['wall']:.2f}",
                f"{pn:.0f} / {ps:.2f} s / {pp:.0f} + {pd:.0f}",
                f"{dn:.0f} / {ds:.2f} s / {dd:.0f}",
                f"{got['wall'] / first:.2f}x",
            ]
        )
    header = [
        CHUNK_ROWS_ENV,
        "wall (s)",
        "prefill steps / time / rows (prompt + decode)",
        "decode-only steps / time / rows",
        "wall / first",
    ]
    print_table(header, rows)


if __name__ == "__main__":
    main()
