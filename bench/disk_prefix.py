"""A new session's system prompt that only a session on disk holds: read from the host's
block files, against prefilling it cold, on the same worker in the same run:

    PYTHONPATH=. .venv/bin/python -m bench.disk_prefix [--model PATH] \
        [--system-tokens 600 2000] [--repeats 3]

Starts its own cluster of one worker (both cores). Each repeat, for each system prompt
length: a holder session sends a fresh system prompt and is ordered to disk (Evict); the
worker is restarted (drained, then started again: its pool holds none of the prompt's
blocks, as after a restart or on another worker of the host); a newcomer with the same
system prompt then finds the holder on disk in the prefix index and its worker reads the
blocks; a cold session with another system prompt of the same length prefills it all. The
table gives both time-to-first-token figures and where the newcomer's KV came from."""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.agent_prompts import system_prompts
from bench.cluster import log
from bench.shared_prefix import SOURCES, worker_of
from bench.table import print_table
from common.v1 import inference_pb2 as pb
from warmfleet.client import Client, KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.models import resolve_model

HEADER = ["system tokens", "newcomer's KV", "cached", "TTFT (s)", "cold TTFT (s)", "cold / disk"]
ON_DISK_S = 60.0  # the longest wait for the holder's spill


def wait_on_disk(client: Client, session_id: str, timeout_s: float = ON_DISK_S) -> None:
    """Until the session's record says it is on disk (its spill written); TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while client.get_session(session_id).tier != pb.TIER_DISK:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{session_id} is not on disk after {timeout_s:.0f} s")
        time.sleep(0.05)


def one(cluster: Cluster, client: Client, system: str, cold_system: str) -> list[pb.Completion]:
    """One repeat: the newcomer's and the cold session's completions."""
    tag = uuid.uuid4().hex[:8]
    task = {"role": "user", "content": "Review the last commit, please."}
    ask: dict[str, Any] = {"max_tokens": 4, "temperature": 0.0}
    holder = f"holder-{tag}"
    client.complete(holder, messages=[{"role": "system", "content": system}, task], **ask)
    worker = worker_of(client, holder)
    with KVStoreClient(cluster.kvstore_target) as kv:
        kv.evict(holder)
    wait_on_disk(client, holder)
    cluster.terminate(worker)
    cluster.restart(worker)
    chat = [{"role": "system", "content": system}, task]
    newcomer = client.complete(f"new-{tag}", messages=chat, **ask).completion
    cold_chat = [{"role": "system", "content": cold_system}, task]
    return [newcomer, client.complete(f"cold-{tag}", messages=cold_chat, **ask).completion]


def row(n: int, new: pb.Completion, cold: pb.Completion) -> list[str]:
    ttft, cold_ttft = new.timings.time_to_first_token_s, cold.timings.time_to_first_token_s
    return [
        str(n),
        SOURCES[new.kv_source],
        str(new.usage.cached_tokens),
        f"{ttft:.3f}",
        f"{cold_ttft:.3f}",
        f"{cold_ttft / ttft:.1f}x",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", metavar="PATH", help="a GGUF file (default: the default model)")
    p.add_argument("--system-tokens", type=int, nargs="+", default=[600, 2000])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    rows = []
    spill_dir = Path(tempfile.mkdtemp(prefix="wf-disk-prefix-"))
    config = ClusterConfig(
        num_workers=1,
        model=resolve_model(args.model),
        threads_per_worker=os.cpu_count() or 1,
        progress=log,
        spill_dir=spill_dir,
    )
    try:
        with Cluster(config) as cluster, Client(cluster.target, timeout_s=600) as client:
            for n in args.system_tokens:
                ratios = []
                for r in range(args.repeats):
                    log(f"disk_prefix: {n} tokens, repeat {r + 1}")
                    a, b = (f"[{uuid.uuid4().hex}]\n{s}" for s in system_prompts(2, n))
                    rows.append(row(n, *one(cluster, client, a, b)))
                    ratios.append(float(rows[-1][-1].rstrip("x")))
                log(f"{n} tokens: median {statistics.median(ratios):.1f}x")
    finally:
        shutil.rmtree(spill_dir, ignore_errors=True)
    print_table(HEADER, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
