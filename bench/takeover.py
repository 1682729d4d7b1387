"""How long a stream stalls when its worker dies, against the tokens it had already sent:

    .venv/bin/python -m bench.takeover [--sent 3,20,200,2000] [--after 20]

Two workers on the default model under the launcher's supervision (polled as `warmfleet up`
polls it). For each count N: one greedy stream (end of turn ignored) of N + --after tokens;
once N tokens have arrived, SIGKILL its worker and measure from the kill to the arrival of
the first token the dead worker had not published. Every stream's tokens are checked
against the in-process engine's. The killed worker is back before the next row."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis as redis_lib

from bench.table import print_table
from broker import codec, keys
from broker.messages import Completion, JobError, TokenChunk
from common.sampling import SamplingParams
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from engine.text.chat import render_chat
from warmfleet.client import Client
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.models import pull_default_model
from warmfleet.supervisor import Supervisor

POLL_S = 0.1  # as `up` polls its children
MESSAGES = [{"role": "user", "content": "Tell me a very long story about a cartographer."}]


@dataclass
class Stream:
    """One Generate call read on a thread: each token index with the time it arrived."""

    max_tokens: int
    arrivals: list[tuple[float, int, int]] = field(default_factory=list)  # (t, index, id)
    request_id: str = ""
    error: BaseException | None = None

    def read(self, client: Client) -> None:
        try:
            call = client.stream(
                f"takeover-{self.max_tokens}",
                messages=MESSAGES,
                max_tokens=self.max_tokens,
                ignore_eos=True,
            )
            for response in call:
                if response.HasField("completion"):
                    self.request_id = response.completion.request_id
                    return
                c = response.chunk
                now = time.monotonic()
                self.arrivals += [(now, c.index + i, t) for i, t in enumerate(c.token_ids)]
        except BaseException as e:  # reported in the table
            self.error = e

    def tokens(self) -> list[int]:
        return [t for _, _, t in self.arrivals]


def published_before(r: redis_lib.Redis, request_id: str, dead_ms: float) -> int:
    """Tokens the dead worker had published when it died (Redis stamps entries in ms)."""
    n = 0
    for entry_id, entry in r.xrange(keys.out_stream(request_id)):
        message = codec.decode_fields(entry, TokenChunk, Completion, JobError)
        if int(entry_id.split("-")[0]) <= dead_ms and isinstance(message, TokenChunk):
            n = max(n, message.index + len(message.token_ids))
    return n


def supervise_until(
    supervisor: Supervisor, done: Callable[[], bool], what: str, limit_s: float
) -> None:
    deadline = time.monotonic() + limit_s
    while not done():
        if supervisor.poll() is not None:
            raise SystemExit(f"the cluster stopped while waiting for {what}")
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(POLL_S)


def one_row(
    cluster: Cluster,
    supervisor: Supervisor,
    model: Model,
    sent: int,
    after: int,
    r: redis_lib.Redis,
) -> list[str]:
    stream = Stream(sent + after)
    with Client(cluster.target, timeout_s=600) as client:
        reader = threading.Thread(target=stream.read, args=(client,))
        reader.start()
        supervise_until(supervisor, lambda: len(stream.arrivals) >= sent, f"{sent} tokens", 600)
        busy = {w: len(cluster_status(r, w)) for w in cluster.worker_ids}
        victim = max(busy, key=lambda w: busy[w])
        process = cluster.processes[victim]
        os.kill(process.pid, signal.SIGKILL)
        killed_at = time.monotonic()
        process.wait(timeout=30)
        dead_ms = time.time() * 1000
        supervise_until(supervisor, lambda: not reader.is_alive(), "the stream", 900)
    if stream.error is not None:
        return [str(sent), "failed", str(stream.error)[:60], "", ""]
    published = published_before(r, stream.request_id, dead_ms + 50)
    resumed_at = next(t for t, index, _ in stream.arrivals if index >= published)
    ids = model.tokenizer.encode(render_chat(model.tokenizer.chat_template or "", MESSAGES))
    sampling = SamplingParams(max_tokens=sent + after, ignore_eos=True)
    out = Engine(model).generate([Request("ref", ids, sampling)])["ref"]
    exact = stream.tokens() == [t for o in out for t in o.token_ids]
    supervise_until(supervisor, lambda: back_up(cluster, r, victim), f"{victim} to come back", 120)
    return [
        str(sent),
        str(published),
        f"{resumed_at - killed_at:.2f}",
        "yes" if exact else "NO",
        victim,
    ]


def cluster_status(r: redis_lib.Redis, worker_id: str) -> list[str]:
    raw = r.get(keys.heartbeat_key(worker_id))
    return list(json.loads(raw)["running"]) if raw else []


def back_up(cluster: Cluster, r: redis_lib.Redis, worker_id: str) -> bool:
    """The killed worker was started again (a new process) and beats."""
    raw = r.get(keys.heartbeat_key(worker_id))
    return raw is not None and json.loads(raw)["pid"] == cluster.processes[worker_id].pid


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sent", default="3,20,200,2000", help="tokens sent before the kill")
    p.add_argument("--after", type=int, default=20, help="tokens asked past them")
    args = p.parse_args()
    path = pull_default_model()
    model = Model.load(path, device="cpu")
    config = ClusterConfig(num_workers=2, model=path)
    rows = []
    with Cluster(config) as cluster:
        supervisor = Supervisor(cluster, lambda line: None)
        r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
        for sent in (int(n) for n in args.sent.split(",")):
            rows.append(one_row(cluster, supervisor, model, sent, args.after, r))
            print_table(HEADER, rows[-1:])
    print()
    print_table(HEADER, rows)


HEADER = ["sent before the kill", "published", "stall (s)", "exact", "killed"]

if __name__ == "__main__":
    main()
