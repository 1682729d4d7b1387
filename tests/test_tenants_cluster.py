"""Tenants through the whole system: API keys at the gateway, sessions in each tenant's own
namespace (real Redis, gRPC, a worker process, the real model)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc
import pytest
import redis as redis_lib

from broker import keys
from common.v1 import inference_pb2 as pb
from engine.model import Model
from gateway.auth import hash_key
from tests.cluster_helpers import NEW_TOKENS, reference, wait_for
from warmfleet.client import Client, collect
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
KEYS = {t: f"{t}-secret" for t in ("alice", "bob", "flooder", "quiet", "tiny", "single")}
SETTINGS = {
    "alice": 'max_priority = "interactive"',
    "bob": 'max_priority = "normal"',
    "flooder": 'max_queued = 64\nmax_priority = "interactive"',
    "quiet": "",
    "tiny": "max_queued = 1",
    "single": "max_concurrent = 1",
}
MESSAGES = [{"role": "user", "content": "Name a large animal."}]


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    keys = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys.write_text(
        "".join(
            f'[[keys]]\nsha256 = "{hash_key(KEYS[t])}"\ntenant = "{t}"\n{extra}\n'
            for t, extra in SETTINGS.items()
        ),
        encoding="utf-8",
    )
    with Cluster(
        ClusterConfig(
            num_workers=1,
            model=default_model_path,
            keys_file=keys,
            worker_args=["--max-running", "1"],  # one request at a time: the order shows
            log_dir=tmp_path_factory.mktemp("logs"),
        )
    ) as c:
        yield c


def client(cluster: Cluster, tenant: str | None) -> Client:
    return Client(cluster.target, timeout_s=120, api_key=KEYS.get(tenant or ""))


def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()  # type: ignore[operator]
    return err.value.code()


def test_keys_are_required_and_priorities_capped(cluster: Cluster) -> None:
    with client(cluster, None) as anonymous:
        assert code_of(lambda: anonymous.complete("s", messages=MESSAGES)) == (
            grpc.StatusCode.UNAUTHENTICATED
        )
        assert code_of(anonymous.list_sessions) == grpc.StatusCode.UNAUTHENTICATED
    with Client(cluster.target, api_key="not-a-key") as stranger:
        assert code_of(lambda: stranger.get_session("s")) == grpc.StatusCode.UNAUTHENTICATED
    with client(cluster, "bob") as bob:
        denied = code_of(
            lambda: bob.complete("s", messages=MESSAGES, max_tokens=2, priority="interactive")
        )
        assert denied == grpc.StatusCode.PERMISSION_DENIED
        reply = bob.complete("s", messages=MESSAGES, max_tokens=2, priority="batch")
        assert len(reply.token_ids) == 2


def test_one_session_id_names_two_sessions_of_two_tenants(cluster: Cluster) -> None:
    with client(cluster, "alice") as alice, client(cluster, "bob") as bob:
        # a system message of its own: no other request of either tenant starts like it
        unique = [{"role": "system", "content": "Two tenants, one session id."}, *MESSAGES]
        first = alice.complete("shared-id", messages=unique, max_tokens=NEW_TOKENS)
        assert first.completion.kv_source == pb.KV_SOURCE_COLD
        # bob's request with alice's session id gets bob's own, empty session
        theirs = bob.complete("shared-id", messages=unique, max_tokens=NEW_TOKENS)
        assert theirs.completion.kv_source == pb.KV_SOURCE_COLD
        assert theirs.completion.usage.cached_tokens == 0
        assert theirs.token_ids == first.token_ids  # same prompt, same tokens: none of alice's KV
        again = alice.complete("shared-id", messages=unique, max_tokens=NEW_TOKENS)
        assert again.completion.kv_source == pb.KV_SOURCE_WARM  # alice's KV was untouched
        # bob sees only his own sessions, and cannot reach alice's
        alice.complete("alice-only", messages=MESSAGES, max_tokens=2)
        assert "alice-only" not in {s.session_id for s in bob.list_sessions()}
        assert "alice-only" in {s.session_id for s in alice.list_sessions()}
        assert code_of(lambda: bob.get_session("alice-only")) == grpc.StatusCode.NOT_FOUND
        fork = code_of(lambda: bob.fork_session("alice-only", "stolen"))
        assert fork == grpc.StatusCode.NOT_FOUND
        assert bob.delete_session("alice-only") is False
        assert alice.get_session("alice-only").num_tokens > 0


@dataclass
class Timed:
    tenant: str
    sent: float
    first_token: float = 0.0
    tokens: int = 0


def run_timed(
    cluster: Cluster, tenant: str, i: int, out: list[Timed], started: list[str] | None = None
) -> None:
    """One request; its times land in `out`, its tenant in `started` at its first token."""
    with client(cluster, tenant) as c:
        c.connect()  # the clock starts as the request leaves, not while a channel opens
        timed = Timed(tenant, time.monotonic())
        call = c.stream("", prompt=f"Request {i}: count to five.", max_tokens=6)
        for response in call:
            if response.HasField("chunk") and not timed.first_token:
                timed.first_token = time.monotonic()
                if started is not None:
                    started.append(tenant)
            if response.HasField("chunk"):
                timed.tokens += len(response.chunk.token_ids)
    out.append(timed)


def flood_at(started: list[str], n: int) -> bool:
    """Whether `n` of the flooder's requests have started."""
    return started.count("flooder") >= n


