"""Shared system prompts through the whole system (real Redis, gRPC, one worker process,
the real model): eight agents of one tenant with one 600-token system prompt compute it
once; another tenant with the same prompt shares nothing."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import redis as redis_lib

from broker import keys
from common.sampling import SamplingParams
from common.v1 import inference_pb2 as pb
from engine.kv_files.spill_file import read_summary, spill_path
from engine.model import Model
from engine.sequence import Request
from tests.cluster_helpers import prompt_ids, settle, write_keys
from tests.cold_runs import cold_ids
from warmfleet.client import Client, KVStoreClient, Reply
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
BLOCK = 16
NEW_TOKENS = 6


def system_prompt(model: Model, opening: str, target: int = 600) -> str:
    """Instructions of about `target` tokens (rendered in the chat template)."""
    rules = [opening]
    while len(prompt_ids(model, [{"role": "system", "content": "\n".join(rules)}])) < target:
        n = len(rules)
        rules.append(f"Rule {n}: keep function f{n * 13 % 97} short and log event e{n * 31}.")
    return "\n".join(rules)


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cluster, dict[str, str]]]:
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    api_keys = write_keys(path, {"acme": "", "other": ""})
    config = ClusterConfig(
        num_workers=1,  # one pool: every session of the test shares it
        model=default_model_path,
        keys_file=path,
        spill_dir=tmp_path_factory.mktemp("spill"),
        log_dir=tmp_path_factory.mktemp("logs"),
    )
    with Cluster(config) as c:
        yield c, api_keys


def messages(system: str, agent: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Agent {agent}: fix the failing test number {agent * 7}."},
    ]


def ask(c: Cluster, api_key: str, session: str, msgs: list[dict[str, str]]) -> Reply:
    with Client(c.target, timeout_s=120, api_key=api_key) as client:
        return client.complete(session, messages=msgs, max_tokens=NEW_TOKENS, ignore_eos=True)


def expected_ids(model: Model, msgs: list[dict[str, str]]) -> list[int]:
    params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
    return cold_ids(model, Request("ref", prompt_ids(model, msgs), params))


def pool_bytes(c: Cluster) -> int:
    """The idle sessions' bytes the worker reported last (blocks held, each once)."""
    r = redis_lib.Redis.from_url(c.redis_url)
    return int(json.loads(r.get(keys.heartbeat_key("w0")) or "{}")["pool_bytes"])


def reported(c: Cluster, expected: int, within_s: float = 10.0) -> int:
    """pool_bytes once the heartbeat shows `expected` (or after `within_s`)."""
    deadline = time.monotonic() + within_s
    while (got := pool_bytes(c)) != expected and time.monotonic() < deadline:
        time.sleep(0.1)
    return got


