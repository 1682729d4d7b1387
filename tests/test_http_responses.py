"""The OpenAI Responses face (Codex CLI's API) against the whole system (real Redis, the real
model, the official client): the gRPC path's tokens, streamed as numbered response.* events;
a tool call as a function_call item, its result as a function_call_output item in the next
request, which reuses the session named by prompt_cache_key."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import KeyedCluster
from tests.test_http_tools import CITIES, DESCRIPTION, MODEL, QUESTION, SCHEMA
from warmfleet.client import Client

pytestmark = pytest.mark.slow
TOOLS = [{"type": "function", "name": "get_weather", "description": DESCRIPTION,
          "parameters": SCHEMA}]  # fmt: skip
ASK = "Count from 1 to 50, one number per line."  # longer than 12 tokens


def oai(kc: KeyedCluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{kc.cluster.http_url}/v1", api_key=kc.keys["alice"],
                         timeout=120, max_retries=0)  # fmt: skip


def create(client: openai.OpenAI, **kw: Any) -> Any:
    """responses.create typed Any (the client's parameter types are unions)."""
    call: Any = client.responses.create
    return call(model=MODEL, temperature=0, **kw)


def items() -> list[dict[str, Any]]:
    """Three turns that called get_weather, as Responses items, then a fourth question."""
    out: list[dict[str, Any]] = []
    for i, city in enumerate(CITIES):
        out += [{"role": "user", "content": f"What is the weather in {city}?"},
                {"type": "function_call", "call_id": f"call_{i}", "name": "get_weather",
                 "arguments": json.dumps({"city": city})},
                {"type": "function_call_output", "call_id": f"call_{i}", "output": "sunny"},
                {"role": "assistant", "content": [{"type": "output_text",
                                                   "text": f"Sunny in {city}."}]}]  # fmt: skip
    return [*out, {"role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]


def test_text_is_the_grpc_paths_and_streams_as_numbered_events(keyed_cluster: KeyedCluster) -> None:
    kc = keyed_cluster
    client = oai(kc)
    with Client(kc.cluster.target, api_key=kc.keys["alice"], timeout_s=120) as c:
        expected = c.complete("", messages=[{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": ASK}],
                              max_tokens=12, temperature=0.0).text  # fmt: skip
    whole = create(client, instructions="Be brief.", input=ASK, max_output_tokens=12)
    assert whole.output_text == expected and whole.id.startswith("resp_")
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 12 and whole.usage.input_tokens > 0
    assert whole.tool_choice == "auto"  # as asked: tools offered, or none
    off = create(client, input=ASK, max_output_tokens=1, tools=TOOLS, tool_choice="none")
    assert off.tool_choice == "none" and [o.type for o in off.output] == ["message"]
    events = list(create(client, instructions="Be brief.", input=ASK, max_output_tokens=12,
                         stream=True))  # fmt: skip
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]  # fmt: skip
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.incomplete"]  # fmt: skip
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == expected == events[-4].text
    assert events[-1].response.output[0].content[0].text == expected


def test_a_function_call_round_trip_keeps_the_session(keyed_cluster: KeyedCluster) -> None:
    client = oai(keyed_cluster)
    conversation = items()
    key = {"prompt_cache_key": "codex-conversation-1"}  # no X-Session-Id: Codex's own id
    first = create(client, input=conversation, tools=TOOLS, max_output_tokens=40, **key)
    assert first.status == "completed"
    assert [o.type for o in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "London"}
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    events = list(create(client, input=conversation, tools=TOOLS, max_output_tokens=40,
                         stream=True))  # fmt: skip
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == {"city": "London"}
    assert events[-1].type == "response.completed"
    assert [o.type for o in events[-1].response.output] == ["function_call"]
    conversation += [{"type": "function_call", "call_id": call.call_id, "name": call.name,
                      "arguments": call.arguments},
                     {"type": "function_call_output", "call_id": call.call_id,
                      "output": "cloudy"}]  # fmt: skip
    second = create(client, input=conversation, tools=TOOLS, max_output_tokens=12, **key)
    assert second.status in ("completed", "incomplete")
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_what_it_cannot_honour_is_refused(keyed_cluster: KeyedCluster) -> None:
    kc = keyed_cluster
    bad: list[tuple[dict[str, Any], str]] = [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {}}}}, "text.format"),
        ({"input": [{"type": "image_generation_call", "id": "x"}]}, "input"),
        ({"input": [{"role": "wizard", "content": "hi"}]}, "input"),
        ({"input": [{"type": "function_call", "call_id": "c", "name": "f",
                     "arguments": "{oops"}]}, "input"),
        ({"tool_choice": "required", "tools": TOOLS}, "tool_choice"),
        ({"input": ""}, "input"),
    ]  # fmt: skip
    headers = {"Authorization": f"Bearer {kc.keys['alice']}"}
    with httpx.Client(base_url=kc.cluster.http_url, headers=headers, timeout=60) as c:
        for extra, param in bad:
            r = c.post("/v1/responses", json={"input": ASK, **extra})
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (extra, r.text)
        # a prompt_cache_key no header can echo names no session: the request gets its own
        r = c.post("/v1/responses", json={"input": ASK, "max_output_tokens": 1,
                                          "prompt_cache_key": "clé\n"})  # fmt: skip
        assert r.status_code == 200 and r.headers["x-session-id"].startswith("s-")