def test_a_flooding_tenant_does_not_starve_a_quiet_one(cluster: Cluster) -> None:
    done: list[Timed] = []
    started: list[str] = []  # tenants, in the order their requests got a first token
    flood = [
        threading.Thread(target=run_timed, args=(cluster, "flooder", i, done, started))
        for i in range(40)
    ]
    for t in flood:
        t.start()
    quiet = []
    for i in range(5):  # spread over the flood, by its progress (not the clock: machines differ)
        wait_for(partial(flood_at, started, 4 + 5 * i), "the flood to go on", timeout_s=120)
        t = threading.Thread(target=run_timed, args=(cluster, "quiet", i, done, started))
        t.start()
        quiet.append(t)
    for t in flood + quiet:
        t.join(timeout=300)
    assert len(done) == 45 and all(d.tokens > 0 for d in done)  # every request completed
    flooded = [d for d in done if d.tenant == "flooder"]
    quiet_done = [d for d in done if d.tenant == "quiet"]
    for q in quiet_done:
        ahead = [f for f in flooded if q.sent < f.first_token < q.first_token]
        # equal weights alternate: one flood request running, one dispatched as q arrived,
        # and one per quiet request still waiting ahead of q (on a slow machine they pile up)
        before = [o for o in quiet_done if o.sent < q.sent < o.first_token]
        assert len(ahead) <= 2 + len(before), f"{len(ahead)} of the flooder's requests first"
    assert max(f.first_token for f in flooded) > max(
        q.first_token for q in done if q.tenant == "quiet"
    )  # the quiet tenant finished while the flooder still had work


