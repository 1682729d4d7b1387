"""The HTTP face against the whole system (real Redis, two workers, the real model), driven
by the official `openai` and `anthropic` clients and by raw HTTP: the same tokens as gRPC,
sessions by X-Session-Id, tenants by key, errors in each API's shape."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from common.v1 import inference_pb2 as pb
from tests.conftest import KeyedCluster
from warmfleet.client import Client
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "Name a large animal."}]


@pytest.fixture(scope="module")
def cluster(keyed_cluster: KeyedCluster) -> Cluster:
    return keyed_cluster.cluster


@pytest.fixture(scope="module")
def keys(keyed_cluster: KeyedCluster) -> tuple[Path, dict[str, str]]:
    return keyed_cluster.path, keyed_cluster.keys


@pytest.fixture(scope="module")
def model_id(cluster: Cluster) -> str:
    return "SmolLM2-135M-Instruct.Q4_1"


def any_(messages: list[dict[str, str]]) -> Any:
    """Chat messages as the clients' typed parameters (plain dicts are what they send)."""
    return messages


def oai(cluster: Cluster, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.http_url}/v1", api_key=key, timeout=120)


def grpc_text(cluster: Cluster, key: str, messages: list[dict[str, str]], n: int) -> str:
    """The gRPC path's greedy reply to the same conversation, in a session of its own."""
    with Client(cluster.target, api_key=key, timeout_s=120) as c:
        reply = c.complete("", messages=messages, max_tokens=n, temperature=0.0)
    return reply.text


