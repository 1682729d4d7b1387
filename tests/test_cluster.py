"""The whole system end to end: real Redis, real gRPC over loopback, 2 worker processes and
the real default model. Every reply is checked against the in-process engine."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis as redis_lib

from broker import keys
from engine.chat import render_chat
from engine.engine import Engine
from engine.model import Model
from engine.sampling import SamplingParams
from engine.sequence import Request
from warmfleet.client import Client, Reply, collect
from warmfleet.launcher import Cluster
from warmfleet.v1 import inference_pb2 as pb

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
def cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with Cluster(
        num_workers=2,
        model=default_model_path,
        lease_s=2.0,
        log_dir=tmp_path_factory.mktemp("cluster-logs"),
        worker_args=["--spill-dir", str(tmp_path_factory.mktemp("spill"))],
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Iterator[Client]:
    with Client(cluster.target, timeout_s=180) as c:
        yield c


@pytest.fixture(scope="module")
def redis(cluster: Cluster) -> redis_lib.Redis:
    return redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)


def reference(
    model: Model, messages: list[dict[str, str]], max_tokens: int = NEW_TOKENS
) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy completion ids) from the in-process engine."""
    assert model.tokenizer.chat_template is not None
    ids = model.tokenizer.encode(render_chat(model.tokenizer.chat_template, messages))
    out = Engine(model).generate([Request("ref", ids, SamplingParams(max_tokens=max_tokens))])
    return ids, [t for o in out["ref"] for t in o.token_ids]


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def worker_status(redis: redis_lib.Redis, worker_id: str) -> dict[str, object]:
    raw = redis.get(keys.heartbeat_key(worker_id))
    assert raw is not None, f"{worker_id} has no heartbeat"
    return json.loads(raw)


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


