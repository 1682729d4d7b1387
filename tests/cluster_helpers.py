"""Helpers of the tests that run the whole system: the in-process reference the cluster's
replies must equal, conversations that resend their whole history each turn, and waits on
structural facts (the index, the kvstore's backlog) rather than on the clock."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis as redis_lib

from broker import keys
from broker.worker_broker import WorkerBroker
from common.sampling import SamplingParams
from common.v1 import inference_pb2 as pb
from common.v1 import kvstore_pb2 as kvpb
from engine.model import Model
from engine.sequence import Request
from engine.text.chat import render_chat
from gateway.auth import hash_key
from tests.cold_runs import cold_ids, cold_outputs
from warmfleet.client import Client, KVStoreClient, Reply
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

NEW_TOKENS = 10  # what a Conversation's turns generate
TENANT = keys.DEFAULT_TENANT
TOKEN_BYTES = 30 * 2 * 3 * 64 * 2  # KV of one position of the default model in float16: 22.5 KiB


@contextmanager
def one_worker(model: Path, folders: Callable[[str], Path], **options: Any) -> Iterator[Cluster]:
    """A cluster of one worker serving `model` (`options`: more ClusterConfig fields), its
    logs and spill files in folders made by `folders` (tmp_path_factory.mktemp)."""
    config = ClusterConfig(num_workers=1, model=model, log_dir=folders("logs"),
                           spill_dir=folders("spill"), **options)  # fmt: skip
    with Cluster(config) as c:
        yield c


def registered_worker(
    r: redis_lib.Redis, worker_id: str, lease_s: float = 5.0, **status: int
) -> WorkerBroker:
    """A worker's side of the broker on `r`, registered (its heartbeat `status` for a
    minute), as a worker process registers when it starts."""
    broker = WorkerBroker(r, worker_id, lease_s=lease_s)
    broker.register({"warm_budget": 0, **status}, ttl_s=60)
    return broker


def prompt_ids(model: Model, messages: list[dict[str, str]]) -> list[int]:
    assert model.tokenizer.chat_template is not None
    return model.tokenizer.encode(render_chat(model.tokenizer.chat_template, messages))


def reference(
    model: Model, messages: list[dict[str, str]], max_tokens: int
) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy completion ids) from the in-process engine."""
    ids = prompt_ids(model, messages)
    return ids, cold_ids(model, Request("ref", ids, SamplingParams(max_tokens=max_tokens)))


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


BLOCK_TOKENS = 16  # positions per KV block: what a prompt can share with another


def recomputed(c: pb.Completion) -> bool:
    """The session's own KV was not used: nothing was cached, or only whole blocks that
    other sessions of its tenant computed (a prompt prefix they share, such as the chat
    template's default system message)."""
    cached = c.usage.cached_tokens
    if c.kv_source == pb.KV_SOURCE_COLD:
        return cached == 0
    return (
        c.kv_source == pb.KV_SOURCE_PREFIX
        and 0 < cached < c.usage.prompt_tokens
        and cached % BLOCK_TOKENS == 0
    )


def worker_status(r: redis_lib.Redis, worker_id: str) -> dict[str, Any]:
    raw = r.get(keys.heartbeat_key(worker_id))
    assert raw is not None, f"{worker_id} has no heartbeat"
    return dict(json.loads(raw))


@dataclass
class Conversation:
    """One agent's chat; every turn resends the whole conversation."""

    session_id: str
    messages: list[dict[str, str]] = field(default_factory=list)
    turns: list[tuple[list[dict[str, str]], Reply]] = field(default_factory=list)

    def turn(self, client: Client, text: str) -> Reply:
        self.messages.append({"role": "user", "content": text})
        prompt = list(self.messages)
        reply = client.complete(self.session_id, messages=prompt, max_tokens=NEW_TOKENS)
        self.messages.append({"role": "assistant", "content": reply.text})
        self.turns.append((prompt, reply))
        return reply


def assert_exact(model: Model, turns: list[tuple[list[dict[str, str]], Reply]]) -> None:
    """Every reply has the tokens of a cold run of its prompt (one batch, in process)."""
    template = model.tokenizer.chat_template
    assert template is not None
    requests = [
        Request(f"ref-{i}", model.tokenizer.encode(render_chat(template, m)), SamplingParams(
            max_tokens=NEW_TOKENS
        ))
        for i, (m, _) in enumerate(turns)
    ]  # fmt: skip
    out = cold_outputs(model, requests)
    for i, (_, reply) in enumerate(turns):
        expected = [t for o in out[f"ref-{i}"] for t in o.token_ids]
        assert reply.token_ids == expected, f"turn {i}: {reply.text!r}"