def queue_drains(r: redis_lib.Redis) -> None:
    """Tenant tiny's queue is empty within a few seconds."""
    deadline = time.monotonic() + 5
    while r.llen(keys.fair_queue("normal", "tiny")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert r.llen(keys.fair_queue("normal", "tiny")) == 0


def test_queue_full_deadline_and_cancel_while_queued(cluster: Cluster) -> None:
    r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
    with client(cluster, "flooder") as busy, client(cluster, "tiny") as tiny:
        # interactive requests go first (strict classes): tiny's normal ones wait
        count = [{"role": "user", "content": "Count from 1 to 100, one number per line."}]
        blockers = [
            busy.stream("", messages=count, max_tokens=60, priority="interactive")
            for _ in range(30)
        ]
        time.sleep(0.5)
        waiting = tiny.stream("", prompt="First.", max_tokens=2, timeout_s=1.5)
        time.sleep(0.3)
        with pytest.raises(grpc.RpcError) as err:
            tiny.complete("", prompt="Second.", max_tokens=2)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        trailing = dict(err.value.trailing_metadata() or ())
        assert int(trailing["retry-after-ms"]) >= 1000
        assert "this tenant's queue is full" in (err.value.details() or "")
        # the first one's deadline passes while it waits: it leaves the queue
        with pytest.raises(grpc.RpcError) as err:
            list(waiting)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        queue_drains(r)  # the gateway takes it out (its own deadline, or the call's end)
        assert int(r.get(keys.tenant_queued("tiny")) or 0) == 0
        # a queued request the client cancels leaves the queue too
        cancelled = tiny.stream("", prompt="Third.", max_tokens=2)
        time.sleep(0.3)
        assert r.llen(keys.fair_queue("normal", "tiny")) == 1
        cancelled.cancel()
        queue_drains(r)
        for b in blockers:
            b.cancel()
    r.close()


def test_an_interactive_request_preempts_a_batch_one_which_loses_nothing(
    cluster: Cluster, model: Model
) -> None:
    count = [{"role": "user", "content": "Count from 1 to 100, one number per line."}]
    question = [{"role": "user", "content": "What is the capital of France?"}]
    with client(cluster, "alice") as alice:
        batch = alice.stream("", messages=count, max_tokens=48, priority="batch")
        first = next(iter(batch))  # the batch request runs: the worker (1 slot) is full
        assert first.HasField("chunk")
        reply = alice.complete("", messages=question, max_tokens=8, priority="interactive")
        rest = list(batch)
    done = rest[-1].completion
    tokens = list(first.chunk.token_ids) + [t for r in rest[:-1] for t in r.chunk.token_ids]
    # it did not wait for the batch: the batch request was paused for it, then resumed
    log = cluster.log_path("w0").read_text()
    batch_id, question_id = done.request_id, reply.completion.request_id
    assert f"pausing {batch_id} (batch) for {question_id} (interactive)" in log
    assert f"resuming {batch_id}" in log.split(f"pausing {batch_id}")[1]
    assert tokens == reference(model, count, 48)[1]  # no token lost or repeated


def test_two_flooding_tenants_of_equal_weight_share_tokens_evenly(cluster: Cluster) -> None:
    done: list[Timed] = []
    threads = [
        threading.Thread(target=run_timed, args=(cluster, tenant, i, done))
        for i in range(20)
        for tenant in ("flooder", "quiet")
    ]
    count = [{"role": "user", "content": "Count from 1 to 100, one number per line."}]
    with client(cluster, "alice") as alice:  # holds the worker while both floods queue up
        blocker = alice.stream("", messages=count, max_tokens=40, priority="interactive")
        next(iter(blocker))
        for t in threads:
            t.start()
        list(blocker)
    for t in threads:
        t.join(timeout=300)
    assert len(done) == 40
    # while both still had work: the first 30 requests to start (each tenant sent 20)
    window = sorted(done, key=lambda d: d.first_token)[:30]
    tokens = {t: sum(d.tokens for d in window if d.tenant == t) for t in ("flooder", "quiet")}
    assert abs(tokens["flooder"] - tokens["quiet"]) <= 0.2 * max(tokens.values()), tokens


def test_a_tenants_bound_holds_for_its_warm_sessions_which_stay_warm(cluster: Cluster) -> None:
    """max_concurrent 1: with one of its sessions generating, the next turn of another warm
    session waits in the tenant's queue (not on the worker's stream), marked with the worker
    holding it, and then resumes there, its KV reused."""
    r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
    count = [{"role": "user", "content": "Count from 1 to 100, one number per line."}]
    with client(cluster, "single") as single:
        first = {sid: single.complete(sid, messages=MESSAGES, max_tokens=4) for sid in ("s1", "s2")}
        long_turn = single.stream("s1", messages=count, max_tokens=60)
        next(iter(long_turn))  # s1 runs: the tenant's one request
        turn = [*MESSAGES, {"role": "assistant", "content": first["s2"].text}, *MESSAGES]
        waiting = single.stream("s2", messages=turn, max_tokens=4)
        queue = keys.fair_queue("normal", "single")
        wait_for(lambda: r.llen(queue) == 1, "s2's turn to wait in its tenant's queue", 30)
        (rid,) = r.lrange(queue, 0, -1)
        assert r.hget(keys.queued_request(rid), "h") == first["s2"].completion.worker_id
        for _ in long_turn:
            pass
        reply = collect(waiting)
    assert reply.completion.worker_id == first["s2"].completion.worker_id
    held = first["s2"].completion.usage.prompt_tokens + len(first["s2"].token_ids)
    assert reply.completion.usage.cached_tokens >= held - 4  # warm: only the new turn computed
    assert r.hget(keys.RUNNING, "single") == "0"
    r.close()
