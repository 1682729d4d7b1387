"""A worker told to drain after its Redis died: nothing can be handed over or published, and
other workers take it for dead once its heartbeat lapses, so it stops by itself then instead
of draining until it is killed."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
import redis as redis_lib

from broker import codec, keys
from broker.messages import Job
from broker.worker_broker import WorkerBroker
from common.enums import Priority
from common.sampling import SamplingParams
from engine.engine import Engine
from engine.model import Model
from tests.cluster_helpers import wait_for
from tests.tiny_gguf import write_tiny_llama
from warmfleet.processes import kill
from warmfleet.redis_server import RedisServer
from worker.config import WorkerConfig
from worker.loop import Worker

WORKER = "w-alone"
STEP_S = 0.02  # each step slowed down, so the request still runs when Redis dies


def test_a_draining_worker_whose_redis_died_stops_by_itself(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = Model.load(write_tiny_llama(tmp_path / "tiny.gguf"), device="cpu")
    engine = Engine(model)
    run = engine.runner.run

    def slow_run(batch):
        time.sleep(STEP_S)
        return run(batch)

    engine.runner.run = slow_run  # type: ignore[method-assign]
    with RedisServer() as server:
        r = redis_lib.Redis.from_url(server.url, decode_responses=True, socket_timeout=2.0)
        config = WorkerConfig(WORKER)
        worker = Worker(engine, WorkerBroker(r, WORKER, lease_s=config.lease_s), config)
        thread = threading.Thread(target=worker.run, daemon=True)
        try:
            with caplog.at_level(logging.INFO, logger="warmfleet.worker"):
                thread.start()
                send_and_wait_for_a_token(r, model)
                assert server.process is not None
                kill(server.process)
                worker.stopping = True  # as a first SIGTERM does
                # a deadline on the wait: without the fix the drain never ends by itself
                thread.join(timeout=30)
                assert not thread.is_alive(), "the worker is still draining without Redis"
        finally:
            worker.stop_now = True
            thread.join(timeout=30)
    assert worker.inflight, "the request ended: Redis died too late to test the drain"
    messages = [m.getMessage() for m in caplog.records]
    assert any(m.startswith("draining, but Redis is gone (") for m in messages), messages


def send_and_wait_for_a_token(r: redis_lib.Redis, model: Model) -> None:
    """A request of many tokens on the worker's stream, until its first token is out."""
    wait_for(lambda: r.sismember(keys.WORKERS, WORKER), "the worker to register")
    now = time.time()
    sampling = SamplingParams(max_tokens=200, ignore_eos=True)
    prompt = tuple(model.tokenizer.encode("the heather in the moor"))
    job = Job("a", "t", "s1", prompt, sampling, Priority.NORMAL, now, now + 60)
    r.xadd(keys.pinned_stream(WORKER), codec.fields(job))
    wait_for(lambda: r.exists(keys.out_stream("a")), "the request's first token")