def test_eight_agents_compute_one_system_prompt_once(
    cluster: tuple[Cluster, dict[str, str]], model: Model
) -> None:
    c, api_keys = cluster
    system = system_prompt(model, "You are a coding agent of the Acme team. Follow these rules.")
    assert len(prompt_ids(model, messages(system, 1)[:1])) >= 600  # the system turn alone
    before = pool_bytes(c)
    key = api_keys["acme"]
    first = ask(c, key, "agent-1", messages(system, 1))
    assert first.completion.kv_source == pb.KV_SOURCE_COLD
    with ThreadPoolExecutor(7) as pool:
        agents = range(2, 9)
        others = list(pool.map(lambda i: ask(c, key, f"agent-{i}", messages(system, i)), agents))
    for i, reply in enumerate([first, *others], start=1):
        assert reply.token_ids == expected_ids(model, messages(system, i)), f"agent {i}"
        if i > 1:
            assert reply.completion.kv_source == pb.KV_SOURCE_PREFIX, f"agent {i}"
            cached = reply.completion.usage.cached_tokens
            assert cached >= 592 and cached == common_len(model, system, i) // BLOCK * BLOCK

    # the worker's idle sessions hold the shared blocks once: agent 1's blocks, and each
    # other agent's blocks past the ones it shares
    held = [
        -(-(len(prompt_ids(model, messages(system, i))) + NEW_TOKENS - 1) // BLOCK)
        for i in range(1, 9)
    ]
    shared = [common_len(model, system, i) // BLOCK for i in range(2, 9)]
    unique = held[0] + sum(n - s for n, s in zip(held[1:], shared, strict=True))
    block_bytes = BLOCK * model.bytes_per_token
    assert reported(c, before + unique * block_bytes) == before + unique * block_bytes
    assert unique < sum(held) / 4


def common_len(model: Model, system: str, agent: int, other: int = 1) -> int:
    """Tokens agent `agent`'s prompt has in common with agent `other`'s."""
    a, b = prompt_ids(model, messages(system, other)), prompt_ids(model, messages(system, agent))
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_another_tenant_with_the_same_prompt_gets_nothing_cached(
    cluster: tuple[Cluster, dict[str, str]], model: Model
) -> None:
    c, api_keys = cluster
    system = system_prompt(model, "Review each pull request of the Acme team by these rules.")
    ask(c, api_keys["acme"], "warm", messages(system, 20))  # in the pool for acme
    again = ask(c, api_keys["acme"], "again", messages(system, 20))
    assert again.completion.kv_source == pb.KV_SOURCE_PREFIX
    stranger = ask(c, api_keys["other"], "warm", messages(system, 20))
    assert stranger.completion.kv_source == pb.KV_SOURCE_COLD
    assert stranger.completion.usage.cached_tokens == 0
    assert stranger.token_ids == again.token_ids


def test_sessions_sharing_a_prompt_spill_its_blocks_once(
    cluster: tuple[Cluster, dict[str, str]], model: Model
) -> None:
    """Three sessions with one system prompt, ordered to disk: the spill directory holds
    the prompt's blocks once, the kvstore counts the bytes on disk, and each session comes
    back from disk whole."""
    c, api_keys = cluster
    system = system_prompt(model, "Triage the Acme team's bug reports by these rules.")
    sessions = {f"spill-{i}": messages(system, 40 + i) for i in range(3)}
    for sid, msgs in sessions.items():
        ask(c, api_keys["acme"], sid, msgs)
    r = redis_lib.Redis.from_url(c.redis_url, decode_responses=True)
    assert c.config.spill_dir is not None
    spill = Path(c.config.spill_dir)
    with KVStoreClient(c.kvstore_target) as kv:
        for sid in sessions:
            assert kv.evict(sid, tenant="acme") == pb.TIER_SPILLING
        usage = settle(r, kv)
        files = {sid: read_summary(spill_path(spill, f"acme/{sid}")) for sid in sessions}
        lists = [f.blocks for f in files.values() if f is not None]
        assert len(lists) == 3
        shared = min(common_len(model, system, 40, o) for o in (41, 42)) // BLOCK
        assert shared >= 37 and lists[0][:shared] == lists[1][:shared] == lists[2][:shared]
        listed: set[str] = set().union(*lists)
        assert listed <= {p.stem for p in (spill / "blocks").glob("*.wfkb")}
        assert common_len(model, system, 41, 42) // BLOCK == shared
        assert len(listed) == sum(len(b) for b in lists) - 2 * shared  # the prompt's once
        on_disk = sum(p.stat().st_size for p in spill.rglob("*.wfk?"))  # files and blocks
        assert usage.disk.used_bytes == on_disk
        # the pool still knows the prompt's blocks (cached, unheld), and a restore takes
        # those instead of reading them: a fourth session of the prompt deleted makes it
        # forget them, so that the first resume reads them from disk
        ask(c, api_keys["acme"], "spill-gone", messages(system, 50))
        with Client(c.target, timeout_s=120, api_key=api_keys["acme"]) as client:
            client.delete_session("spill-gone")
        # the second block, which all three list, is damaged on disk
        bad = spill / "blocks" / f"{lists[0][1]}.wfkb"
        data = bytearray(bad.read_bytes())
        data[-9] ^= 0x10
        bad.write_bytes(bytes(data))
    rejected = json.loads(r.get(keys.heartbeat_key("w0")) or "{}")["spill"]["num_rejected"]
    for i, (sid, msgs) in enumerate(sessions.items()):
        again = [*msgs, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
        reply = ask(c, api_keys["acme"], sid, again)
        assert reply.completion.kv_source == pb.KV_SOURCE_DISK
        assert reply.token_ids == expected_ids(model, again)
        if i == 0:  # refused: the first block came back from disk, the rest was recomputed
            assert not bad.exists()
    status = json.loads(r.get(keys.heartbeat_key("w0")) or "{}")
    assert status["spill"]["num_rejected"] >= rejected + 1
