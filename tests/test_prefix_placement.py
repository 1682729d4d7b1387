"""A new session goes to the worker that holds its prompt's leading blocks (real Redis, two
workers, the real model, the HTTP face): a new agent whose system prompt another agent's
session holds warm gets those blocks from that session's worker, not by recompute; another
tenant's identical prompt gets nothing."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import redis

from bench.agent_prompts import system_prompts
from bench.shared_prefix import worker_of as session_worker
from engine.model import Model
from engine.text.chat import render_chat
from tests.conftest import KeyedCluster
from warmfleet.client import Client

pytestmark = pytest.mark.slow
BLOCK = 16


def ask(kc: KeyedCluster, tenant: str, messages: list[dict[str, str]], sid: str = "") -> Any:
    headers = {"Authorization": f"Bearer {kc.keys[tenant]}"}
    if sid:
        headers["X-Session-Id"] = sid
    with httpx.Client(base_url=kc.cluster.http_url, headers=headers, timeout=300) as http:
        r = http.post(
            "/v1/chat/completions", json={"messages": messages, "max_tokens": 4, "temperature": 0}
        )
    assert r.status_code == 200, r.text
    details = r.json()["usage"].get("prompt_tokens_details") or {}
    return r.headers["x-session-id"], details.get("cached_tokens") or 0


def worker_of(kc: KeyedCluster, tenant: str, session_id: str) -> str:
    """The worker holding the session, once the kvstore has its worker's event (10 s)."""
    with Client(kc.cluster.target, api_key=kc.keys[tenant], timeout_s=60) as client:
        try:
            return session_worker(client, session_id)
        except TimeoutError:
            return ""


def shared_tokens(model: Model, a: list[dict[str, str]], b: list[dict[str, str]]) -> int:
    """How many leading tokens the two conversations' prompts share."""
    template = model.tokenizer.chat_template
    assert template is not None
    x, y = (model.tokenizer.encode(render_chat(template, m)) for m in (a, b))
    return next((i for i, (s, t) in enumerate(zip(x, y, strict=False)) if s != t), len(x))


def test_a_new_agent_gets_its_system_prompt_from_the_worker_that_holds_it(
    keyed_cluster: KeyedCluster, model: Model
) -> None:
    system = "[placement]\n" + system_prompts(1, 600)[0]
    first = [{"role": "system", "content": system}, {"role": "user", "content": "Begin."}]
    holder, _ = ask(keyed_cluster, "alice", first, sid="placement-holder")
    where = worker_of(keyed_cluster, "alice", holder)
    # the kvstore wrote the fleet's prefix index from the worker's event, with the record
    with redis.Redis.from_url(keyed_cluster.cluster.redis_url, decode_responses=True) as r:
        index = {key: r.get(key) for key in r.scan_iter("wf:prefix:alice:*")}
    assert holder in index.values()
    second = [first[0], {"role": "user", "content": "Start with the tests, please."}]
    shared = shared_tokens(model, first, second)
    assert shared > 500
    newcomer, cached = ask(keyed_cluster, "alice", second)  # no header: a new session
    assert newcomer != holder
    assert worker_of(keyed_cluster, "alice", newcomer) == where
    assert cached >= BLOCK * (shared // BLOCK) - BLOCK  # the system prompt's blocks, shared
    # the same prompt under another tenant: none of alice's blocks
    _, elsewhere = ask(keyed_cluster, "bob", second)
    assert elsewhere == 0


def test_a_deleted_sessions_history_is_recomputed_but_for_blocks_others_hold(
    keyed_cluster: KeyedCluster, model: Model
) -> None:
    """DeleteSession forgets the session's blocks on its worker except those another live
    session holds: the same history again reuses only the shared system prompt."""
    kc, system = keyed_cluster, "[deletion]\n" + system_prompts(2, 600)[1]
    holder = [{"role": "system", "content": system}, {"role": "user", "content": "Begin."}]
    ask(kc, "alice", holder, sid="deletion-holder")
    where = worker_of(kc, "alice", "deletion-holder")
    task = " ".join(f"Step {i}: read file {i} and list what it exports." for i in range(12))
    deleted = [holder[0], {"role": "user", "content": task}]
    shared = shared_tokens(model, holder, deleted)
    low, high = BLOCK * (shared // BLOCK) - BLOCK, BLOCK * (shared // BLOCK) + BLOCK
    _, first = ask(kc, "alice", deleted, sid="deletion-x")  # placed by the holder's prefix
    assert worker_of(kc, "alice", "deletion-x") == where and low <= first < high
    again_holder = [
        *holder,
        {"role": "assistant", "content": "OK."},
        {"role": "user", "content": "Go on."},
    ]
    ask(kc, "alice", again_holder, sid="deletion-holder")  # its prefix marks are its own again
    with Client(kc.cluster.target, api_key=kc.keys["alice"], timeout_s=60) as client:
        client.delete_session("deletion-x")
    _, cached = ask(kc, "alice", deleted, sid="deletion-y")
    assert worker_of(kc, "alice", "deletion-y") == where
    assert low <= cached < high  # not the deleted session's own blocks
    assert len(model.tokenizer.encode(task)) > 100  # which were many
