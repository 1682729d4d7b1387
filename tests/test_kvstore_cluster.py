"""The kvstore through the whole system: real Redis, gRPC, two worker processes, the real
model. The kvstore owns the residency index and the eviction decisions; these tests check
the index against the workers' own reports and the files on disk."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis as redis_lib

from broker import keys
from common.v1 import inference_pb2 as pb
from engine.kv_files.spill_file import read_summary
from engine.model import Model
from tests.cluster_fixtures import cluster_client, cluster_redis  # noqa: F401
from tests.cluster_helpers import (
    TENANT,
    TOKEN_BYTES,
    Conversation,
    assert_exact,
    recomputed,
    records,
    settle,
    wait_for,
    worker_status,
)
from tests.kv_checks import (
    assert_index_matches_workers_and_disk,
    assert_within_budget,
    evict,
    files_by_session,
    rewrite_with_fingerprint,
    spill_file,
)
from warmfleet.client import Client, KVStoreClient
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
SESSION_BYTES = 100 * TOKEN_BYTES  # an idle session of 100 tokens holds exactly this
WARM_BUDGET = 3 * SESSION_BYTES + SESSION_BYTES // 2  # three such sessions fit, four do not


@pytest.fixture(scope="module")
def spill_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("spill")


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, spill_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    with Cluster(
        ClusterConfig(
            num_workers=2,
            model=default_model_path,
            spill_dir=spill_dir,
            warm_budget=WARM_BUDGET,
            log_dir=tmp_path_factory.mktemp("logs"),
        )
    ) as c:
        yield c


@pytest.fixture(scope="module")
def kv(cluster: Cluster) -> Iterator[KVStoreClient]:
    with KVStoreClient(cluster.kvstore_target) as c:
        yield c


# ---- helpers -------------------------------------------------------------------------


# ---- tests ---------------------------------------------------------------------------


def test_ten_sessions_take_turns_within_the_warm_budget(
    cluster: Cluster, client: Client, kv: KVStoreClient, r: redis_lib.Redis, model: Model,
    spill_dir: Path,
) -> None:  # fmt: skip
    agents = [Conversation(f"agent-{i}") for i in range(10)]
    sources: list[tuple[str, int]] = []  # (tier before the turn, kv source), later rounds
    for round_ in range(3):
        for i, agent in enumerate(agents):
            before = records(r).get(agent.session_id, {}).get("tier")
            reply = agent.turn(client, f"Round {round_}: name a fruit and a colour, agent {i}.")
            usage = settle(r, kv)
            assert_within_budget(r, usage, WARM_BUDGET)
            if round_ == 0:
                assert recomputed(reply.completion)
                continue
            assert before in ("warm", "disk")
            assert reply.completion.usage.cached_tokens > 20
            sources.append((before, reply.completion.kv_source))
    expected = {"warm": pb.KV_SOURCE_WARM, "disk": pb.KV_SOURCE_DISK}
    assert all(source == expected[before] for before, source in sources), sources
    from_disk = sum(before == "disk" for before, _ in sources)
    assert from_disk >= 10, f"only {from_disk} of 20 resumed turns came from disk"
    # idle sessions went to disk: at most 3 per worker stay warm
    tiers = [rec["tier"] for sid, rec in records(r).items() if sid.startswith("agent-")]
    assert tiers.count("disk") >= 4 and tiers.count("warm") <= 6
    assert_index_matches_workers_and_disk(r, cluster, spill_dir)
    assert kv.usage().counters.restores >= from_disk
    assert_exact(model, [t for a in agents for t in a.turns])


def test_rejected_spill_files_are_deleted_counted_and_recomputed(
    client: Client, kv: KVStoreClient, r: redis_lib.Redis, model: Model, spill_dir: Path
) -> None:
    agents = [Conversation(f"damaged-{i}") for i in range(3)]
    for agent in agents:
        agent.turn(client, f"Say hello to {agent.session_id}.")
    settle(r, kv)
    for agent in agents:
        evict(kv, r, agent.session_id)
    rejected = kv.usage().counters.rejected_files
    corrupted, truncated, foreign = (spill_file(spill_dir, a.session_id) for a in agents)
    data = bytearray(corrupted.read_bytes())
    data[-100] ^= 0x01  # one flipped bit in the payload
    corrupted.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:-1000])
    rewrite_with_fingerprint(foreign, model, "another-model")
    for agent in agents:
        reply = agent.turn(client, "And goodbye.")
        assert recomputed(reply.completion)
    assert not any(p.exists() for p in (corrupted, truncated, foreign))
    settle(r, kv)
    assert kv.usage().counters.rejected_files == rejected + 3
    assert_exact(model, [t for a in agents for t in a.turns])


def test_fork_then_both_continue_and_delete_leaves_nothing(
    cluster: Cluster, client: Client, kv: KVStoreClient, r: redis_lib.Redis, model: Model,
    spill_dir: Path,
) -> None:  # fmt: skip
    source = Conversation("fork-source")
    source.turn(client, "Name three rivers.")
    settle(r, kv)
    forked = client.fork_session("fork-source", "fork-branch")
    assert forked.session_id == "fork-branch" and forked.num_tokens > 0
    branch = Conversation("fork-branch", list(source.messages))
    a = source.turn(client, "Which is the longest?")
    b = branch.turn(client, "Which is the shortest?")
    for reply in (a, b):
        assert reply.completion.kv_source == pb.KV_SOURCE_WARM
        assert reply.completion.usage.cached_tokens > 20
    with pytest.raises(grpc.RpcError) as err:
        client.fork_session("fork-source", "fork-branch")
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert_exact(model, source.turns + branch.turns)

    # delete a warm session: its record, its index entry and its KV in the worker go
    settle(r, kv)
    holder = records(r)["fork-source"]["worker"]
    held_before = worker_status(r, holder)["num_sessions"]
    assert client.delete_session("fork-source") is True
    wait_for(lambda: worker_status(r, holder)["num_sessions"] == held_before - 1, "the KV to go")
    # delete a session on disk: its file goes before the call returns
    evict(kv, r, "fork-branch")
    path = spill_file(spill_dir, "fork-branch")
    assert client.delete_session("fork-branch") is True
    assert not path.exists()
    settle(r, kv)
    for sid in ("fork-source", "fork-branch"):
        assert list(r.scan_iter(match=f"*{sid}*")) == []
        assert r.zscore(keys.session_index(TENANT), sid) is None
        assert sid not in files_by_session(spill_dir)
        with pytest.raises(grpc.RpcError) as err:
            client.get_session(sid)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
    assert client.delete_session("fork-source") is False
    assert_index_matches_workers_and_disk(r, cluster, spill_dir)


def test_fork_of_a_session_on_disk(
    client: Client, kv: KVStoreClient, r: redis_lib.Redis, model: Model
) -> None:
    source = Conversation("disk-source")
    source.turn(client, "Name two planets.")
    settle(r, kv)
    evict(kv, r, "disk-source")
    restores = kv.usage().counters.restores
    forked = client.fork_session("disk-source", "disk-branch")
    assert forked.tier == pb.TIER_WARM and forked.num_tokens > 0  # copied before the answer
    branch = Conversation("disk-branch", list(source.messages))
    reply = branch.turn(client, "Which one is bigger?")
    # a worker brought the source back from its file and copied it under the new id
    assert reply.completion.kv_source == pb.KV_SOURCE_WARM
    assert reply.completion.usage.cached_tokens > 20
    again = source.turn(client, "Which one is closer to the sun?")
    assert again.completion.kv_source == pb.KV_SOURCE_WARM  # the source stayed in memory
    assert kv.usage().counters.restores == restores  # a copy is not a resume
    assert_exact(model, source.turns + branch.turns)


def test_killing_and_restarting_the_kvstore_loses_no_session(
    cluster: Cluster, client: Client, kv: KVStoreClient, r: redis_lib.Redis, model: Model,
    spill_dir: Path,
) -> None:  # fmt: skip
    settle(r, kv)
    assert cluster.kill("kvstore") == -9
    try:
        # while it is down: turns go on (their events wait in the stream)...
        agents = [Conversation(f"while-down-{i}") for i in range(5)]
        for agent in agents:
            agent.turn(client, f"Count to three, {agent.session_id}.")
        agents[0].turn(client, "Again, please.")
        # ...and what needs the kvstore fails at once with a clear error
        with pytest.raises(grpc.RpcError) as err:
            client.delete_session("while-down-1")
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE  # its bounded wait ended it
        assert "kvstore did not answer" in (err.value.details() or "")
        assert r.xlen(keys.KV_EVENTS) > 0
    finally:
        cluster.restart("kvstore")
    usage = settle(r, kv)
    assert_within_budget(r, usage, WARM_BUDGET)
    index = records(r)
    for agent in agents:
        assert index[agent.session_id]["tier"] in ("warm", "disk")
    assert int(index["while-down-0"]["num_tokens"]) > int(index["while-down-1"]["num_tokens"])
    assert_index_matches_workers_and_disk(r, cluster, spill_dir)
    assert_exact(model, [t for a in agents for t in a.turns])


def test_over_the_disk_budget_the_least_recently_used_files_go(
    cluster: Cluster, client: Client, kv: KVStoreClient, r: redis_lib.Redis, model: Model,
    spill_dir: Path,
) -> None:  # fmt: skip
    agents = [Conversation(f"disk-{i}") for i in range(4)]
    for agent in agents:
        agent.turn(client, f"Tell me about the number {agent.session_id[-1]}.")
        settle(r, kv)
        evict(kv, r, agent.session_id)
    on_disk = sorted(
        (float(rec["last_used"]), sid) for sid, rec in records(r).items() if rec["tier"] == "disk"
    )
    keep = [sid for _, sid in on_disk[-2:]]  # the two most recently used
    budget = unique_bytes(spill_dir, keep)  # their files and their blocks, each once
    deleted_before = kv.usage().counters.budget_deletions
    cluster.kill("kvstore")
    cluster.restart("kvstore", extra_args=["--disk-budget", str(budget)])
    try:
        usage = settle(r, kv)
        assert usage.disk.budget_bytes == budget and usage.disk.used_bytes <= budget
        assert set(files_by_session(spill_dir)) == set(keep)
        assert usage.counters.budget_deletions == deleted_before + len(on_disk) - 2
        index = records(r)
        gone = [sid for _, sid in on_disk[:-2]]
        assert all(index[sid]["tier"] == "gone" for sid in gone)
        assert_index_matches_workers_and_disk(r, cluster, spill_dir)
        # a session whose file went is recomputed, with the right tokens
        agent = next(a for a in agents if a.session_id in gone)
        reply = agent.turn(client, "And its square?")
        assert recomputed(reply.completion)
        assert_exact(model, agent.turns)
    finally:
        cluster.kill("kvstore")
        cluster.restart("kvstore")


def unique_bytes(spill_dir: Path, session_ids: list[str]) -> int:
    """The bytes of these sessions' spill files and of the blocks they list, each once."""
    files = [files_by_session(spill_dir)[sid] for sid in session_ids]
    blocks: set[str] = set()
    for path in files:
        summary = read_summary(path)
        assert summary is not None
        blocks.update(summary.blocks)
    block_files = [spill_dir / "blocks" / f"{h}.wfkb" for h in blocks]
    return sum(p.stat().st_size for p in [*files, *block_files])
