"""Tool calling on both HTTP faces against the whole system (real Redis, the real model,
the official clients): a conversation whose earlier turns called a tool makes the default
model call it again; the call comes back as each API's structured call, streamed or not,
and the next turn, with the tool's result, reuses the session's cache."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.conftest import KeyedCluster

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct.Q4_1"
CITIES = ("Paris", "Rome", "Oslo")
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
DESCRIPTION = "Get the current weather in a city"
OPENAI_TOOLS = [{"type": "function", "function": {"name": "get_weather",
                 "description": DESCRIPTION, "parameters": SCHEMA}}]  # fmt: skip
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": DESCRIPTION, "input_schema": SCHEMA}]
QUESTION = "What is the weather in London?"


def openai_chat() -> list[dict[str, Any]]:
    """Three turns that called get_weather, then a fourth question (the 135M model calls
    tools only after examples)."""
    chat: list[dict[str, Any]] = []
    for i, city in enumerate(CITIES):
        function = {"name": "get_weather", "arguments": json.dumps({"city": city})}
        call = {"id": f"call_{i}", "type": "function", "function": function}
        chat += [{"role": "user", "content": f"What is the weather in {city}?"},
                 {"role": "assistant", "content": None, "tool_calls": [call]},
                 {"role": "tool", "tool_call_id": f"call_{i}", "content": "sunny"},
                 {"role": "assistant", "content": f"Sunny in {city}."}]  # fmt: skip
    return [*chat, {"role": "user", "content": QUESTION}]


def anthropic_chat() -> list[dict[str, Any]]:
    """The same conversation in Anthropic's blocks."""
    chat: list[dict[str, Any]] = []
    for i, city in enumerate(CITIES):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather",
               "input": {"city": city}}  # fmt: skip
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": "sunny"}
        chat += [{"role": "user", "content": f"What is the weather in {city}?"},
                 {"role": "assistant", "content": [use]},
                 {"role": "user", "content": [result]},
                 {"role": "assistant", "content": f"Sunny in {city}."}]  # fmt: skip
    return [*chat, {"role": "user", "content": QUESTION}]


def oai(kc: KeyedCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{kc.cluster.http_url}/v1", api_key=kc.keys["alice"],
                         timeout=120, max_retries=0)  # fmt: skip


def chat_call(client: openai.OpenAI, chat: list[dict[str, Any]], **kw: Any) -> Any:
    """A chat completion offering get_weather (typed Any: the client's types are unions)."""
    create: Any = client.chat.completions.create
    return create(model=MODEL, messages=chat, tools=OPENAI_TOOLS, temperature=0, **kw)


def messages_call(create: Any, chat: list[dict[str, Any]], **kw: Any) -> Any:
    """A Messages call offering get_weather, greedy (the face's default follows Anthropic's,
    temperature 1; this client takes the field only in the body)."""
    body = {"temperature": 0}
    return create(model=MODEL, messages=chat, tools=ANTHROPIC_TOOLS, extra_body=body, **kw)


def test_openai_tool_call_round_trip(keyed_cluster: KeyedCluster) -> None:
    client, sid = oai(keyed_cluster), {"X-Session-Id": "tools-oai"}
    chat = openai_chat()
    first = chat_call(client, chat, max_tokens=40, extra_headers=sid)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    calls = choice.message.tool_calls or []
    assert len(calls) == 1 and calls[0].id.startswith("call_") and calls[0].type == "function"
    assert calls[0].function.name == "get_weather"
    assert json.loads(calls[0].function.arguments) == {"city": "London"}
    # the same request streamed (another session): one tool-call delta, no text
    chunks = [c.choices[0] for c in chat_call(client, chat, max_tokens=40, stream=True)
              if c.choices]  # fmt: skip
    deltas = [d for c in chunks for d in c.delta.tool_calls or []]
    assert [(d.index, d.id[:5], d.function.name) for d in deltas] == [(0, "call_", "get_weather")]
    assert json.loads(deltas[0].function.arguments) == {"city": "London"}
    assert "".join(c.delta.content or "" for c in chunks) == ""
    assert chunks[-1].finish_reason == "tool_calls"
    # the next turn carries the call and its result; the session's cache covers the turn before
    call = calls[0].model_dump()
    chat += [{"role": "assistant", "content": None, "tool_calls": [call]},
             {"role": "tool", "tool_call_id": calls[0].id, "content": "cloudy"}]  # fmt: skip
    second = chat_call(client, chat, max_tokens=12, extra_headers=sid)
    assert second.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert first.usage and second.usage and second.usage.prompt_tokens_details
    assert (second.usage.prompt_tokens_details.cached_tokens or 0) >= first.usage.prompt_tokens


