"""A worker's death with real processes: 2 workers on the default model under the launcher's
supervision (warmfleet/supervisor.py, polled here as `warmfleet up` polls it). SIGKILL the
worker running streams: they resume on the other worker within 2 s of the kill, measured
from when their tokens arrive, exact and contiguous; the launcher starts the killed worker
again, and it takes new sessions. The lease is the default 5 s, so only the heartbeat can
explain a takeover this fast. Killed late in a long answer, the adopter prefills the
tokens already sent instead of decoding them again: its first new token comes after as
many steps as that prefill takes, plus one."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from broker import codec, keys
from broker.messages import Completion, JobError, TokenChunk
from common.sampling import SamplingParams
from common.v1 import inference_pb2 as pb
from engine.config import EngineConfig
from engine.model import Model
from engine.sequence import Request
from tests.cluster_fixtures import cluster_client, cluster_redis  # noqa: F401
from tests.cluster_helpers import prompt_ids, reference, worker_status
from tests.cold_runs import cold_ids
from warmfleet.client import Client
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.supervisor import Supervisor

pytestmark = pytest.mark.slow
MAX_TOKENS = 48
RESUME_S = 2.0  # the bound, from the kill to each stream's next token
POLL_S = 0.1  # as `warmfleet up` polls its supervisor
LATE_TOKENS, LATE_KILL_AT = 300, 200
TOPICS = ["a lighthouse keeper", "a clockmaker", "a river pilot", "a beekeeper"]


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    config = ClusterConfig(
        num_workers=2,
        model=default_model_path,
        spill_dir=tmp_path_factory.mktemp("spill"),
        log_dir=tmp_path_factory.mktemp("takeover-logs"),
    )
    with Cluster(config) as c:
        yield c


@dataclass
class TimedStream:
    """One Generate call read on a thread: each chunk with the time it arrived."""

    messages: list[dict[str, str]]
    options: dict[str, Any] = field(default_factory=lambda: {"max_tokens": MAX_TOKENS})
    arrivals: list[tuple[float, pb.Chunk]] = field(default_factory=list)
    completion: pb.Completion | None = None
    error: BaseException | None = None

    def read(self, client: Client, session_id: str) -> None:
        try:
            call = client.stream(session_id, messages=self.messages, **self.options)
            for response in call:
                if response.HasField("completion"):
                    self.completion = response.completion
                    return
                self.arrivals.append((time.monotonic(), response.chunk))
        except BaseException as e:  # reported by the test
            self.error = e

    def tokens(self) -> list[int]:
        return [t for _, c in self.arrivals for t in c.token_ids]

    def resumed_s(self, r: redis_lib.Redis, kill: Kill) -> float:
        """From the kill to the arrival of the first token the dead worker had not
        published (the tokens it sent just before it died may arrive after the kill)."""
        assert self.completion is not None
        published = 0
        for entry_id, entry in r.xrange(keys.out_stream(self.completion.request_id)):
            message = codec.decode_fields(entry, TokenChunk, Completion, JobError)
            if int(entry_id.split("-")[0]) <= kill.dead_ms + 50 and isinstance(message, TokenChunk):
                published = max(published, message.index + len(message.token_ids))
        return next(t for t, c in self.arrivals if c.index + len(c.token_ids) > published) - kill.at


def supervise_until(supervisor: Supervisor, done: Callable[[], object], what: str) -> None:
    """Poll the supervisor, as `up` does, until `done()` (at most 3 minutes)."""
    deadline = time.monotonic() + 180
    while not done():
        assert supervisor.poll() is None
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(POLL_S)


@dataclass(frozen=True)
class Kill:
    worker_id: str
    pid: int
    running: list[str]  # the request ids it ran
    at: float  # time.monotonic() of the kill
    dead_ms: float  # unix ms, once the process had exited (Redis stamps its entries so)


def kill_the_busiest(cluster: Cluster, r: redis_lib.Redis) -> Kill:
    """SIGKILL the worker running the most requests."""
    running = {w: worker_status(r, w)["running"] for w in cluster.worker_ids}
    victim = max(running, key=lambda w: len(running[w]))
    pid = cluster.processes[victim].pid
    os.kill(pid, signal.SIGKILL)
    at = time.monotonic()
    cluster.processes[victim].wait(timeout=30)  # reaped here: the supervisor sees its code
    return Kill(victim, pid, running[victim], at, time.time() * 1000)


def ready(r: redis_lib.Redis, worker_id: str, pid: int) -> bool:
    """The worker's heartbeat is that of process `pid`."""
    raw = r.get(keys.heartbeat_key(worker_id))
    return raw is not None and json.loads(raw)["pid"] == pid


