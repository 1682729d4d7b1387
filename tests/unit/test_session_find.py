"""The session a request naming none continues, found by its prompt's head, and the session
holding its prefix, found by the marks the kvstore indexes from workers' events
(gateway/session_find.py, broker/prompt_heads.py, kvstore/writer.py), against a real Redis."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis as redis_lib

from broker import keys
from broker.messages import EventKind, Job, SessionEvent
from broker.prompt_heads import MARK_TTL_S, MAX_MARKS, mark_blocks
from common.block_hash import chain_hash, prefix_hashes, scope_hash
from common.enums import Priority
from common.sampling import SamplingParams
from gateway.session_find import (
    BLOCK_TOKENS,
    MARGIN_TOKENS,
    ROOT,
    Found,
    head_length,
    prompt_hashes,
)
from gateway.session_find import session_for as find_async
from kvstore.disk_sweep import DiskSweep
from kvstore.index import ResidencyIndex
from kvstore.writer import IndexWriter
from tests.cluster_fixtures import decoded_client, redis_client, redis_server, sync_gateway  # noqa: F401

SYSTEM = tuple(range(1000, 1100))  # 100 tokens: six whole blocks and 4 more


def found(gateway: Any, tenant: str, named: str, ids: tuple[int, ...]) -> Found:
    return gateway.loop.run_until_complete(find_async(gateway.broker, tenant, named, ids))


def session_for(gateway: Any, tenant: str, named: str, ids: tuple[int, ...]) -> str:
    return found(gateway, tenant, named, ids).session_id


def test_prefix_marks_are_dense_at_a_prompts_start_and_sparse_later() -> None:
    assert mark_blocks(3) == [] and mark_blocks(9) == [4, 8]
    assert mark_blocks(200) == [*range(4, 65, 4), 96, 128, 160, 192]
    assert len(mark_blocks(10**6)) == MAX_MARKS


def test_a_prompt_s_hashes_chain_its_whole_blocks_rooted_in_the_tenant() -> None:
    ids = tuple(range(50))
    hashes = prompt_hashes("acme", ids)
    assert len(hashes) == 50 // BLOCK_TOKENS == 3
    first = chain_hash(scope_hash(ROOT, "acme"), ids[:16])
    assert hashes[0] == first and hashes[1] == chain_hash(first, ids[16:32])
    assert prompt_hashes("other", ids)[0] != first  # tenants never share a chain
    assert prefix_hashes(b"r", ids[:15], 16) == []
    assert head_length(50) == 50 - MARGIN_TOKENS and head_length(3) == 0


def test_a_turn_continues_the_session_whose_prompt_it_extends(
    gateway: Any, decoded: redis_lib.Redis
) -> None:
    turn1 = (*SYSTEM, 1, 2, 3, 4, 5)
    first = session_for(gateway, "acme", "", turn1)
    assert first.startswith("s-") and len(first) == 34
    turn2 = (*turn1, 6, 7, 8, *range(20, 60))  # the reply and a new question after it
    assert session_for(gateway, "acme", "", turn2) == first
    # the head moved to turn 2's prompt: one key a session, the old head gone
    heads = sorted(decoded.scan_iter("wf:head:acme:*"))
    assert len(heads) == 1 and list(decoded.hgetall(heads[0])) == [first]
    assert decoded.get(f"wf:headof:acme:{first}") == heads[0].rsplit(":", 1)[1]
    assert 0 < decoded.ttl(heads[0]) <= 24 * 3600
    # another conversation with the same system prompt, and another tenant's same prompt
    other = session_for(gateway, "acme", "", (*SYSTEM, 9, 9, 9, 9, 9))
    elsewhere = session_for(gateway, "globex", "", turn2)
    assert len({first, other, elsewhere}) == 3
    # a turn of the first conversation after the other began still finds its own
    turn3 = (*turn2, *range(60, 90))
    assert session_for(gateway, "acme", "", turn3) == first


def test_a_named_session_is_found_by_its_prompt_and_forgotten_on_delete(
    gateway: Any, decoded: redis_lib.Redis
) -> None:
    prompt = (*SYSTEM, 7, 7, 7, 7)
    assert session_for(gateway, "acme", "agent-1", prompt) == "agent-1"
    assert session_for(gateway, "acme", "", (*prompt, 8, 8)) == "agent-1"
    gateway.loop.run_until_complete(gateway.broker.forget_head("acme", "agent-1"))
    assert not list(decoded.scan_iter("wf:head*"))
    again = session_for(gateway, "acme", "", (*prompt, 8, 8))
    assert again.startswith("s-")


def test_a_short_prompt_has_no_head_and_gets_a_session_each_time(
    gateway: Any, decoded: redis_lib.Redis
) -> None:
    short = tuple(range(BLOCK_TOKENS + MARGIN_TOKENS - 1))
    a, b = (session_for(gateway, "acme", "", short) for _ in range(2))
    assert a != b and not list(decoded.scan_iter("wf:head*"))


def started(r: redis_lib.Redis, tmp_path: Path, found: Found, worker: str) -> None:
    """What the kvstore does with the HOT event of a worker that starts the session's job:
    the record names the worker, and the prompt's marks name the session."""
    index = ResidencyIndex(None, lambda key: None)
    index.set_workers({worker: 10**9})
    job = found.placed(Job("r", "acme", "", SYSTEM, SamplingParams(), Priority.INTERACTIVE, 0, 0))
    key = keys.cache_key("acme", job.session_id)
    event = SessionEvent(EventKind.HOT, worker, key, 100, 1, time.time(), marks=job.prefix_marks)
    fx = index.apply(event)
    assert fx.marks == {key: found.marks}
    writer = IndexWriter(r, DiskSweep(tmp_path), lambda: worker)
    writer.load_marker()
    writer.commit(fx, [])


