"""Two workers of one batch slot each. A worker that drains is routed nothing new and hands
the request waiting on its stream to the other worker, its session's KV on disk first. The
gateway's health says whether any worker takes requests, and a request that finds none
waits for one."""

from __future__ import annotations

import itertools
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import redis as redis_lib
from grpc_health.v1 import health_pb2, health_pb2_grpc

from broker import keys
from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.cluster_fixtures import cluster_client, cluster_redis  # noqa: F401
from tests.cluster_helpers import common_prefix, fleet_state, reference, wait_for
from warmfleet.client import Client, Reply, collect
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.processes import wait_exit

pytestmark = pytest.mark.slow
LEASE_S = 2.0
SERVICES = ("", "warmfleet.v1.Inference")
OP_TOKENS = 240  # the drained worker's running request: ~5 s here


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with Cluster(
        ClusterConfig(
            num_workers=2,
            model=default_model_path,
            lease_s=LEASE_S,
            spill_dir=tmp_path_factory.mktemp("spill"),
            worker_args=["--max-running", "1"],
            gateway_args=["--worker-wait-s", "180"],
            log_dir=tmp_path_factory.mktemp("logs"),
        )
    ) as c:
        yield c


def health(cluster: Cluster) -> set[str]:
    """The status names the gateway gives the overall service and the Inference service."""
    with grpc.insecure_channel(cluster.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        return {
            health_pb2.HealthCheckResponse.ServingStatus.Name(
                stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5).status
            )
            for name in SERVICES
        }


def test_a_draining_worker_hands_its_waiting_request_over(
    cluster: Cluster, client: Client, r: redis_lib.Redis, model: Model
) -> None:
    chats = {f"drain-{i}": [{"role": "user", "content": f"Name a tree, {i}."}] for i in range(3)}
    first = {sid: client.complete(sid, messages=m, max_tokens=8) for sid, m in chats.items()}
    by_worker: dict[str, list[str]] = {}
    for sid, reply in first.items():
        by_worker.setdefault(reply.completion.worker_id, []).append(sid)
    holder, (busy, waiting) = next((w, s[:2]) for w, s in by_worker.items() if len(s) >= 2)
    other = next(w for w in cluster.worker_ids if w != holder)
    for sid, reply in first.items():
        chats[sid].append({"role": "assistant", "content": reply.text})
    chats[busy].append({"role": "user", "content": "Count from 1 to 100, one per line."})
    chats[waiting].append({"role": "user", "content": "Is it tall?"})

    long = iter(client.stream(busy, messages=chats[busy], max_tokens=64))
    head = next(long)
    assert head.HasField("chunk")  # it runs: the holder's only slot is taken
    replies: list[Reply] = []
    turn = threading.Thread(
        target=lambda: replies.append(
            client.complete(waiting, messages=chats[waiting], max_tokens=8)
        )
    )
    turn.start()  # routed to the holder, where it waits on the stream for a free slot
    wait_for(lambda: r.xlen(keys.pinned_stream(holder)) == 2, "the turn to wait on the holder")
    process = cluster.processes[holder]
    process.send_signal(signal.SIGTERM)
    turn.join(timeout=180)
    finished = collect(itertools.chain([head], long))  # it finishes where it runs
    assert wait_exit(process, 60) == 0

    (moved,) = replies
    prompt, expected = reference(model, chats[waiting], max_tokens=8)
    assert moved.token_ids == expected
    assert moved.completion.worker_id == other
    assert moved.completion.kv_source == pb.KV_SOURCE_DISK  # spilled by the holder first
    previous = reference(model, chats[waiting][:1], max_tokens=8)
    held = previous[0] + previous[1]
    assert moved.completion.usage.cached_tokens == common_prefix(held[:-1], prompt)
    assert finished.completion.worker_id == holder
    assert finished.token_ids == reference(model, chats[busy], max_tokens=64)[1]
    log = cluster.log_path(holder).read_text()
    assert f"handed {moved.completion.request_id} over to {other}" in log
    assert holder not in r.smembers(keys.WORKERS)
    assert not r.exists(keys.draining_key(holder), keys.pinned_stream(holder))
    cluster.restart(holder)


def test_an_operators_drain_finishes_the_running_request_and_the_worker_leaves(
    cluster: Cluster, client: Client, r: redis_lib.Redis
) -> None:
    """The dashboard's action (no key file: the local caller is an admin)."""
    # long enough (seconds) that the drain below comes while both still run, on any machine
    streams = [iter(client.stream(f"op-{i}", prompt="Count to a hundred.", max_tokens=OP_TOKENS,
                                  ignore_eos=True)) for i in range(2)]  # fmt: skip
    heads = [next(s) for s in streams]  # one runs on each worker (one slot each)
    # each pinned stream holds its request's entry until the request ends (the heartbeats'
    # num_running is up to a beat old: a short request could end between two looks)
    wait_for(lambda: all(r.xlen(keys.pinned_stream(w)) == 1 for w in cluster.worker_ids),
             lambda: f"a request on each worker: {fleet_state(r)}")  # fmt: skip
    process = cluster.processes["w1"]
    drained = httpx.post(f"{cluster.http_url}/dashboard/api/drain", json={"worker_id": "w1"},
                         timeout=30)  # fmt: skip
    assert drained.status_code == 200 and drained.json() == {"worker_id": "w1", "state": "draining"}
    assert r.exists(keys.draining_key("w1"))  # routed nothing more from now on
    done = [collect(itertools.chain([h], s)) for h, s in zip(heads, streams, strict=True)]
    assert sorted(d.completion.worker_id for d in done) == ["w0", "w1"]
    assert all(len(d.token_ids) == OP_TOKENS for d in done)  # the running one finished on w1
    assert wait_exit(process, 60) == 0
    assert "w1" not in r.smembers(keys.WORKERS)
    assert client.complete("after", prompt="Hi", max_tokens=2).completion.worker_id == "w0"
    cluster.restart("w1")


def test_health_follows_the_workers_and_a_request_waits_for_one(
    cluster: Cluster, client: Client, model: Model
) -> None:
    assert health(cluster) == {"SERVING"}
    assert cluster.kill("w0") == -signal.SIGKILL  # its heartbeat lapses after the lease
    assert cluster.terminate("w1") == 0  # it drains and leaves
    wait_for(lambda: health(cluster) == {"NOT_SERVING"}, "NOT_SERVING", timeout_s=LEASE_S + 10)

    messages = [{"role": "user", "content": "Say hi."}]
    waited: list[Reply] = []
    sent = threading.Thread(
        target=lambda: waited.append(client.complete("patient", messages=messages, max_tokens=4))
    )
    sent.start()  # no worker: the gateway holds it until one comes
    assert health(cluster) == {"NOT_SERVING"} and sent.is_alive()
    cluster.restart("w0", deadline_s=None)
    wait_for(lambda: health(cluster) == {"SERVING"}, "SERVING", timeout_s=120)
    now = client.complete("right-away", messages=messages, max_tokens=4)  # at once
    sent.join(timeout=180)
    expected = reference(model, messages, max_tokens=4)[1]
    assert now.token_ids == expected and now.completion.worker_id == "w0"
    assert [w.token_ids for w in waited] == [expected]
    cluster.restart("w1")
