"""The families' own chat templates (tests/fixtures/templates, as llama.cpp keeps them)
through render_chat: Meta's for Llama 3.1 and 3.2 (the plain prompt exactly, tools and a
call's round trip in Llama 3's JSON form), Qwen's for Qwen 2.5 (tools, <tool_call> and
<tool_response>) and Qwen 3 (its thinking: enable_thinking, earlier turns' thoughts
dropped), and their markup tokenized as single control tokens."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from common.errors import InvalidRequestError
from engine.text.chat import render_chat
from engine.text.tokenizer import Tokenizer
from tests.conftest import FIXTURES
from tests.tiny_families import family_vocab

TEMPLATES = FIXTURES / "templates"
VERSIONS = {"3.1": "meta-llama-Llama-3.1-8B-Instruct", "3.2": "meta-llama-Llama-3.2-3B-Instruct"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]  # fmt: skip
MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather in London?"}]  # fmt: skip
START, END, EOT = 128006, 128007, 128009


def template(version: str) -> str:
    return (TEMPLATES / f"{VERSIONS[version]}.jinja").read_text()


def header(role: str) -> str:
    return f"<|start_header_id|>{role}<|end_header_id|>\n\n"


@pytest.mark.parametrize("version", list(VERSIONS))
def test_a_plain_conversation_renders_as_meta_wrote_it(version: str) -> None:
    before = datetime.now().strftime("%d %b %Y")
    got = render_chat(template(version), MESSAGES)
    after = datetime.now().strftime("%d %b %Y")
    # 3.1 dates itself 26 Jul 2024 unless told; 3.2 asks strftime_now for today
    dates = ["26 Jul 2024"] if version == "3.1" else [before, after]
    expected = [
        header("system") + "Cutting Knowledge Date: December 2023\n"
        f"Today Date: {date}\n\nBe brief.<|eot_id|>"
        + header("user") + "Weather in London?<|eot_id|>" + header("assistant")
        for date in dates
    ]  # fmt: skip
    assert got in expected


@pytest.mark.parametrize("version", list(VERSIONS))
def test_tools_a_call_and_its_result_take_llama_3s_form(version: str) -> None:
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "London"}}}  # fmt: skip
    messages: list[dict[str, Any]] = [
        *MESSAGES,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "12 C, rain", "tool_call_id": "c1"},
    ]
    got = render_chat(template(version), messages, tools=TOOLS)
    assert got.startswith(header("system") + "Environment: ipython\n")
    assert '"name": "get_weather"' in got and "Given the following functions" in got
    turns = got.split("<|eot_id|>")
    assert turns[-4].endswith("Weather in London?")  # the tools go in the first user turn
    assert (
        turns[-3]
        == header("assistant") + '{"name": "get_weather", "parameters": {"city": "London"}}'
    )
    assert turns[-2] == header("ipython") + '"12 C, rain"'
    assert turns[-1] == header("assistant")


def test_the_rendered_markup_is_single_control_tokens() -> None:
    data = family_vocab("llama3")
    tokenizer = Tokenizer.from_metadata(data["metadata"])
    ids = tokenizer.encode(render_chat(template("3.1"), MESSAGES))
    assert ids[0] == START and ids.count(START) == 3 and ids.count(END) == 3
    assert ids.count(EOT) == 2
    assert tokenizer.decode(ids[-3:]) == "assistant<|end_header_id|>\n\n"


QWEN = "Qwen-Qwen2.5-7B-Instruct"


def test_qwen_2_5_offers_tools_and_takes_calls_in_its_xml_tags() -> None:
    qwen = (TEMPLATES / f"{QWEN}.jinja").read_text()
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": {"city": "London"}}}  # fmt: skip
    messages: list[dict[str, Any]] = [
        MESSAGES[1],
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "12 C, rain", "tool_call_id": "c1"},
    ]
    got = render_chat(qwen, messages, tools=TOOLS)
    assert got.startswith("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud.")
    assert '<tools>\n{"type": "function", "function": {"name": "get_weather"' in got
    turns = got.split("<|im_end|>\n")
    assert turns[-3] == (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "London"}}\n</tool_call>'
    )
    assert turns[-2] == "<|im_start|>user\n<tool_response>\n12 C, rain\n</tool_response>"
    assert turns[-1] == "<|im_start|>assistant\n"
    tokenizer = Tokenizer.from_metadata(family_vocab("qwen2")["metadata"])
    ids = tokenizer.encode(got)
    im_start, im_end = tokenizer.encode("<|im_start|>"), tokenizer.encode("<|im_end|>")
    assert len(im_start) == len(im_end) == 1
    assert ids.count(im_start[0]) == 5 and ids.count(im_end[0]) == 4


QWEN3 = "Qwen-Qwen3-0.6B"


def qwen3() -> str:
    return (TEMPLATES / f"{QWEN3}.jinja").read_text()


def test_qwen_3_thinks_unless_told_not_to() -> None:
    plain = (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather in London?"
        "<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_chat(qwen3(), MESSAGES) == plain
    # enable_thinking false: an empty thought, so the reply starts with the answer
    got = render_chat(qwen3(), MESSAGES, template_kwargs={"enable_thinking": False})
    assert got == plain + "<think>\n\n</think>\n\n"
    assert render_chat(qwen3(), MESSAGES, template_kwargs={"enable_thinking": True}) == plain


def test_qwen_3_drops_the_thoughts_of_turns_before_the_last_question() -> None:
    reply = {"role": "assistant", "content": "<think>\nCloudy, surely.\n</think>\n\nRain."}
    messages = [*MESSAGES, reply, {"role": "user", "content": "And Paris?"}]
    got = render_chat(qwen3(), messages)
    assert "<|im_start|>assistant\nRain.<|im_end|>\n<|im_start|>user\nAnd Paris?" in got
    assert "Cloudy" not in got
    # a call's thought after the last question stays, so the turn continues where it was
    call = {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    thinking = {
        "role": "assistant",
        "content": "<think>\nLook it up.\n</think>\n\n",
        "tool_calls": [call],
    }
    result = {"role": "tool", "content": "20 C", "tool_call_id": "c1"}
    got = render_chat(qwen3(), [*messages, thinking, result], tools=TOOLS)
    assert got.endswith(
        '<|im_start|>assistant\n<think>\nLook it up.\n</think>\n\n<tool_call>\n{"name": '
        '"get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n20 C\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert got.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")


def test_qwen_3_markup_is_single_control_tokens() -> None:
    tokenizer = Tokenizer.from_metadata(family_vocab("qwen2")["metadata"])
    got = render_chat(qwen3(), MESSAGES, template_kwargs={"enable_thinking": False})
    ids = tokenizer.encode(got)
    im_start, im_end = tokenizer.encode("<|im_start|>"), tokenizer.encode("<|im_end|>")
    assert len(im_start) == len(im_end) == 1
    assert ids.count(im_start[0]) == 3 and ids.count(im_end[0]) == 2
    assert tokenizer.decode(ids) == got


def test_template_kwargs_cannot_replace_what_render_chat_sets() -> None:
    with pytest.raises(InvalidRequestError, match=r"chat_template_kwargs.*messages"):
        render_chat(qwen3(), MESSAGES, template_kwargs={"messages": []})