def test_openai_client_gets_the_grpc_tokens_and_reuses_its_session(
    cluster: Cluster, keys: tuple[Path, dict[str, str]], model_id: str
) -> None:
    key = keys[1]["alice"]
    client = oai(cluster, key)
    sid = {"X-Session-Id": "oai-1"}
    first = client.chat.completions.create(model=model_id, messages=any_(CHAT), max_tokens=16,
                                           temperature=0, extra_headers=sid)  # fmt: skip
    text = first.choices[0].message.content
    assert text == grpc_text(cluster, key, CHAT, 16)
    assert first.usage is not None and first.usage.prompt_tokens > 0
    chat2 = [*CHAT, {"role": "assistant", "content": text or ""},
             {"role": "user", "content": "Where does it live?"}]  # fmt: skip
    stream = client.chat.completions.create(
        model=model_id, messages=any_(chat2), max_tokens=16, temperature=0, extra_headers=sid,
        stream=True, stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == grpc_text(cluster, key, chat2, 16)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert (usage.prompt_tokens_details.cached_tokens or 0) >= first.usage.prompt_tokens


def test_anthropic_client_gets_the_grpc_tokens_and_reuses_its_session(
    cluster: Cluster, keys: tuple[Path, dict[str, str]], model_id: str
) -> None:
    key = keys[1]["alice"]
    client = anthropic.Anthropic(base_url=cluster.http_url, api_key=key, timeout=120)
    sid = {"X-Session-Id": "ant-1"}
    system = "You are brief."
    # greedy, to compare with gRPC: the face's default follows Anthropic's (temperature 1)
    greedy: Any = {"temperature": 0}
    first = client.messages.create(
        model=model_id,
        max_tokens=16,
        system=system,
        messages=any_(CHAT),
        extra_headers=sid,
        extra_body=greedy,
    )
    text = "".join(b.text for b in first.content if b.type == "text")
    with_system = [{"role": "system", "content": system}, *CHAT]
    assert text == grpc_text(cluster, key, with_system, 16)
    assert first.stop_reason in ("end_turn", "max_tokens")
    chat2 = [*CHAT, {"role": "assistant", "content": text},
             {"role": "user", "content": "Where does it live?"}]  # fmt: skip
    with client.messages.stream(
        model=model_id,
        max_tokens=16,
        system=system,
        messages=any_(chat2),
        extra_headers=sid,
        extra_body=greedy,
    ) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == grpc_text(cluster, key, [with_system[0], *chat2], 16)
    assert (final.usage.cache_read_input_tokens or 0) >= first.usage.input_tokens


def test_sessions_share_prompt_blocks_within_a_tenant_only(
    cluster: Cluster, keys: tuple[Path, dict[str, str]], model_id: str
) -> None:
    alice, bob = oai(cluster, keys[1]["alice"]), oai(cluster, keys[1]["bob"])
    # a system message of its own: no other request of either tenant starts like it
    chat = [{"role": "system", "content": "A check of what sessions share."}, *CHAT]
    cached = []
    for sid in ("own-1", "own-2"):  # one conversation in two sessions of one tenant
        reply = alice.chat.completions.create(model=model_id, messages=any_(chat), max_tokens=4,
                                              extra_headers={"X-Session-Id": sid})  # fmt: skip
        assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
        cached.append(reply.usage.prompt_tokens_details.cached_tokens or 0)
        blocks = (reply.usage.prompt_tokens - 1) // 16 * 16
    # the second takes the first one's whole blocks of the prompt (16 tokens each) when
    # it runs on the same worker (two workers here): never the first one's own reply
    assert cached[0] == 0 and cached[1] in (0, blocks)
    again = bob.chat.completions.create(model=model_id, messages=any_(chat), max_tokens=4,
                                        extra_headers={"X-Session-Id": "own-1"})  # fmt: skip
    assert again.usage is not None and again.usage.prompt_tokens_details is not None
    assert again.usage.prompt_tokens_details.cached_tokens == 0  # bob's own "own-1"
    with pytest.raises(openai.NotFoundError):
        bob.with_options(max_retries=0).get("/sessions/own-2", cast_to=dict)  # alice's only
    listed = alice.get("/sessions", cast_to=dict)
    assert {"own-1", "own-2"} <= {s["id"] for s in listed["data"]}


def test_ignore_eos_and_min_tokens_fix_the_length_on_both_faces(
    cluster: Cluster, keys: tuple[Path, dict[str, str]], model_id: str
) -> None:
    key = keys[1]["alice"]
    short = [{"role": "user", "content": "What is the capital of France?"}]  # 8 tokens
    with Client(cluster.target, api_key=key, timeout_s=120) as c:
        natural = c.complete("", messages=any_(short), max_tokens=40)
        assert natural.completion.finish_reason == pb.FINISH_REASON_STOP  # it stops early
        fixed = c.complete("", messages=any_(short), max_tokens=40, ignore_eos=True)
        assert (
            len(fixed.token_ids) == 40 and fixed.completion.finish_reason == pb.FINISH_REASON_LENGTH
        )
        floor = c.complete(
            "", messages=any_(short), max_tokens=40, min_tokens=len(natural.token_ids) + 5
        )
        assert len(floor.token_ids) >= len(natural.token_ids) + 5
    reply = oai(cluster, key).chat.completions.create(
        model=model_id, messages=any_(short), max_tokens=30, extra_body={"ignore_eos": True}
    )
    assert reply.usage is not None and reply.usage.completion_tokens == 30
    assert reply.choices[0].finish_reason == "length"


CLAUDE_CODE_USER_ID = (  # its shape: user, account and session; ~160 characters
    f"user_{'5e' * 32}_account_0c1d2e3f-4a5b-4c6d-8e9f-a0b1c2d3e4f5"
    "_session_7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c0d"
)


def test_claude_codes_user_id_continues_one_session_without_a_header(
    cluster: Cluster, keys: tuple[Path, dict[str, str]], model_id: str
) -> None:
    """Claude Code sends no X-Session-Id but one metadata.user_id per conversation: each
    names one session (longer ones than a session id by their digest), warm on turn 2."""
    key = keys[1]["bob"]
    client = anthropic.Anthropic(base_url=cluster.http_url, api_key=key, timeout=120)
    with Client(cluster.target, api_key=key, timeout_s=120) as grpc:
        before = {s.session_id for s in grpc.list_sessions()}
        named = {}
        for user_id in (CLAUDE_CODE_USER_ID, "plain-user-7"):
            metadata: Any = {"user_id": user_id}
            first = client.messages.with_raw_response.create(
                model=model_id, max_tokens=8, messages=any_(CHAT), metadata=metadata
            )
            reply = first.parse()
            text = "".join(b.text for b in reply.content if b.type == "text")
            chat2 = [
                *CHAT,
                {"role": "assistant", "content": text},
                {"role": "user", "content": "Where does it live?"},
            ]
            second = client.messages.with_raw_response.create(
                model=model_id, max_tokens=8, messages=any_(chat2), metadata=metadata
            )
            sid = first.headers["x-session-id"]
            assert second.headers["x-session-id"] == sid
            cached = second.parse().usage.cache_read_input_tokens or 0
            assert cached >= reply.usage.input_tokens  # turn 1's prompt, warm
            named[user_id] = sid
        digest = hashlib.sha256(CLAUDE_CODE_USER_ID.encode()).hexdigest()[:40]
        assert named == {CLAUDE_CODE_USER_ID: f"n-{digest}", "plain-user-7": "plain-user-7"}
        added = {s.session_id for s in grpc.list_sessions()} - before
        assert added == set(named.values())  # one session a conversation, not one a turn
        # a user id no header could echo names none: a session of its own each time
        odd: Any = {"user_id": "usér\n"}
        got = client.messages.with_raw_response.create(
            model=model_id, max_tokens=1, messages=any_(CHAT), metadata=odd
        )
        assert got.headers["x-session-id"].startswith("s-")
