"""The whole system end to end: real Redis, real gRPC over loopback, 2 worker processes and
the real default model. Every reply is checked against the in-process engine."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time

import grpc
import pytest
import redis as redis_lib

from broker import codec, keys
from broker.messages import Completion, JobError, TokenChunk
from common.enums import FinishReason
from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.cluster_fixtures import cluster_client, cluster_redis  # noqa: F401
from tests.cluster_helpers import (
    assert_turns_exact_and_warm,
    records,
    reference,
    talk_in_parallel,
    wait_for,
    worker_status,
)
from warmfleet.client import Client, Reply
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
NEW_TOKENS = 20
USER_TURNS = [
    ["What is the capital of France?", "And of Italy?", "Which of the two is larger?"],
    ["Write a Python function that adds two numbers.", "Now make it add three.", "Thanks!"],
    ["Name a primary color.", "Name another one.", "What do they make together?"],
    ["Say hello in Spanish.", "And in German?", "And in French?"],
    ["What is 2 + 2?", "What is 3 + 3?", "What is 4 + 4?"],
    ["Give me a short tip for writing tests.", "Another one, please.", "One more."],
]


@pytest.fixture(scope="module")
def cluster(default_cluster: Cluster) -> Cluster:
    return default_cluster


@pytest.fixture(scope="module")
def redis(r: redis_lib.Redis) -> redis_lib.Redis:
    return r


def test_health_and_reflection(cluster: Cluster) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(cluster.target) as ch:
        health = health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service="warmfleet.v1.Inference"), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert {"warmfleet.v1.Inference", "grpc.health.v1.Health"} <= names


def test_heartbeats_report_the_quantized_weights_in_memory(
    cluster: Cluster, redis: redis_lib.Redis, model: Model
) -> None:
    for worker_id in cluster.worker_ids:
        status = worker_status(redis, worker_id)
        assert status["weights"] == "quantized"
        assert status["weight_bytes"] == model.weight_bytes  # loaded the same way here
        assert status["weight_bytes"] <= 1.3 * model.path.stat().st_size


def test_six_sessions_three_turns_sticky_and_exact(
    cluster: Cluster, client: Client, model: Model
) -> None:
    scripts = {f"chat-{i}": turns for i, turns in enumerate(USER_TURNS)}
    done = talk_in_parallel(client, scripts, NEW_TOKENS)
    for sid, turns in done.items():
        assert len(turns) == 3
        held = assert_turns_exact_and_warm(model, sid, turns, NEW_TOKENS)
        # all but the chat template's tokens of each new turn were reused
        for (_, before), (_, after) in itertools.pairwise(turns):
            previous = before.completion.usage.prompt_tokens + len(before.token_ids)
            assert after.completion.usage.cached_tokens >= previous - 4
        record = client.get_session(sid)
        assert record.worker_id == turns[0][1].completion.worker_id
        assert record.tier == pb.TIER_WARM and record.num_tokens == held
    assert {t[0][1].completion.worker_id for t in done.values()} <= set(cluster.worker_ids)
    listed = {s.session_id for s in client.list_sessions(page_size=4)}
    assert set(scripts) <= listed


def test_a_turn_sent_the_instant_the_last_one_ends_reuses_all_of_it(
    client: Client, model: Model
) -> None:
    """5 agents, each sending its next turn the moment the previous completion arrives: 30
    follow-ups, each reusing exactly what the session held, on the worker that held it."""
    topics = ["rivers", "bridges", "owls", "tea", "rain"]
    scripts = {f"instant-{t}": [f"Tell me fact {n} on {t}." for n in range(7)] for t in topics}
    done = talk_in_parallel(client, scripts, max_tokens=8)
    for sid, turns in done.items():
        assert len(turns) == 7
        assert_turns_exact_and_warm(model, sid, turns, max_tokens=8)
    assert sum(len(turns) - 1 for turns in done.values()) == 30


def only_running(cluster: Cluster, redis: redis_lib.Redis) -> tuple[str, str]:
    """(worker, request id) of the one request running in the cluster, once the workers'
    statuses show it."""
    deadline = time.monotonic() + 10
    while True:
        running = {w: worker_status(redis, w)["running"] for w in cluster.worker_ids}
        found = [(w, rid) for w, rids in running.items() for rid in rids]
        if len(found) == 1:
            return found[0]
        assert time.monotonic() < deadline, f"not one request running: {running}"
        time.sleep(0.005)


def test_cancel_frees_the_sequence_within_a_step(
    cluster: Cluster, client: Client, model: Model, redis: redis_lib.Redis
) -> None:
    healthy_messages = [{"role": "user", "content": "What is the capital of Spain?"}]
    healthy: list[Reply] = []
    bystander = threading.Thread(
        target=lambda: healthy.append(
            client.complete("bystander", messages=healthy_messages, max_tokens=NEW_TOKENS)
        )
    )
    call = client.stream(
        "to-cancel", prompt="Once upon a time, in a land far away,", max_tokens=400
    )
    chunks, holder, rid = 0, "", ""
    for response in call:
        chunks += response.HasField("chunk")
        if chunks == 1:  # the request to cancel is the only one running: find it
            holder, rid = only_running(cluster, redis)
            bystander.start()
        if chunks == 5:
            break
    cancelled_ms = time.time() * 1000
    call.cancel()
    deadline = time.monotonic() + 10
    while rid in worker_status(redis, holder)["running"]:
        assert time.monotonic() < deadline, "the cancelled request still runs after 10 s"
        time.sleep(0.005)
    # what the worker published for it after the cancel: at most the step in flight
    events = [
        (int(eid.split("-")[0]), codec.decode_fields(f, TokenChunk, Completion, JobError))
        for eid, f in redis.xrange(keys.out_stream(rid))
    ]
    late = [m for ms, m in events if ms > cancelled_ms and isinstance(m, TokenChunk)]
    assert len(late) <= 1, late
    done = events[-1][1]
    assert isinstance(done, Completion) and done.finish_reason == FinishReason.CANCELLED
    assert done.usage.completion_tokens < 400
    bystander.join(timeout=120)
    assert healthy and healthy[0].token_ids == reference(model, healthy_messages, NEW_TOKENS)[1]


def test_kill_9_mid_generation_resumes_elsewhere_without_duplicates(
    cluster: Cluster, client: Client, model: Model, redis: redis_lib.Redis
) -> None:
    messages = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
    _, expected = reference(model, messages, max_tokens=48)
    assert len(expected) == 48
    call = client.stream("survivor", messages=messages, max_tokens=48, timeout_s=180)
    chunks: list[pb.Chunk] = []
    victim = None
    completion = None
    for response in call:
        if response.HasField("completion"):
            completion = response.completion
            break
        chunks.append(response.chunk)
        if len(chunks) >= 6 and victim is None:  # once a heartbeat shows it running
            for w in cluster.worker_ids:
                status = worker_status(redis, w)
                if status["running"]:
                    victim = w
                    os.kill(int(status["pid"]), signal.SIGKILL)
    assert victim is not None and completion is not None
    assert completion.worker_id != victim
    assert [c.index for c in chunks if c.token_ids] == list(range(len(expected)))
    assert [t for c in chunks for t in c.token_ids] == expected
    # the adopter keeps the session warm: the kvstore's orders to the dead worker (FORGET
    # its copy) came with its stream and must not make the adopter forget its own
    wait_for(lambda: records(redis)["survivor"]["tier"] == "warm",
             lambda: f"the survivor warm: {records(redis)['survivor']}")  # fmt: skip
    assert records(redis)["survivor"]["worker"] == completion.worker_id
    cluster.restart(victim)  # leave the cluster whole
