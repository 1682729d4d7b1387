"""A new session's system prompt held by a busy worker: read from the block files it writes,
against prefilling it cold, on the same worker in the same run:

    PYTHONPATH=. .venv/bin/python -m bench.shared_prefix --target 127.0.0.1:50061 \
        [--system-tokens 600 2000] [--repeats 3]

Against a running `warmfleet up --workers 2` (one spill directory: the default). Each repeat,
for each system prompt length: a holder session sends a fresh system prompt, then three more
sessions with it follow onto the holder's worker and keep it busy (64 tokens each, end of turn
ignored), so that prefix placement passes it over; a newcomer with the same system prompt then
lands on the other worker, which reads the prefix from the holder's blocks; a cold session
with another system prompt of the same length lands there too and prefills all of it. The
table gives both time-to-first-token figures and where the newcomer's KV came from."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid
from typing import Any

import grpc

from bench.agent_prompts import system_prompts
from bench.table import print_table
from common.v1 import inference_pb2 as pb
from warmfleet.client import Client, collect

BUSY = 3  # requests beyond the other worker's load that stop prefix placement (slack 2)
BUSY_TOKENS = 64
SOURCES = {
    pb.KV_SOURCE_COLD: "cold",
    pb.KV_SOURCE_WARM: "warm",
    pb.KV_SOURCE_DISK: "disk",
    pb.KV_SOURCE_PREFIX: "prefix",
}
HEADER = [
    "system tokens",
    "busy holder",
    "newcomer on",
    "its KV",
    "cached",
    "TTFT (s)",
    "cold on",
    "cold TTFT (s)",
    "cold / shared",
]


def worker_of(client: Client, session_id: str, timeout_s: float = 10.0) -> str:
    """The worker holding the session, once the kvstore has heard of it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            worker = str(client.get_session(session_id).worker_id)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
            worker = ""
        if worker:
            return worker
        time.sleep(0.05)
    raise TimeoutError(f"session {session_id} is on no worker after {timeout_s:.0f} s")


def one(client: Client, system: str, cold_system: str) -> dict[str, Any]:
    """One repeat: the newcomer's and the cold session's replies, and the busy worker."""
    tag = uuid.uuid4().hex[:8]
    chat = [{"role": "system", "content": system}, {"role": "user", "content": "Begin."}]
    ask: dict[str, Any] = {"max_tokens": 4, "temperature": 0.0}
    client.complete(f"holder-{tag}", messages=chat, **ask)
    holder = worker_of(client, f"holder-{tag}")
    long: dict[str, Any] = {"max_tokens": BUSY_TOKENS, "ignore_eos": True, "temperature": 0.0}
    busy = []
    for i in range(BUSY):
        busy.append(client.stream(f"busy-{tag}-{i}", messages=chat, **long))
        next(iter(busy[-1]))  # running
        worker_of(client, f"busy-{tag}-{i}")
    task = {"role": "user", "content": "Review the last commit, please."}
    newcomer = client.complete(f"new-{tag}", messages=[chat[0], task], **ask).completion
    cold_chat = [{"role": "system", "content": cold_system}, task]
    cold = client.complete(f"cold-{tag}", messages=cold_chat, **ask).completion
    for b in busy:
        collect(b)
    return {"holder": holder, "new": newcomer, "cold": cold}


def row(n: int, run: dict[str, Any]) -> list[str]:
    new, cold = run["new"], run["cold"]
    ttft, cold_ttft = new.timings.time_to_first_token_s, cold.timings.time_to_first_token_s
    where = [str(n), run["holder"], new.worker_id, SOURCES[new.kv_source]]
    return [
        *where,
        str(new.usage.cached_tokens),
        f"{ttft:.3f}",
        cold.worker_id,
        f"{cold_ttft:.3f}",
        f"{cold_ttft / ttft:.1f}x",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", default="127.0.0.1:50051", help="the gateway's gRPC address")
    p.add_argument("--api-key", default="", help="a tenant's key, if the gateway asks one")
    p.add_argument("--system-tokens", type=int, nargs="+", default=[600, 2000])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    rows = []
    with Client(args.target, api_key=args.api_key or None, timeout_s=600) as client:
        for n in args.system_tokens:
            ratios = []
            for r in range(args.repeats):
                print(f"shared_prefix: {n} tokens, repeat {r + 1}", file=sys.stderr, flush=True)
                a, b = (f"[{uuid.uuid4().hex}]\n{s}" for s in system_prompts(2, n))
                run = one(client, a, b)
                rows.append(row(n, run))
                ratios.append(float(rows[-1][-1].rstrip("x")))
            print(f"{n} tokens: median {statistics.median(ratios):.1f}x", file=sys.stderr)
    print_table(HEADER, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