def test_six_sessions_three_turns_sticky_and_exact(
    cluster: Cluster, client: Client, model: Model, redis: redis_lib.Redis
) -> None:
    conversations: dict[str, list[dict[str, str]]] = {f"chat-{i}": [] for i in range(6)}
    replies: dict[str, list[Reply]] = {sid: [] for sid in conversations}
    errors: list[BaseException] = []

    def talk(sid: str, turns: list[str]) -> None:
        try:
            for text in turns:
                conversations[sid].append({"role": "user", "content": text})
                reply = client.complete(sid, messages=conversations[sid], max_tokens=NEW_TOKENS)
                replies[sid].append(reply)
                conversations[sid].append({"role": "assistant", "content": reply.text})
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [
        threading.Thread(target=talk, args=(sid, USER_TURNS[i]))
        for i, sid in enumerate(conversations)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    workers_used = set()
    for sid, turns in replies.items():
        assert len(turns) == 3
        messages: list[dict[str, str]] = []
        previous: list[int] = []
        for turn, reply in enumerate(turns):
            messages.append(conversations[sid][2 * turn])
            prompt, expected = reference(model, messages)
            assert reply.token_ids == expected, (sid, turn)
            c = reply.completion
            assert c.usage.prompt_tokens == len(prompt)
            assert c.usage.completion_tokens == len(expected)
            assert [ch.index for ch in reply.chunks if ch.token_ids] == list(range(len(expected)))
            if turn == 0:
                assert c.kv_source == pb.KV_SOURCE_COLD and c.usage.cached_tokens == 0
            else:
                # the previous turn's KV: its prompt and every reply token but the last
                assert c.usage.cached_tokens == common_prefix(previous[:-1], prompt)
                assert c.usage.cached_tokens >= len(previous) - 4  # all but template tokens
                assert c.kv_source == pb.KV_SOURCE_WARM
                assert c.worker_id == turns[0].completion.worker_id  # sticky
            previous = prompt + reply.token_ids
            messages.append(conversations[sid][2 * turn + 1])
        workers_used.add(turns[0].completion.worker_id)
        record = client.get_session(sid)
        assert record.worker_id == turns[0].completion.worker_id
        assert record.tier == pb.TIER_WARM and record.num_tokens == len(previous) - 1
    assert workers_used <= set(cluster.worker_ids)
    listed = {s.session_id for s in client.list_sessions(page_size=4)}
    assert set(conversations) <= listed


def test_a_turn_sent_the_instant_the_last_one_ends_reuses_all_of_it(
    client: Client, model: Model
) -> None:
    """5 agents, each sending its next turn the moment the previous completion arrives: 30
    follow-ups, each reusing exactly what the session held (its last prompt and every reply
    token but the last), on the worker that held it."""
    num_turns = 7
    topics = ["rivers", "bridges", "owls", "tea", "rain"]
    done: dict[str, list[tuple[list[dict[str, str]], Reply]]] = {t: [] for t in topics}
    errors: list[BaseException] = []

    def agent(topic: str) -> None:
        messages: list[dict[str, str]] = []
        try:
            for turn in range(num_turns):
                messages.append({"role": "user", "content": f"Tell me fact {turn} on {topic}."})
                reply = client.complete(f"instant-{topic}", messages=messages, max_tokens=8)
                done[topic].append((list(messages), reply))
                messages.append({"role": "assistant", "content": reply.text})
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=agent, args=(t,)) for t in topics]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    follow_ups = 0
    for topic, turns in done.items():
        assert len(turns) == num_turns
        previous: list[int] = []
        for turn, (messages, reply) in enumerate(turns):
            prompt, expected = reference(model, messages, max_tokens=8)
            assert reply.token_ids == expected, (topic, turn)
            c = reply.completion
            if turn > 0:
                assert c.usage.cached_tokens == common_prefix(previous[:-1], prompt), (topic, turn)
                assert c.kv_source == pb.KV_SOURCE_WARM, (topic, turn)
                assert c.worker_id == turns[turn - 1][1].completion.worker_id, (topic, turn)
                follow_ups += 1
            previous = prompt + reply.token_ids
    assert follow_ups == 30


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
    chunks = 0
    for response in call:
        chunks += response.HasField("chunk")
        if chunks == 1:
            bystander.start()
        if chunks == 5:
            break
    running = {w: worker_status(redis, w) for w in cluster.worker_ids}
    holder = next(w for w, st in running.items() if st["running"])
    rid = next(iter(running[holder]["running"]))  # type: ignore[call-overload]
    cancelled_ms = time.time() * 1000
    call.cancel()
    deadline = time.monotonic() + 10
    while rid in worker_status(redis, holder)["running"]:  # type: ignore[operator]
        assert time.monotonic() < deadline, "the cancelled request still runs after 10 s"
        time.sleep(0.005)
    # what the worker published for it after the cancel: at most the step in flight
    events = redis.xrange(keys.out_stream(rid))
    late = [f for eid, f in events if int(eid.split("-")[0]) > cancelled_ms and f["k"] == "chunk"]
    assert len(late) <= 1, late
    done = json.loads(events[-1][1]["c"])
    assert done["finish_reason"] == "cancelled"
    assert done["usage"]["completion_tokens"] < 400
    bystander.join(timeout=120)
    assert healthy and healthy[0].token_ids == reference(model, healthy_messages)[1]


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
        if len(chunks) == 6 and victim is None:
            for w in cluster.worker_ids:
                status = worker_status(redis, w)
                if status["running"]:
                    victim = w
                    os.kill(int(status["pid"]), signal.SIGKILL)  # type: ignore[call-overload]
    assert victim is not None and completion is not None
    assert completion.worker_id != victim
    assert [c.index for c in chunks if c.token_ids] == list(range(len(expected)))
    assert [t for c in chunks for t in c.token_ids] == expected
    cluster.restart(victim)  # leave the cluster whole


