"""gpt-oss's harmony through the whole system (real Redis, a worker, the official clients):
a hand-built gpt-oss model (tests/harmony_model.py) writes its reasoning then a final
answer, or, offered a tool, its reasoning then a call; each HTTP face (OpenAI chat,
Responses, Anthropic) returns the analysis channel as its reasoning, the final channel as
the answer and the call as its structured tool call, streamed and not; the next turn, with
the call and its result in the history, renders through gpt-oss's template and is served."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.cluster_helpers import one_worker
from tests.harmony_model import ANSWER, ARGUMENTS, THOUGHT, write_harmony_model
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
MODEL = "harmony-gpt-oss"  # the file's name
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
OPENAI_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": SCHEMA,
        },
    }
]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "The weather", "input_schema": SCHEMA}]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY = {"temperature": 0}  # (anthropic 2.17's create takes no temperature argument)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    model = write_harmony_model(tmp_path_factory.mktemp("model") / "harmony-gpt-oss.gguf")
    with one_worker(model, tmp_path_factory.mktemp) as c:
        yield c


def oai(c: Cluster) -> Any:
    return openai.OpenAI(base_url=f"{c.http_url}/v1", api_key="x", timeout=120, max_retries=0)


def claude(c: Cluster) -> Any:
    return anthropic.Anthropic(base_url=c.http_url, api_key="x", timeout=120, max_retries=0)


def chat(c: Cluster, **kw: Any) -> Any:
    """chat.completions.create, greedy, on the question unless `messages` says otherwise."""
    kw = {"messages": QUESTION, **kw}
    return oai(c).chat.completions.create(model=MODEL, max_tokens=100, temperature=0, **kw)


def test_openai_reasoning_and_answer(cluster: Cluster) -> None:
    reply = chat(cluster)
    message = reply.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == THOUGHT
    assert message.content == ANSWER and not message.tool_calls
    assert reply.choices[0].finish_reason == "stop"
    deltas = [chunk.choices[0].delta for chunk in chat(cluster, stream=True) if chunk.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas) == THOUGHT
    assert "".join(d.content or "" for d in deltas) == ANSWER


def test_openai_tool_call(cluster: Cluster) -> None:
    reply = chat(cluster, tools=OPENAI_TOOLS)
    message, choice = reply.choices[0].message, reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (message.model_extra or {}).get("reasoning_content") == THOUGHT
    assert not message.content
    call = (message.tool_calls or [])[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == ARGUMENTS
    stream = chat(cluster, tools=OPENAI_TOOLS, stream=True)
    calls = [
        c for chunk in stream if chunk.choices for c in chunk.choices[0].delta.tool_calls or []
    ]
    assert [c.function.name for c in calls if c.function and c.function.name] == ["get_weather"]
    arguments = "".join(c.function.arguments or "" for c in calls if c.function)
    assert json.loads(arguments) == ARGUMENTS


def test_openai_next_turn_with_the_call_and_its_result(cluster: Cluster) -> None:
    """The call (with its reasoning) and its result in the history render through
    gpt-oss's template and are served."""
    function = {"name": "get_weather", "arguments": json.dumps(ARGUMENTS)}
    history: list[dict[str, Any]] = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": THOUGHT,
            "tool_calls": [{"id": "call_1", "type": "function", "function": function}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    again = chat(cluster, messages=history, tools=OPENAI_TOOLS)
    assert again.choices[0].finish_reason == "tool_calls"  # the model knows no other reply


def test_anthropic_thinking_text_and_tool_use(cluster: Cluster) -> None:
    client = claude(cluster)
    reply = client.messages.create(
        model=MODEL, messages=QUESTION, max_tokens=100, extra_body=GREEDY
    )
    assert [b.type for b in reply.content] == ["thinking", "text"]
    assert reply.content[0].thinking == THOUGHT
    assert reply.content[1].text == ANSWER
    assert reply.stop_reason == "end_turn"
    called = client.messages.create(
        model=MODEL,
        messages=QUESTION,
        tools=ANTHROPIC_TOOLS,
        max_tokens=100,
        extra_body=GREEDY,
    )
    assert [b.type for b in called.content] == ["thinking", "tool_use"]
    use = called.content[1]
    assert use.name == "get_weather" and use.input == ARGUMENTS
    assert called.stop_reason == "tool_use"
    with client.messages.stream(
        model=MODEL,
        messages=QUESTION,
        tools=ANTHROPIC_TOOLS,
        max_tokens=100,
        extra_body=GREEDY,
    ) as stream:
        streamed = stream.get_final_message()
    assert [b.type for b in streamed.content] == ["thinking", "tool_use"]
    assert streamed.content[0].thinking == THOUGHT
    assert streamed.content[1].input == ARGUMENTS


def test_responses_reasoning_item_answer_and_function_call(cluster: Cluster) -> None:
    """The Responses API (Codex's face): a reasoning item then the message, or then a
    function_call item; streamed, the reasoning's text and the call's arguments."""
    create = oai(cluster).responses.create
    question = "What is the weather in Paris?"
    reply = create(model=MODEL, input=question, max_output_tokens=100, temperature=0)
    assert [o.type for o in reply.output] == ["reasoning", "message"]
    assert [c.text for c in reply.output[0].content] == [THOUGHT]
    assert reply.output_text == ANSWER
    tools = [{"type": "function", "name": "get_weather", "parameters": SCHEMA}]
    called = create(model=MODEL, input=question, tools=tools, max_output_tokens=100, temperature=0)
    assert [o.type for o in called.output] == ["reasoning", "function_call"]
    call = called.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == ARGUMENTS
    streamed = {"tools": tools, "max_output_tokens": 100, "temperature": 0, "stream": True}
    events = list(create(model=MODEL, input=question, **streamed))
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == THOUGHT
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == ARGUMENTS
    assert [o.type for o in events[-1].response.output] == ["reasoning", "function_call"]