def test_a_new_conversation_is_pointed_at_the_session_a_worker_started_on_its_prefix(
    gateway: Any, decoded: redis_lib.Redis, tmp_path: Path
) -> None:
    a = found(gateway, "acme", "", (*SYSTEM, 1, 2, 3, 4, 5))
    # 105 tokens: a head of 6 whole blocks, marked after the 4th; the job carries the mark,
    # the gateway writes none: no worker has started the session yet
    assert a.holder == "" and a.marks == (prompt_hashes("acme", SYSTEM)[3].hex(),)
    assert not list(decoded.scan_iter("wf:prefix:*"))
    started(decoded, tmp_path, a, "w0")
    [mark] = decoded.scan_iter("wf:prefix:acme:*")
    assert decoded.get(mark) == a.session_id and mark.endswith(a.marks[0])
    assert 0 < decoded.ttl(mark) <= MARK_TTL_S
    b = found(gateway, "acme", "", (*SYSTEM, 9, 9, 9, 9, 9))
    assert b.session_id != a.session_id and b.holder == a.session_id
    assert (b.holder_worker, b.holder_tokens) == ("w0", 4 * BLOCK_TOKENS)  # in the job
    # both heads end past the same whole blocks (inside the system prompt): one hash holds
    # both, told apart by their last tokens
    [head] = decoded.scan_iter("wf:head:acme:*")
    assert set(decoded.hgetall(head)) == {a.session_id, b.session_id}
    # b, not started yet, leaves the mark to a; started on w1, it takes it
    assert found(gateway, "acme", "", (*SYSTEM, 8, 8, 8, 8, 8)).holder == a.session_id
    started(decoded, tmp_path, b, "w1")
    c = found(gateway, "acme", "", (*SYSTEM, 6, 6, 6, 6, 6))
    assert (c.holder, c.holder_worker) == (b.session_id, "w1")
    # b leaves memory: a mark places a request only while its session is held...
    decoded.hdel(keys.session_key("acme", b.session_id), "worker")
    assert found(gateway, "acme", "", (*SYSTEM, 7, 7, 7, 7, 7)).holder == ""
    # ... or, on disk, names no worker: whichever worker the request lands on reads its
    # blocks where its host's spill directory has them
    decoded.hset(keys.session_key("acme", b.session_id), "tier", "disk")
    d = found(gateway, "acme", "", (*SYSTEM, 5, 5, 5, 5, 5))
    assert (d.holder, d.holder_worker, d.holder_tokens) == (b.session_id, "", 4 * BLOCK_TOKENS)
    assert found(gateway, "globex", "", (*SYSTEM, 9, 9, 9, 9, 9)).holder == ""
    assert found(gateway, "acme", "", tuple(range(5000, 5100))).holder == ""
