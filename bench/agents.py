"""The multi-agent workload over the OpenAI API, against any OpenAI-compatible server, so the
same client times warmfleet and llama-server in one run:

    .venv/bin/python -m bench.agents --target http://127.0.0.1:8000 [--target URL ...]
        [--sessions header none]

8 agents, each with its own system prompt of about 600 tokens, user turns of about 50 tokens,
4 turns of 64 new tokens each (`ignore_eos`, temperature 0), all agents at once; every turn
resends the whole conversation, and each agent names its session with X-Session-Id (servers
that do not know the header ignore it), or with `--sessions none` names none, as most
agents do (warmfleet then finds the session by the prompt). With both, each target runs the
workload once in each way, with system prompts of their own (a run does not find the
other's). Reports wall time, tokens per second, time to first
token on turn 1 and on later turns, and the fraction of prompt tokens the server reports as
cached; with several targets, each one's wall time against the first's. Start each server
fresh: a server that ran it before holds its prompts (llama-server's slots, warmfleet's
pool), and the first turn is then cached.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.agent_prompts import system_prompts, user_turn
from bench.table import print_table


@dataclass
class Turn:
    ttft_s: float
    tokens: int
    prompt_tokens: int
    cached_tokens: int


async def one_turn(
    client: httpx.AsyncClient, sid: str, messages: list[dict[str, str]], tokens: int
) -> tuple[Turn, str]:
    """One turn streamed (`sid` "": no X-Session-Id)."""
    body = {"messages": messages, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.perf_counter()
    first, pieces = 0.0, []
    usage: dict[str, Any] = {}
    async with client.stream(
        "POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": sid} if sid else {}
    ) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[len("data: ") :])
            for choice in data.get("choices") or []:
                if choice.get("delta", {}).get("content"):
                    first = first or time.perf_counter()
                    pieces.append(choice["delta"]["content"])
            usage = data.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    turn = Turn((first or time.perf_counter()) - start, usage.get("completion_tokens", 0),
                usage.get("prompt_tokens", 0), details.get("cached_tokens", 0) or 0)  # fmt: skip
    return turn, "".join(pieces)


async def agent(
    client: httpx.AsyncClient, n: int, system: str, turns: int, tokens: int, named: bool
) -> list[Turn]:
    messages = [{"role": "system", "content": system}]
    sid = f"agent-{n}-{time.time_ns()}" if named else ""  # one session for all its turns
    done = []
    for t in range(turns):
        messages.append({"role": "user", "content": user_turn(n, t)})
        turn, text = await one_turn(client, sid, messages, tokens)
        done.append(turn)
        messages.append({"role": "assistant", "content": text})
    return done


async def workload(
    url: str, args: argparse.Namespace, systems: list[str], named: bool
) -> dict[str, float]:
    # a connection per request: a kept-alive one the server closes meanwhile fails the turn
    limits = httpx.Limits(max_connections=args.agents * 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=1800, limits=limits) as client:
        t0 = time.perf_counter()
        runs = await asyncio.gather(
            *(agent(client, i, s, args.turns, args.tokens, named) for i, s in enumerate(systems))
        )
        wall = time.perf_counter() - t0
    turns = [t for run in runs for t in run]
    later = [t for run in runs for t in run[1:]]
    prompt = sum(t.prompt_tokens for t in later)
    return {
        "wall_s": wall,
        "tok_s": sum(t.tokens for t in turns) / wall,
        "tokens": sum(t.tokens for t in turns),
        "ttft1_s": statistics.median(run[0].ttft_s for run in runs),
        "ttft_later_s": statistics.median(t.ttft_s for t in later) if later else 0.0,
        "cached": sum(t.cached_tokens for t in later) / prompt if prompt else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", action="append", required=True, metavar="URL",
                   help="an OpenAI-compatible server's base URL (repeatable)")  # fmt: skip
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--system-tokens", type=int, default=600)
    p.add_argument(
        "--sessions",
        nargs="+",
        choices=["header", "none"],
        default=["header"],
        help="how agents name their sessions: X-Session-Id, or not at all",
    )
    args = p.parse_args(argv)
    systems = system_prompts(args.agents, args.system_tokens)
    results = {}
    for url in args.target:
        for mode in args.sessions:
            print(f"agents: {url}, sessions: {mode}", file=sys.stderr, flush=True)
            own = [f"[{mode}]\n{s}" for s in systems] if len(args.sessions) > 1 else systems
            results[url, mode] = asyncio.run(workload(url, args, own, mode == "header"))
    first = next(iter(results.values()))["wall_s"]
    rows = [
        [
            url,
            mode,
            f"{r['wall_s']:.1f}",
            f"{r['tok_s']:.1f}",
            str(int(r["tokens"])),
            f"{r['ttft1_s']:.2f}",
            f"{r['ttft_later_s']:.2f}",
            f"{r['cached']:.0%}",
            f"{r['wall_s'] / first:.2f}x",
        ]
        for (url, mode), r in results.items()
    ]
    print_table(["target", "sessions", "wall (s)", "tok/s", "tokens", "TTFT turn 1 (s)",
                 "TTFT later (s)", "cached", "wall / first"], rows)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
