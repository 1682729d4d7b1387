"""Reasoning on every face against the whole system (real Redis, the real model, the
official clients; `--reasoning-parser think`): after three example turns that thought
between think tags, the default model writes a think span of its own; each HTTP face
returns the text between the tags as its reasoning (streamed and not) and the rest as the
answer, and the gRPC face's completion marks the span in the raw text. With reasoning off,
the examples' thoughts are left out of the prompt, and no reasoning comes back."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from common.v1 import inference_pb2 as pb
from tests.cluster_helpers import one_worker
from warmfleet.client import Client
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
MODEL = "SmolLM2-135M-Instruct.Q4_1"
EXAMPLES = [
    ("What is 2 plus 3?", "2 plus 3 is 5.", "5."),
    ("What is 4 plus 4?", "4 plus 4 is 8.", "8."),
    ("What is 1 plus 6?", "1 plus 6 is 7.", "7."),
]
QUESTION = "What is 2 plus 2?"
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    args = ["--reasoning-parser", "think"]  # SmolLM2's template never mentions <think>
    with one_worker(default_model_path, tmp_path_factory.mktemp, gateway_args=args) as c:
        yield c


def raw_reply(cluster: Cluster, thoughts: bool) -> tuple[str, pb.Completion]:
    """The gRPC face's greedy reply (the text as the model wrote it) after the examples,
    their thoughts written in the content (as the gateway writes a reasoning_content back
    for a template that does not read it), or left out."""
    chat: list[dict[str, str]] = []
    for question, thought, answer in EXAMPLES:
        content = f"<think>\n{thought}\n</think>\n\n{answer}" if thoughts else answer
        chat += [{"role": "user", "content": question}, {"role": "assistant", "content": content}]
    chat.append({"role": "user", "content": QUESTION})
    with Client(cluster.target, timeout_s=120) as c:
        reply = c.complete("", messages=chat, max_tokens=MAX_TOKENS, temperature=0.0)
    return reply.text, reply.completion


@pytest.fixture(scope="module")
def raw(cluster: Cluster) -> tuple[str, str]:
    """The model's think span and its answer, as it wrote them."""
    text, completion = raw_reply(cluster, thoughts=True)
    assert text.startswith("<think>") and "</think>" in text, text
    end = text.index("</think>") + len("</think>")
    assert completion.reasoning_chars == end  # the gRPC face marks the span, tags included
    assert 0 < completion.usage.reasoning_tokens < completion.usage.completion_tokens
    thought, answer = text[len("<think>") : end - len("</think>")], text[end:]
    assert thought.strip() and answer.strip()
    return thought.strip(), answer.lstrip()


@pytest.fixture(scope="module")
def plain(cluster: Cluster) -> str:
    """The reply after the examples without their thoughts: no think span."""
    text, completion = raw_reply(cluster, thoughts=False)
    assert "<think>" not in text and completion.reasoning_chars == 0
    assert completion.usage.reasoning_tokens == 0
    return text


def oai(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.http_url}/v1", api_key="x", timeout=120, max_retries=0)


def openai_chat() -> list[dict[str, Any]]:
    chat: list[dict[str, Any]] = []
    for question, thought, answer in EXAMPLES:
        reply = {"role": "assistant", "content": answer, "reasoning_content": thought}
        chat += [{"role": "user", "content": question}, reply]
    return [*chat, {"role": "user", "content": QUESTION}]


def chat_create(cluster: Cluster, **kw: Any) -> Any:
    create: Any = oai(cluster).chat.completions.create
    return create(model=MODEL, messages=openai_chat(), max_tokens=MAX_TOKENS, temperature=0, **kw)


def test_openai_chat_returns_reasoning_content(
    cluster: Cluster, raw: tuple[str, str], plain: str
) -> None:
    reply = chat_create(cluster)
    message = reply.choices[0].message
    assert (message.model_extra or {}).get("reasoning_content") == raw[0]
    assert message.content == raw[1]
    details = reply.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < reply.usage.completion_tokens
    chunks = list(chat_create(cluster, stream=True, stream_options={"include_usage": True}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    thought = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    assert thought == raw[0] and "".join(d.content or "" for d in deltas) == raw[1]
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == details.reasoning_tokens
    for off in (
        {"reasoning_effort": "none"},
        {"extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    ):
        message = chat_create(cluster, **off).choices[0].message
        assert "reasoning_content" not in (message.model_extra or {})
        assert message.content == plain


def responses_input() -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i, (question, thought, answer) in enumerate(EXAMPLES):
        reasoning = {
            "type": "reasoning",
            "id": f"rs_{i}",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": thought}],
        }
        message = {"role": "assistant", "content": [{"type": "output_text", "text": answer}]}
        items += [{"role": "user", "content": question}, reasoning, message]
    return [*items, {"role": "user", "content": QUESTION}]


def responses_create(cluster: Cluster, **kw: Any) -> Any:
    create: Any = oai(cluster).responses.create
    return create(
        model=MODEL, input=responses_input(), max_output_tokens=MAX_TOKENS, temperature=0, **kw
    )


def test_responses_return_a_reasoning_item(
    cluster: Cluster, raw: tuple[str, str], plain: str
) -> None:
    reply = responses_create(cluster)
    assert [o.type for o in reply.output] == ["reasoning", "message"]
    assert [c.text for c in reply.output[0].content] == [raw[0]]
    assert reply.output_text == raw[1]
    assert 0 < reply.usage.output_tokens_details.reasoning_tokens < reply.usage.output_tokens
    events = list(responses_create(cluster, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert events[2].item.type == "reasoning" and events[3].part.type == "reasoning_text"
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert (
        thought
        == raw[0]
        == next(e.text for e in events if e.type == "response.reasoning_text.done")
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == raw[1]
    assert [o.type for o in events[-1].response.output] == ["reasoning", "message"]
    off = responses_create(cluster, reasoning={"effort": "none"})
    assert [o.type for o in off.output] == ["message"] and off.output_text == plain


def anthropic_chat() -> list[dict[str, Any]]:
    chat: list[dict[str, Any]] = []
    for question, thought, answer in EXAMPLES:
        blocks = [
            {"type": "thinking", "thinking": thought, "signature": ""},
            {"type": "text", "text": answer},
        ]
        chat += [{"role": "user", "content": question}, {"role": "assistant", "content": blocks}]
    return [*chat, {"role": "user", "content": QUESTION}]


def test_anthropic_returns_thinking_blocks(
    cluster: Cluster, raw: tuple[str, str], plain: str
) -> None:
    client = anthropic.Anthropic(base_url=cluster.http_url, api_key="x", timeout=120, max_retries=0)
    # this client takes no temperature argument (Anthropic's newer models fix it)
    kw: Any = {
        "model": MODEL,
        "messages": anthropic_chat(),
        "max_tokens": MAX_TOKENS,
        "extra_body": {"temperature": 0},
    }
    reply = client.messages.create(**kw)
    assert [b.type for b in reply.content] == ["thinking", "text"]
    thinking, text = reply.content
    assert thinking.type == "thinking" and text.type == "text"
    assert (thinking.thinking, thinking.signature, text.text) == (raw[0], "", raw[1])
    with client.messages.stream(**kw) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].type == "thinking" and final.content[0].thinking == raw[0]
    assert final.content[1].type == "text" and final.content[1].text == raw[1]
    assert "signature" in kinds  # the signature_delta, before the thinking block stops
    off = client.messages.create(**kw, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]
    assert off.content[0].type == "text" and off.content[0].text == plain
