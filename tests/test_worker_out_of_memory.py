"""A step that cannot get its memory does not take the worker down: on a real Redis, a
worker whose engine step raises MemoryError (the C kernels' scratch refused, say) ends that
step's request with RESOURCE_EXHAUSTED, acknowledges it, and serves the next request of the
same session."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
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
from tests.cluster_fixtures import decoded_client, redis_client, redis_server  # noqa: F401
from tests.cluster_helpers import wait_for
from tests.tiny_gguf import write_tiny_llama
from worker.config import WorkerConfig
from worker.loop import Worker

WORKER = "w-oom"
Reply = TokenChunk | Completion | JobError


@pytest.fixture
def worker(decoded: redis_lib.Redis, tmp_path: Path) -> Iterator[Worker]:
    model = Model.load(write_tiny_llama(tmp_path / "tiny.gguf"), device="cpu")
    engine = Engine(model)
    run, failures = engine.runner.run, [MemoryError("aligned_alloc failed")]

    def first_step_out_of_memory(batch):
        if failures:
            raise failures.pop()
        return run(batch)

    engine.runner.run = first_step_out_of_memory  # type: ignore[method-assign]
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


def send(r: redis_lib.Redis, worker: Worker, rid: str) -> None:
    now = time.time()
    prompt = tuple(worker.state.engine.model.tokenizer.encode("the heather in the"))
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


def test_a_step_out_of_memory_ends_its_request_and_the_worker_serves_on(
    decoded: redis_lib.Redis, worker: Worker
) -> None:
    send(decoded, worker, "a")
    (error,) = replies(decoded, "a")
    assert isinstance(error, JobError) and error.code == "RESOURCE_EXHAUSTED"
    assert "out of memory for a step: aligned_alloc failed" in error.message

    send(decoded, worker, "b")  # the same session, on the same worker
    *chunks, done = replies(decoded, "b")
    assert isinstance(done, Completion) and done.usage.completion_tokens == 3
    assert sum(len(c.token_ids) for c in chunks if isinstance(c, TokenChunk)) == 3
    # both entries acknowledged: nothing pending on the worker's stream, nothing running
    pending = lambda: decoded.xpending(keys.pinned_stream(WORKER), keys.GROUP)["pending"]  # noqa: E731
    wait_for(lambda: not pending(), "the entries to be acknowledged")
    assert not worker.state.inflight and not worker.state.engine.sequences