BAD_INPUTS = [
    ("empty prompt", dict(prompt=""), grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
    ("no input", dict(), grpc.StatusCode.INVALID_ARGUMENT, "input"),
    (
        "unknown role",
        dict(messages=[{"role": "wizard", "content": "hi"}]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "role",
    ),
    (
        "max_tokens 0",
        dict(prompt="hi", max_tokens=0),
        grpc.StatusCode.INVALID_ARGUMENT,
        "max_tokens",
    ),
    (
        "max_tokens -5",
        dict(prompt="hi", max_tokens=-5),
        grpc.StatusCode.INVALID_ARGUMENT,
        "max_tokens",
    ),
    (
        "temperature < 0",
        dict(prompt="hi", temperature=-0.5),
        grpc.StatusCode.INVALID_ARGUMENT,
        "temperature",
    ),
    ("top_p 0", dict(prompt="hi", top_p=0.0), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    ("top_p > 1", dict(prompt="hi", top_p=1.5), grpc.StatusCode.INVALID_ARGUMENT, "top_p"),
    (
        "token id out of vocab",
        dict(token_ids=[1, 49152]),
        grpc.StatusCode.INVALID_ARGUMENT,
        "token_ids",
    ),
    (
        "prompt over the context",
        dict(token_ids=[42] * 8192),
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "prompt",
    ),
]


@pytest.mark.parametrize(
    ("name", "kwargs", "code", "field"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS]
)
def test_bad_input_is_rejected_precisely(
    client: Client, name: str, kwargs: dict[str, object], code: grpc.StatusCode, field: str
) -> None:
    """The real gateway's status and message, as the client raises them."""
    with pytest.raises(grpc.RpcError) as err:
        client.complete("bad-input", timeout_s=30, **kwargs)
    assert err.value.code() == code, err.value.details()
    assert field in err.value.details()


@pytest.mark.parametrize("session_id", ["x" * 129, "tab\there", "new\nline", "nul\x00"])
def test_bad_session_ids_are_rejected(client: Client, session_id: str) -> None:
    with pytest.raises(grpc.RpcError) as err:
        client.complete(session_id, prompt="hi", max_tokens=2, timeout_s=30)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "session_id" in err.value.details()


def test_bad_input_disturbs_no_one(
    client: Client, model: Model, cluster: Cluster, redis: redis_lib.Redis
) -> None:
    messages = [{"role": "user", "content": "Name three fruits."}]
    stream = client.stream("healthy", messages=messages, max_tokens=NEW_TOKENS)
    for _, kwargs, _, _ in BAD_INPUTS:
        with pytest.raises(grpc.RpcError):
            client.complete("healthy", timeout_s=30, **kwargs)  # type: ignore[arg-type]
    reply = collect(stream)
    assert reply.token_ids == reference(model, messages)[1]
    for w in cluster.worker_ids:  # no worker died or restarted
        assert worker_status(redis, w)["pid"] == cluster.processes[w].pid


def test_session_id_from_metadata_and_delete(client: Client) -> None:
    reply = client.complete(
        "", prompt="Hello", max_tokens=3, metadata=[("x-session-id", "from-metadata")]
    )
    assert reply.completion.usage.completion_tokens >= 1
    assert client.get_session("from-metadata").num_tokens > 0
    assert client.delete_session("from-metadata") is True
    with pytest.raises(grpc.RpcError) as err:
        client.get_session("from-metadata")
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert client.delete_session("from-metadata") is False


def test_fork_session_continues_independently(client: Client, model: Model) -> None:
    base = [{"role": "user", "content": "Name a large animal."}]
    first = client.complete("trunk", messages=base, max_tokens=NEW_TOKENS)
    fork = client.fork_session("trunk", "branch")
    assert fork.session_id == "branch" and fork.worker_id == first.completion.worker_id
    history = [*base, {"role": "assistant", "content": first.text}]
    for sid, follow_up in (("trunk", "Where does it live?"), ("branch", "What does it eat?")):
        messages = [*history, {"role": "user", "content": follow_up}]
        reply = client.complete(sid, messages=messages, max_tokens=NEW_TOKENS)
        assert reply.token_ids == reference(model, messages)[1], sid
        assert reply.completion.kv_source == pb.KV_SOURCE_WARM, sid
        assert reply.completion.usage.cached_tokens >= len(first.token_ids) + 30, sid
        assert reply.completion.worker_id == first.completion.worker_id
    for source, new, code in (
        ("no-such", "x", grpc.StatusCode.NOT_FOUND),
        ("trunk", "branch", grpc.StatusCode.ALREADY_EXISTS),
        ("trunk", "", grpc.StatusCode.INVALID_ARGUMENT),
    ):
        with pytest.raises(grpc.RpcError) as err:
            client.fork_session(source, new)
        assert err.value.code() == code
