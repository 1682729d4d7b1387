"""Reasoning in requests: each face's history thoughts (OpenAI `reasoning_content`,
Anthropic `thinking` blocks, Responses `reasoning` items) become the assistant message's
`reasoning_content`, which Qwen 3's template renders itself and another template gets
back between think tags; each face's way to turn reasoning off; the reply starting in its
reasoning when the prompt opened a think span; and the sampling defaults of each face and
family."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from common.errors import InvalidRequestError
from engine.model import Model
from engine.text.chat import render_chat
from engine.text.tokenizer import Tokenizer
from gateway import anthropic_messages, openai_messages, responses_input
from gateway.reasoning import Thought
from gateway.sampling_defaults import Defaults
from gateway.validate import GenerateInput, JobBuilder, prompt_ids, sampling_of
from gateway.work_gate import WorkGate
from tests.conftest import FIXTURES
from tests.tiny_families import family_vocab

QWEN3 = (FIXTURES / "templates" / "Qwen-Qwen3-0.6B.jinja").read_text()
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
THOUGHT, ANSWER = "Two and two.", "Four."


def test_each_face_reads_history_thoughts_as_reasoning_content() -> None:
    question = {"role": "user", "content": "2 + 2?"}
    expected = [question, {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    openai_body = {
        "messages": [
            question,
            {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT},
        ]
    }
    assert openai_messages.chat_messages(openai_body) == expected
    blocks = [
        {"type": "thinking", "thinking": THOUGHT, "signature": "x"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": ANSWER},
    ]
    anthropic_body = {"messages": [question, {"role": "assistant", "content": blocks}]}
    assert anthropic_messages.chat_of(anthropic_body) == expected
    reasoning = {
        "type": "reasoning",
        "id": "rs_1",
        "summary": [{"type": "summary_text", "text": "not what it wrote"}],
        "content": [{"type": "reasoning_text", "text": THOUGHT}],
    }
    message = {"role": "assistant", "content": [{"type": "output_text", "text": ANSWER}]}
    assert responses_input.chat_of({"input": [question, reasoning, message]}) == expected
    # before a call with no message: the call's turn; a trailing one has no turn to join
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    chat = responses_input.chat_of({"input": [question, reasoning, call, reasoning]})
    assert chat[1]["reasoning_content"] == THOUGHT and chat[1]["tool_calls"][0]["id"] == "c1"
    assert len(chat) == 2


def test_each_face_turns_reasoning_off_its_own_way() -> None:
    off = {"enable_thinking": False}
    assert openai_messages.template_kwargs_of({"reasoning_effort": "none"}) == off
    kwargs = {"chat_template_kwargs": {"enable_thinking": False, "x": 1}}
    assert openai_messages.template_kwargs_of(kwargs) == {**off, "x": 1}
    # an effort the model can take is the template's (gpt-oss's "Reasoning: high")
    high = {"reasoning_effort": "high"}
    assert openai_messages.template_kwargs_of(high) == high
    assert openai_messages.template_kwargs_of({"reasoning_effort": "minimal"}) is None
    assert anthropic_messages.template_kwargs_of({"thinking": {"type": "disabled"}}) == off
    enabled = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
    assert anthropic_messages.template_kwargs_of(enabled) is None
    assert responses_input.template_kwargs_of({"reasoning": {"effort": "none"}}) == off
    low = responses_input.template_kwargs_of({"reasoning": {"effort": "low"}})
    assert low == {"reasoning_effort": "low"}
    with pytest.raises(InvalidRequestError, match="chat_template_kwargs"):
        openai_messages.template_kwargs_of({"chat_template_kwargs": "nope"})


def tool_loop() -> list[dict[str, Any]]:
    """A question, a call after a thought, its result: Qwen 3 shows that thought."""
    call = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": {}}}
    return [
        {"role": "user", "content": "2 + 2?"},
        {"role": "assistant", "content": "", "reasoning_content": THOUGHT, "tool_calls": [call]},
        {"role": "tool", "content": "4", "tool_call_id": "c1"},
    ]


def test_thoughts_render_as_the_template_expects() -> None:
    got = render_chat(QWEN3, tool_loop())
    assert f"<|im_start|>assistant\n<think>\n{THOUGHT}\n</think>\n\n<tool_call>" in got
    chat = [tool_loop()[0], {"role": "assistant", "content": ANSWER, "reasoning_content": THOUGHT}]
    assert render_chat(CHATML, chat).endswith(
        f"<|im_start|>assistant\n<think>\n{THOUGHT}\n</think>\n\n{ANSWER}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    with pytest.raises(InvalidRequestError, match=r"\[0\].reasoning_content: only on assistant"):
        render_chat(CHATML, [{"role": "user", "content": "x", "reasoning_content": "y"}])
    with pytest.raises(InvalidRequestError, match=r"\[1\].reasoning_content: a string"):
        render_chat(CHATML, [chat[0], {**chat[1], "reasoning_content": 3}])


@pytest.fixture(scope="module")
def qwen() -> Tokenizer:
    tokenizer = Tokenizer.from_metadata(family_vocab("qwen2")["metadata"])
    tokenizer.chat_template = QWEN3
    return tokenizer


def test_thoughts_are_rendered_only_where_the_reply_may_think(qwen: Tokenizer) -> None:
    inp = GenerateInput(messages=tool_loop())
    assert THOUGHT in qwen.decode(prompt_ids(inp, qwen, thinking=True))
    assert THOUGHT not in qwen.decode(prompt_ids(inp, qwen, thinking=False))


def builder(tokenizer: Tokenizer, model: Model, thoughts: bool) -> JobBuilder:
    return JobBuilder(tokenizer, model.config, 60.0, WorkGate(), thoughts)


def test_the_reply_starts_in_its_reasoning_when_the_prompt_opened_it(
    qwen: Tokenizer, tiny_model: Model
) -> None:
    opening = copy.copy(qwen)  # as Qwen3-4B-Thinking-2507's template: the span opened for it
    opening.chat_template = QWEN3.replace(
        "{{- '<|im_start|>assistant\\n' }}\n    {%- if enable",
        "{{- '<|im_start|>assistant\\n<think>\\n' }}\n    {%- if enable",
    )
    chat = [{"role": "user", "content": "2 + 2?"}]
    reply = f"{THOUGHT}\n</think>\n\n{ANSWER}"
    for tokenizer, inp, expected in [
        (opening, GenerateInput(messages=chat), [Thought(THOUGHT), ANSWER]),
        (qwen, GenerateInput(messages=chat), [reply]),
        (qwen, GenerateInput(messages=chat, template_kwargs={"enable_thinking": False}), [reply]),
    ]:
        job: Any = SimpleNamespace(prompt_ids=tuple(prompt_ids(inp, tokenizer)))
        splitter = builder(tokenizer, tiny_model, thoughts=True).splitter(job)
        assert splitter.feed(reply) + splitter.finish() == expected
    off = builder(opening, tiny_model, thoughts=False)
    job = SimpleNamespace(prompt_ids=tuple(prompt_ids(GenerateInput(messages=chat), opening)))
    assert off.splitter(job).feed(reply) == [reply]  # --reasoning-parser none


def test_each_face_and_family_has_its_sampling_defaults(qwen: Tokenizer, tiny_model: Model) -> None:
    def sampled(arch: str, thinking: bool, **kw: Any) -> tuple[float, float, int]:
        s = sampling_of(GenerateInput(prompt="x", **kw), 100, arch, thinking)
        return s.temperature, s.top_p, s.top_k

    assert sampled("llama", True) == (0.0, 1.0, 0)  # gRPC: greedy
    assert sampled("qwen3", True) == (0.0, 1.0, 0)  # whatever the family
    assert sampled("llama", True, defaults=Defaults.API) == (1.0, 1.0, 0)
    assert sampled("qwen3", True, defaults=Defaults.API) == (0.6, 0.95, 20)
    assert sampled("qwen3", False, defaults=Defaults.API) == (0.7, 0.8, 20)
    assert sampled("qwen3moe", True, defaults=Defaults.API) == (0.6, 0.95, 20)
    assert sampled("qwen3", True, defaults=Defaults.API, temperature=0.0, top_k=0) == (0.0, 0.95, 0)
    jobs = builder(qwen, tiny_model, thoughts=True)
    assert jobs.thinking(GenerateInput(prompt="x"))
    assert not jobs.thinking(GenerateInput(prompt="x", template_kwargs={"enable_thinking": False}))
    assert not builder(qwen, tiny_model, thoughts=False).thinking(GenerateInput(prompt="x"))
