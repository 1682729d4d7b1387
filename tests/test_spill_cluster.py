"""Idle sessions spill to disk when the warm pool is over budget and come back on resume,
through the whole system (real Redis, gRPC, a worker process, the real model)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import redis as redis_lib

from broker import keys
from engine.chat import render_chat
from engine.model import Model
from tests.test_cluster import common_prefix, reference
from warmfleet.client import Client, Reply
from warmfleet.launcher import Cluster
from warmfleet.v1 import inference_pb2 as pb
from worker.spill import SpillStore

pytestmark = pytest.mark.slow
NEW_TOKENS = 16
WARM_BUDGET_MB = 30  # one session's KV takes 11.25 MiB (256 positions): two fit


@pytest.fixture(scope="module")
def spill_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spill")


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, spill_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with Cluster(
        num_workers=1,
        model=default_model_path,
        spill_dir=spill_dir,
        warm_budget=WARM_BUDGET_MB << 20,
        log_dir=tmp_path_factory.mktemp("logs"),
    ) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster: Cluster) -> Iterator[Client]:
    with Client(cluster.target, timeout_s=120) as c:
        yield c


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def spill_stats(cluster: Cluster) -> dict[str, int]:
    r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
    return json.loads(r.get(keys.heartbeat_key("w0")))["spill"]


def test_evicted_sessions_spill_and_resume_from_disk(
    cluster: Cluster, client: Client, model: Model, spill_dir: Path
) -> None:
    conversations = {
        f"agent-{i}": [{"role": "user", "content": f"Count from {i} to {i + 5}."}] for i in range(4)
    }
    first: dict[str, Reply] = {}
    for sid, messages in conversations.items():
        first[sid] = client.complete(sid, messages=messages, max_tokens=NEW_TOKENS)

    # 4 sessions, room for 2: the two least recently used went to disk
    def on_disk(*sids: str) -> bool:
        return all(client.get_session(s).tier == pb.TIER_DISK for s in sids)

    wait_for(lambda: on_disk("agent-0", "agent-1"), "agent-0 and agent-1 on disk")
    for sid in ("agent-2", "agent-3"):
        assert client.get_session(sid).tier == pb.TIER_WARM
    files = sorted(spill_dir.glob("*.wfkv"))
    assert len(files) == 2 and all(f.stat().st_size > 1 << 20 for f in files)
    assert spill_stats(cluster)["num_spilled"] == 2

    # resume agent-0 from disk: its KV is reused and its tokens are exact
    sid = "agent-0"
    messages = [
        *conversations[sid],
        {"role": "assistant", "content": first[sid].text},
        {"role": "user", "content": "Now backwards."},
    ]
    reply = client.complete(sid, messages=messages, max_tokens=NEW_TOKENS)
    prompt, expected = reference(model, messages, NEW_TOKENS)
    assert reply.token_ids == expected
    previous = _prompt(model, conversations[sid]) + first[sid].token_ids
    assert reply.completion.kv_source == pb.KV_SOURCE_DISK
    assert reply.completion.usage.cached_tokens == common_prefix(previous[:-1], prompt) > 30
    assert spill_stats(cluster)["num_restored"] == 1


def test_corrupt_spill_file_is_rejected_and_recomputed(
    cluster: Cluster, client: Client, model: Model, spill_dir: Path
) -> None:
    sid = "agent-1"
    assert client.get_session(sid).tier == pb.TIER_DISK
    (path,) = [p for p in spill_dir.glob("*.wfkv") if _holds(p, sid, model)]
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01  # one flipped bit in the payload
    path.write_bytes(bytes(data))
    messages = [{"role": "user", "content": "Count from 1 to 6."}]
    reply = client.complete(sid, messages=messages, max_tokens=NEW_TOKENS)
    assert reply.token_ids == reference(model, messages, NEW_TOKENS)[1]
    assert reply.completion.kv_source == pb.KV_SOURCE_COLD
    assert reply.completion.usage.cached_tokens == 0
    assert not path.exists()
    assert spill_stats(cluster)["num_rejected"] == 1


def test_delete_session_on_disk_leaves_no_trace(
    cluster: Cluster, client: Client, spill_dir: Path, model: Model
) -> None:
    for i in range(3):  # push the older sessions out to disk
        client.complete(f"filler-{i}", prompt=f"Filler number {i}.", max_tokens=4)
    disk = [s.session_id for s in client.list_sessions() if s.tier == pb.TIER_DISK]
    assert disk
    sid = disk[0]
    path = SpillStore(spill_dir, model.fingerprint).path_for(
        keys.cache_key(keys.DEFAULT_TENANT, sid)
    )
    assert path.exists()
    assert client.delete_session(sid) is True
    wait_for(lambda: not path.exists(), "the session's spill file to go")
    r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
    assert not r.exists(keys.session_key(keys.DEFAULT_TENANT, sid))
    assert r.zscore(keys.session_index(keys.DEFAULT_TENANT), sid) is None
    with pytest.raises(grpc.RpcError) as err:
        client.get_session(sid)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def _prompt(model: Model, messages: list[dict[str, str]]) -> list[int]:
    assert model.tokenizer.chat_template is not None
    return model.tokenizer.encode(render_chat(model.tokenizer.chat_template, messages))


def _holds(path: Path, session_id: str, model: Model) -> bool:
    store = SpillStore(path.parent, model.fingerprint)
    return store.path_for(keys.cache_key(keys.DEFAULT_TENANT, session_id)) == path


def test_fork_of_a_session_on_disk(cluster: Cluster, client: Client, model: Model) -> None:
    texts = {f"pusher-{i}": f"Pusher number {i} writes a short line." for i in range(3)}
    for sid, text in texts.items():  # the first pushers go to disk
        client.complete(sid, prompt=text, max_tokens=4)
    source = "pusher-0"  # two sessions fit: the third pushed the first out
    wait_for(lambda: client.get_session(source).tier == pb.TIER_DISK, "pusher-0 on disk")
    restored = spill_stats(cluster)["num_restored"]
    client.fork_session(source, f"{source}-fork")
    reply = client.complete(
        f"{source}-fork", prompt=texts[source] + " And another one.", max_tokens=4
    )
    # the worker brought the source back from its file and copied it before this request
    assert spill_stats(cluster)["num_restored"] == restored + 1
    assert reply.completion.kv_source == pb.KV_SOURCE_WARM
    assert reply.completion.usage.cached_tokens >= len(model.tokenizer.encode(texts[source])) - 1
