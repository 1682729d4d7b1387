"""A multi-agent workload: N agents, each with its own system prompt of about 600 tokens,
T turns each (the whole conversation resent every turn, 64 new tokens per turn), all at
once, through the whole system (gateway, Redis, kvstore, 2 workers).

    .venv/bin/python -m bench.multi_agent [--agents 8] [--turns 4] [--tokens 64]

Three runs of the same workload, each on a fresh cluster:
- full: the system as shipped (continuous batching, sticky sessions, step budget 250 ms);
- serialized: one request at a time per worker (--max-running 1), the baseline;
- no step budget: the full system with --step-budget-ms 0 (whole 256-token prefill chunks).
Reports total time, tokens per second, time to first token on turn 1 against later turns,
and the gaps between tokens of a stream (p50, p99) while other agents' prompts arrive.
Prints tables; ratios are taken within the run (the machine is shared and noisy).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import threading
import time
from dataclasses import dataclass, field

from bench.agent_prompts import system_prompt
from bench.table import print_table
from engine.text.gguf_file import open_gguf, read_metadata
from engine.text.tokenizer import Tokenizer
from warmfleet.client import Client
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.models import resolve_model

CONFIGS = {
    "full": [],
    "serialized": ["--max-running", "1"],
    "no step budget": ["--step-budget-ms", "0"],
}


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class TurnResult:
    turn: int
    ttft_s: float
    total_s: float
    tokens: int
    gaps_s: list[float] = field(default_factory=list)


def agent(
    target: str, sid: str, system: str, turns: int, tokens: int, out: list[TurnResult]
) -> None:
    messages = [{"role": "system", "content": system}]
    with Client(target, timeout_s=900) as client:
        for t in range(turns):
            messages.append({"role": "user", "content": f"Step {t + 1}: what do you do next?"})
            start = time.perf_counter()
            arrivals: list[float] = []
            text: list[str] = []
            call = client.stream(sid, messages=messages, max_tokens=tokens)
            for response in call:
                if response.HasField("chunk"):
                    arrivals.append(time.perf_counter())
                    text.append(response.chunk.text)
            gaps = [b - a for a, b in itertools.pairwise(arrivals)]
            end = time.perf_counter()
            ttft = (arrivals[0] if arrivals else end) - start
            out.append(TurnResult(t, ttft, end - start, len(arrivals), gaps))
            messages.append({"role": "assistant", "content": "".join(text)})


def run(config: str, args: argparse.Namespace, systems: list[str]) -> dict[str, float]:
    log(f"{config}: starting a cluster ({' '.join(CONFIGS[config]) or 'defaults'})")
    results: list[TurnResult] = []
    with Cluster(
        ClusterConfig(num_workers=2, model=args.model, worker_args=CONFIGS[config], progress=log)
    ) as cluster:
        warm = Client(cluster.target)  # first-call costs out of the way
        warm.complete("warmup", prompt="Hello", max_tokens=2)
        warm.close()
        threads = [
            threading.Thread(
                target=agent,
                args=(cluster.target, f"agent-{i}", s, args.turns, args.tokens, results),
            )
            for i, s in enumerate(systems)
        ]
        t0 = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t0
    generated = sum(r.tokens for r in results)
    gaps = sorted(g for r in results for g in r.gaps_s)
    first = [r.ttft_s for r in results if r.turn == 0]
    later = [r.ttft_s for r in results if r.turn > 0]
    log(f"{config}: {wall:.1f} s, {generated} tokens")
    return {
        "wall": wall,
        "tok_s": generated / wall,
        "ttft1": statistics.median(first),
        "ttft_later": statistics.median(later) if later else 0.0,
        "gap50": gaps[len(gaps) // 2] if gaps else 0.0,
        "gap99": gaps[min(len(gaps) - 1, int(len(gaps) * 0.99))] if gaps else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="GGUF file (default: the default model)")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per turn")
    parser.add_argument("--system-tokens", type=int, default=600)
    args = parser.parse_args()
    args.model = resolve_model(args.model)
    meta = read_metadata(open_gguf(args.model))
    tokenizer = Tokenizer.from_metadata(meta)
    assert tokenizer.chat_template is not None
    systems = [
        system_prompt(tokenizer, tokenizer.chat_template, i, args.system_tokens)
        for i in range(args.agents)
    ]
    stats = {name: run(name, args, systems) for name in CONFIGS}
    base = stats["serialized"]["wall"]
    print(
        f"\n{args.agents} agents x {args.turns} turns x {args.tokens} new tokens, system prompts "
        f"~{args.system_tokens} tokens, 2 workers"
    )
    print_table(
        [
            "config",
            "total (s)",
            "tokens/s",
            "TTFT turn 1 (ms)",
            "TTFT later (ms)",
            "gap p50 (ms)",
            "gap p99 (ms)",
            "time / serialized",
        ],
        [
            [
                name,
                f"{s['wall']:.1f}",
                f"{s['tok_s']:.1f}",
                f"{s['ttft1'] * 1e3:.0f}",
                f"{s['ttft_later'] * 1e3:.0f}",
                f"{s['gap50'] * 1e3:.0f}",
                f"{s['gap99'] * 1e3:.0f}",
                f"{s['wall'] / base:.2f}x",
            ]
            for name, s in stats.items()
        ],
    )
    ratio = stats["full"]["wall"] / base
    print(f"\ntarget: full <= 0.3x serialized: {ratio:.2f}x ({'yes' if ratio <= 0.3 else 'no'})")


if __name__ == "__main__":
    main()