def wait_for(
    predicate: Callable[[], Any], what: str | Callable[[], str], timeout_s: float = 30.0
) -> Any:
    """The predicate's first true result; `what` (or what it returns, asked only on a
    timeout: the state worth seeing then) names it in the failure."""
    deadline = time.monotonic() + timeout_s
    while not (result := predicate()):
        if time.monotonic() >= deadline:
            named = what if isinstance(what, str) else what()
            raise AssertionError(f"timed out waiting for {named}")
        time.sleep(0.05)
    return result


def fleet_state(r: redis_lib.Redis) -> str:
    """What Redis holds of the queues and the workers, for a failure's message."""
    workers = {
        w: (r.xlen(keys.pinned_stream(w)), r.get(keys.heartbeat_key(w)),
            r.xlen(keys.worker_wake(w)))
        for w in sorted(r.smembers(keys.WORKERS))
    }  # fmt: skip
    return (f"running {r.hgetall(keys.RUNNING)}, queued {r.get(keys.QUEUED)}, "
            f"workers (pinned entries, heartbeat, wake entries) {workers}")  # fmt: skip


def records(r: redis_lib.Redis) -> dict[str, dict[str, str]]:
    """The index as Redis holds it: session id -> record."""
    ids = r.zrange(keys.session_index(TENANT), 0, -1)
    return {sid: r.hgetall(keys.session_key(TENANT, sid)) for sid in ids}


def settle(r: redis_lib.Redis, kv: KVStoreClient) -> kvpb.KVUsage:
    """Wait until the kvstore has applied every event and no spill is in flight."""

    def settled() -> kvpb.KVUsage | None:
        usage = kv.usage()
        busy = usage.events_behind or usage.tiers.spilling or usage.tiers.hot
        return None if busy else usage

    return wait_for(settled, "the kvstore to settle")


Turns = list[tuple[list[dict[str, str]], Reply]]  # (the messages sent, the reply), per turn


def talk_in_parallel(
    client: Client, scripts: dict[str, list[str]], max_tokens: int
) -> dict[str, Turns]:
    """Each session sends its user turns one after another, resending the whole
    conversation, the next one the moment the previous completion arrives; all sessions at
    once. Their turns, in order."""
    done: dict[str, Turns] = {sid: [] for sid in scripts}
    errors: list[BaseException] = []

    def talk(sid: str) -> None:
        messages: list[dict[str, str]] = []
        try:
            for text in scripts[sid]:
                messages.append({"role": "user", "content": text})
                reply = client.complete(sid, messages=messages, max_tokens=max_tokens)
                done[sid].append((list(messages), reply))
                messages.append({"role": "assistant", "content": reply.text})
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=talk, args=(sid,)) for sid in scripts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors, errors
    return done


def assert_turns_exact_and_warm(model: Model, sid: str, turns: Turns, max_tokens: int) -> int:
    """Every turn has the reference's tokens; every follow-up reused exactly what the
    session held (its last prompt and every reply token but the last), warm, on the worker
    of the turn before. The tokens the session holds at the end."""
    previous: list[int] = []
    for turn, (messages, reply) in enumerate(turns):
        prompt, expected = reference(model, messages, max_tokens)
        assert reply.token_ids == expected, (sid, turn)
        c = reply.completion
        assert c.usage.prompt_tokens == len(prompt)
        assert c.usage.completion_tokens == len(expected)
        assert [ch.index for ch in reply.chunks if ch.token_ids] == list(range(len(expected)))
        if turn == 0:
            assert recomputed(c), sid
        else:
            assert c.usage.cached_tokens == common_prefix(previous[:-1], prompt), (sid, turn)
            assert c.kv_source == pb.KV_SOURCE_WARM, (sid, turn)
            assert c.worker_id == turns[turn - 1][1].completion.worker_id, (sid, turn)
        previous = prompt + reply.token_ids
    return len(previous) - 1


def write_keys(path: Path, settings: dict[str, str]) -> dict[str, str]:
    """A key file with one key per tenant (and its extra TOML lines); the keys by tenant."""
    keys = {t: f"{t}-secret" for t in settings}
    path.write_text(
        "".join(
            f'[[keys]]\nsha256 = "{hash_key(keys[t])}"\ntenant = "{t}"\n{extra}\n'
            for t, extra in settings.items()
        ),
        encoding="utf-8",
    )
    return keys
