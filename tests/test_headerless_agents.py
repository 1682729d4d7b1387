"""Agents that name no session (no X-Session-Id, nothing in the body) against the whole
system (real Redis, two workers, the real model): each agent's later turns continue its
session, found by the prompt, and reuse its KV as much as agents that send the header."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest

from bench.agent_prompts import system_prompts, user_turn
from tests.metrics_scrape import scrape, total
from warmfleet.client import Client
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
AGENTS, TURNS, SYSTEM_TOKENS = 8, 4, 600
MIN_CACHED = 0.9  # of the previous turn's prompt, on every later turn


@dataclass(frozen=True)
class Turn:
    session_id: str
    prompt_tokens: int
    cached_tokens: int


@pytest.fixture(scope="module")
def cluster(default_cluster: Cluster) -> Cluster:
    return default_cluster


def run_agent(url: str, system: str, agent: int, header: str) -> list[Turn]:
    """The agent's turns, each resending the whole conversation (the header, if any, is its
    X-Session-Id)."""
    messages = [{"role": "system", "content": system}]
    headers = {"X-Session-Id": header} if header else {}
    turns = []
    with httpx.Client(base_url=url, timeout=300) as http:
        for t in range(TURNS):
            messages.append({"role": "user", "content": user_turn(agent, t)})
            body = {"messages": messages, "max_tokens": 12, "temperature": 0}
            r = http.post("/v1/chat/completions", headers=headers, json=body)
            assert r.status_code == 200, r.text
            body = r.json()
            usage = body["usage"]
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
            turns.append(Turn(r.headers["x-session-id"], usage["prompt_tokens"], cached))
            messages.append(
                {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
            )
    return turns


def run_all(url: str, named: bool, salt: str) -> list[list[Turn]]:
    """Every agent at once; `salt` keeps each run's system prompts its own."""
    systems = [f"[{salt}]\n{s}" for s in system_prompts(AGENTS, SYSTEM_TOKENS)]
    with ThreadPoolExecutor(AGENTS) as pool:
        runs = [
            pool.submit(run_agent, url, systems[i], i, f"{salt}-{i}" if named else "")
            for i in range(AGENTS)
        ]
        return [r.result() for r in runs]


def assert_warm_later_turns(runs: list[list[Turn]]) -> None:
    for agent, turns in enumerate(runs):
        for before, after in itertools.pairwise(turns):
            assert after.cached_tokens >= MIN_CACHED * before.prompt_tokens, (agent, turns)


def found(cluster: Cluster, how: str) -> float:
    """The gateway's count of HTTP requests whose session was found `how`."""
    samples = scrape(cluster, "gateway")
    return total(samples, "warmfleet_request_sessions_total", api="http", found=how)


def test_agents_without_a_session_header_reuse_their_kv_as_those_with_one(
    cluster: Cluster,
) -> None:
    before = {how: found(cluster, how) for how in ("named", "prompt", "new")}
    named = run_all(cluster.http_url, named=True, salt="named")
    assert_warm_later_turns(named)
    bare = run_all(cluster.http_url, named=False, salt="bare")
    assert_warm_later_turns(bare)
    moved = {how: found(cluster, how) - n for how, n in before.items()}
    assert moved == {"named": AGENTS * TURNS, "prompt": AGENTS * (TURNS - 1), "new": AGENTS}
    # one session an agent, all its turns in it, none shared between agents
    ids = [{t.session_id for t in turns} for turns in bare]
    assert all(len(s) == 1 for s in ids) and len(set.union(*ids)) == AGENTS
    with Client(cluster.target, timeout_s=60) as client:
        listed = {s.session_id for s in client.list_sessions()}
    assert set.union(*ids) <= listed
    assert all(sid.startswith("s-") for s in ids for sid in s)