def test_sigkilled_worker_streams_resume_within_2_s_and_it_comes_back(
    cluster: Cluster, client: Client, r: redis_lib.Redis, model: Model
) -> None:
    streams = {
        f"story-{i}": TimedStream([{"role": "user", "content": f"Tell me a long story about {t}."}])
        for i, t in enumerate(TOPICS)
    }
    expected = {sid: reference(model, s.messages, MAX_TOKENS)[1] for sid, s in streams.items()}
    reports: list[str] = []
    supervisor = Supervisor(cluster, reports.append)
    threads = [threading.Thread(target=s.read, args=(client, sid)) for sid, s in streams.items()]
    for t in threads:
        t.start()

    def all_running() -> bool:
        busy = sum(worker_status(r, w)["num_running"] for w in cluster.worker_ids)
        return busy == len(streams) and all(len(s.arrivals) >= 2 for s in streams.values())

    supervise_until(supervisor, all_running, "every stream to run")
    kill = kill_the_busiest(cluster, r)
    sent_before = {sid: len(s.tokens()) for sid, s in streams.items()}
    supervise_until(supervisor, lambda: not any(t.is_alive() for t in threads), "the streams")

    survivor = next(w for w in cluster.worker_ids if w != kill.worker_id)
    for sid, s in streams.items():
        assert s.error is None and s.completion is not None, (sid, s.error)
        assert sent_before[sid] < len(expected[sid])  # it was cut off by the kill
        assert s.tokens() == expected[sid], sid
        indexes = [i for _, c in s.arrivals for i in range(c.index, c.index + len(c.token_ids))]
        assert indexes == list(range(len(expected[sid]))), sid  # each index once, in order
        assert s.completion.worker_id == survivor, sid
    ended = {s.completion.request_id: s for s in streams.values() if s.completion}
    moved = [ended[rid] for rid in kill.running]
    assert len(moved) >= 2  # the busier of two workers ran 2 of the 4 at least
    resumed = sorted(round(s.resumed_s(r, kill), 3) for s in moved)
    print(f"\n{kill.worker_id} killed; its {len(moved)} streams resumed after {resumed} s")
    assert max(resumed) <= RESUME_S, resumed
    came_back(cluster, client, r, model, supervisor, kill)
    assert any(f"{kill.worker_id} was killed by SIGKILL" in line for line in reports), reports


def came_back(
    cluster: Cluster,
    client: Client,
    r: redis_lib.Redis,
    model: Model,
    supervisor: Supervisor,
    kill: Kill,
) -> None:
    """The launcher started the killed worker again, under its id, and it takes new
    sessions."""
    victim = kill.worker_id
    supervise_until(supervisor, lambda: supervisor.restarts.get(victim), "the restart")
    pid = cluster.processes[victim].pid
    assert pid != kill.pid
    supervise_until(supervisor, lambda: ready(r, victim, pid), f"{victim} to be ready again")
    messages = [{"role": "user", "content": "Name a color."}]
    expected = reference(model, messages, 4)[1]
    for i in range(20):  # placement decides which worker; the restarted one gets some
        reply = client.complete(f"after-{i}", messages=messages, max_tokens=4)
        assert reply.token_ids == expected
        if reply.completion.worker_id == victim:
            return
    raise AssertionError(f"20 new sessions and none ran on the restarted {victim}")


def test_a_late_kill_resumes_by_prefilling_the_tokens_sent(
    cluster: Cluster, client: Client, r: redis_lib.Redis, model: Model
) -> None:
    """Killed after 200 tokens of a 300-token answer: the same tokens as an undisturbed run,
    and the adopter's first new token within ceil((prompt + sent) / chunk) + 1 steps."""
    sampling = SamplingParams(max_tokens=LATE_TOKENS, ignore_eos=True)
    messages = [{"role": "user", "content": "Tell me a long story about a cartographer."}]
    stream = TimedStream(messages, {"max_tokens": LATE_TOKENS, "ignore_eos": True})
    ids = prompt_ids(model, messages)
    expected = cold_ids(model, Request("ref", ids, sampling))
    supervisor = Supervisor(cluster, lambda line: None)
    reader = threading.Thread(target=stream.read, args=(client, "late-kill"))
    reader.start()
    supervise_until(supervisor, lambda: len(stream.tokens()) >= LATE_KILL_AT, "200 tokens")
    kill = kill_the_busiest(cluster, r)
    supervise_until(supervisor, lambda: not reader.is_alive(), "the stream")
    assert stream.error is None and stream.completion is not None, stream.error
    assert stream.tokens() == expected
    adopter = stream.completion.worker_id
    assert adopter != kill.worker_id
    sent, steps = resume_counts(cluster, adopter, stream.completion.request_id)
    assert sent >= LATE_KILL_AT
    chunk = EngineConfig().prefill_chunk_tokens
    assert steps <= math.ceil((len(ids) + sent) / chunk) + 1, (sent, steps)
    stall_s = stream.resumed_s(r, kill)
    print(f"\nkilled after {sent} tokens sent: resumed in {steps} steps, {stall_s:.3f} s")
    w = kill.worker_id
    supervise_until(supervisor, lambda: ready(r, w, cluster.processes[w].pid), "the restart")


def resume_counts(cluster: Cluster, worker_id: str, request_id: str) -> tuple[int, int]:
    """From the adopter's log: the tokens sent before it took the request over, and the
    engine steps it took to the first new one."""
    text = cluster.log_path(worker_id).read_text(errors="replace")
    sent = re.search(rf"resuming {request_id} after the (?P<sent>\d+) token", text)
    steps = re.search(rf"resumed {request_id}: its first new token after (?P<steps>\d+) ", text)
    assert sent and steps, f"no resume of {request_id} in {worker_id}'s log"
    return int(sent["sent"]), int(steps["steps"])