def test_anthropic_tool_use_round_trip(keyed_cluster: KeyedCluster) -> None:
    client = anthropic.Anthropic(base_url=keyed_cluster.cluster.http_url, timeout=120,
                                 api_key=keyed_cluster.keys["alice"], max_retries=0)  # fmt: skip
    sid = {"X-Session-Id": "tools-ant"}
    chat = anthropic_chat()
    first = messages_call(client.messages.create, chat, max_tokens=40, extra_headers=sid)
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["tool_use"]
    use = first.content[0]
    assert use.type == "tool_use" and use.id.startswith("toolu_")
    assert (use.name, use.input) == ("get_weather", {"city": "London"})
    counted = messages_call(client.messages.count_tokens, chat)
    assert counted.input_tokens == first.usage.input_tokens
    # streamed (another session): the client rebuilds the call from its input_json_delta
    with messages_call(client.messages.stream, chat, max_tokens=40) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use" and [b.type for b in final.content] == ["tool_use"]
    assert final.content[0].type == "tool_use" and final.content[0].input == {"city": "London"}
    result = {"type": "tool_result", "tool_use_id": use.id, "content": [{"type": "text",
              "text": "cloudy"}]}  # fmt: skip
    chat += [{"role": "assistant", "content": [use.model_dump()]},
             {"role": "user", "content": [result]}]  # fmt: skip
    second = messages_call(client.messages.create, chat, max_tokens=12, extra_headers=sid)
    assert second.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert (second.usage.cache_read_input_tokens or 0) >= first.usage.input_tokens


def test_tool_requests_the_model_cannot_honour_are_refused(keyed_cluster: KeyedCluster) -> None:
    kc = keyed_cluster
    auth = {"Authorization": f"Bearer {kc.keys['alice']}"}
    question = [{"role": "user", "content": QUESTION}]
    bad_openai: list[tuple[dict[str, Any], str]] = [
        ({"tool_choice": "required", "tools": OPENAI_TOOLS}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": ""}}]}, "tools"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
         "messages"),
    ]  # fmt: skip
    bad_anthropic: list[dict[str, Any]] = [
        {"tool_choice": {"type": "any"}, "tools": ANTHROPIC_TOOLS},
        {"tools": [{"type": "web_search_20250305", "name": "web_search"}]},
        {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
          "content": [{"type": "image", "source": {}}]}]}]},
    ]  # fmt: skip
    with httpx.Client(base_url=kc.cluster.http_url, headers=auth, timeout=60) as c:
        for extra, param in bad_openai:
            r = c.post("/v1/chat/completions", json={"messages": question, **extra})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        for extra in bad_anthropic:
            r = c.post("/v1/messages", json={"max_tokens": 4, "messages": question, **extra})
            assert r.status_code == 400, r.text
            assert r.json()["error"]["type"] == "invalid_request_error"


def test_a_claude_code_shaped_request_streams(keyed_cluster: KeyedCluster) -> None:
    """What Claude Code sends on every turn: system and content as blocks with cache_control,
    tools whose schemas carry $schema, metadata, a max_tokens past the context, stream;
    the beta query string and headers. It streams as Anthropic's does."""
    kc = keyed_cluster
    cache = {"cache_control": {"type": "ephemeral"}}
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", **SCHEMA,
              "additionalProperties": False}  # fmt: skip
    body = {
        # Claude Code sends temperature 1: greedy here, so the reply's length is fixed
        "model": MODEL, "max_tokens": 32000, "temperature": 0, "stream": True,
        "metadata": {"user_id": "user_abc_account_def_session_ghi"},
        "system": [{"type": "text", "text": "You are Claude Code.", **cache}],
        "tools": [{"name": "get_weather", "description": DESCRIPTION, "input_schema": schema}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": QUESTION, **cache}]}],
    }  # fmt: skip
    headers = {"x-api-key": kc.keys["alice"], "anthropic-version": "2023-06-01",
               "anthropic-beta": "claude-code-20250219", "X-Session-Id": "claude-code"}  # fmt: skip
    with (
        httpx.Client(base_url=kc.cluster.http_url, timeout=120) as c,
        c.stream("POST", "/v1/messages?beta=true", json=body, headers=headers) as r,
    ):
        assert r.status_code == 200, r.read()
        names = [ln[len("event: ") :] for ln in r.iter_lines() if ln.startswith("event: ")]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") >= 1
