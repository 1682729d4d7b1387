"""A step that cannot get its memory does not take the worker down: on a real Redis, a
worker whose engine step raises MemoryError (the C kernels' scratch refused, say) runs it
again in smaller steps, with the same tokens; when even a step of one row fails it ends that
step's request with RESOURCE_EXHAUSTED, acknowledges it, and serves the next request of the
same session."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis as redis_lib

from broker import codec, keys
from broker.messages import Completion, Job, JobError, TokenChunk
from broker.worker_broker import WorkerBroker
from common.enums import Priority
from common.sampling import SamplingParams
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from tests.cluster_fixtures import decoded_client, redis_client, redis_server  # noqa: F401
from tests.cluster_helpers import wait_for
from tests.cold_runs import cold_ids
from tests.tiny_gguf import write_tiny_llama
from worker.config import WorkerConfig
from worker.loop import Worker

WORKER = "w-oom"
Reply = TokenChunk | Completion | JobError


@dataclass
class MemoryLimit:
    """Steps of more than `max_rows` rows fail (None: none fail); the rows of every step."""

    max_rows: int | None = None
    steps: list[int] = field(default_factory=list)


@pytest.fixture
def limit() -> MemoryLimit:
    return MemoryLimit()


@pytest.fixture
def model(tmp_path: Path) -> Model:
    return Model.load(write_tiny_llama(tmp_path / "tiny.gguf"), device="cpu")


@pytest.fixture
def worker(decoded: redis_lib.Redis, model: Model, limit: MemoryLimit) -> Iterator[Worker]:
    engine = Engine(model)
    run = engine.runner.run

    def run_within_limit(batch):
        rows = sum(n for _, n in batch)
        limit.steps.append(rows)
        if limit.max_rows is not None and rows > limit.max_rows:
            raise MemoryError("aligned_alloc failed")
        return run(batch)

    engine.runner.run = run_within_limit  # type: ignore[method-assign]
    w = Worker(engine, WorkerBroker(decoded, WORKER, lease_s=600.0), WorkerConfig(WORKER))
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    wait_for(lambda: decoded.sismember(keys.WORKERS, WORKER), "the worker to register")
    try:
        yield w
    finally:
        w.stop_now = True
        thread.join(timeout=30)
        assert not thread.is_alive(), "the worker did not stop"


def prompt_of(model: Model) -> tuple[int, ...]:
    return tuple(model.tokenizer.encode("the heather in the moor"))


def halvings(rows: int, down_to: int) -> list[int]:
    """The rows of a step and of each half of it, until `down_to` rows."""
    out = [rows]
    while out[-1] > down_to:
        out.append(out[-1] // 2)
    return out


def send(r: redis_lib.Redis, worker: Worker, rid: str) -> None:
    now = time.time()
    prompt = prompt_of(worker.state.engine.model)
    sampling = SamplingParams(seed=0, max_tokens=3)
    job = Job(rid, "t", "s1", prompt, sampling, Priority.NORMAL, now, now + 60)
    r.xadd(keys.pinned_stream(WORKER), codec.fields(job))


def replies(r: redis_lib.Redis, rid: str) -> list[Reply]:
    """What the worker published for `rid`, once it ended (a Completion or a JobError)."""
    got: list[Reply] = []

    def ended() -> bool:
        entries = r.xrange(keys.out_stream(rid))
        got[:] = [codec.decode_fields(f, TokenChunk, Completion, JobError) for _, f in entries]
        return bool(got) and not isinstance(got[-1], TokenChunk)

    wait_for(ended, f"request {rid} to end", 60)
    return got


def test_a_step_too_large_for_memory_runs_again_in_smaller_ones(
    decoded: redis_lib.Redis, worker: Worker, limit: MemoryLimit, model: Model
) -> None:
    prompt = prompt_of(model)
    assert len(prompt) >= 5
    request = Request("ref", list(prompt), SamplingParams(seed=0, max_tokens=3))
    expected = cold_ids(model, request)
    limit.max_rows = 2
    send(decoded, worker, "a")
    *chunks, done = replies(decoded, "a")
    assert isinstance(done, Completion)
    got = [t for c in chunks if isinstance(c, TokenChunk) for t in c.token_ids]
    assert got == expected
    # the prompt's step failed, then each half of it, down to steps of 2 rows that ran
    failed = halvings(len(prompt), down_to=2)[:-1]
    assert limit.steps[: len(failed)] == failed
    assert max(limit.steps[len(failed) :]) <= 2 and worker.state.engine.scheduler.row_cap == 2


def test_a_step_of_one_row_out_of_memory_ends_its_request_and_the_worker_serves_on(
    decoded: redis_lib.Redis, worker: Worker, limit: MemoryLimit
) -> None:
    limit.max_rows = 0
    send(decoded, worker, "a")
    (error,) = replies(decoded, "a")
    assert isinstance(error, JobError) and error.code == "RESOURCE_EXHAUSTED"
    assert "out of memory for a step: aligned_alloc failed" in error.message
    # the prompt's step failed, then each half of it, down to one row
    assert limit.steps == halvings(len(prompt_of(worker.state.engine.model)), down_to=1)
    limit.max_rows = None

    send(decoded, worker, "b")  # the same session, on the same worker
    *chunks, done = replies(decoded, "b")
    assert isinstance(done, Completion) and done.usage.completion_tokens == 3
    assert sum(len(c.token_ids) for c in chunks if isinstance(c, TokenChunk)) == 3
    # both entries acknowledged: nothing pending on the worker's stream, nothing running
    pending = lambda: decoded.xpending(keys.pinned_stream(WORKER), keys.GROUP)["pending"]  # noqa: E731
    wait_for(lambda: not pending(), "the entries to be acknowledged")
    assert not worker.state.inflight and not worker.state.engine.sequences
