"""gpt-oss's harmony format: replies read into reasoning, text and tool calls however they
are cut (gateway/harmony.py), what breaks the grammar given back as text; a harmony
vocabulary's markers kept in the reply's text and its ends (engine/text/tokenizer.py); and
chats with tools, calls, results and reasoning rendered through gpt-oss's own template."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.text.chat import render_chat
from engine.text.detokenizer import StreamDecoder
from engine.text.tokenizer import Tokenizer
from gateway.harmony import HarmonyReader, speaks_harmony
from gateway.reasoning import Thought
from gateway.tool_calls import ToolCall
from tests.harmony_model import harmony_meta
from tests.tiny_gpt_oss import vocab

TEMPLATE = (
    Path(__file__).parents[1] / "fixtures" / "templates" / "openai-gpt-oss-120b.jinja"
).read_text()
TOOLS = frozenset({"get_weather"})
THINK = "<|channel|>analysis<|message|>The user wants the weather. Call it.<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>It is 21 C in Paris."
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}'
)
MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>")


def pieces(text: str, how: str) -> list[str]:
    """The reply cut as a stream might bring it: whole, a character at a time, or at every
    marker (as tokens come)."""
    if how == "whole":
        return [text]
    if how == "chars":
        return list(text)
    out, rest = [], text
    while rest:
        at = min((i for m in MARKERS if (i := rest.find(m, 1)) > 0), default=len(rest))
        out.append(rest[:at])
        rest = rest[at:]
    return out


def read(text: str, how: str, names: frozenset[str] = TOOLS) -> tuple[str, str, list[ToolCall]]:
    reader = HarmonyReader(names)
    parts = [p for piece in pieces(text, how) for p in reader.feed(piece, 1)] + reader.finish()
    thought = "".join(p.text for p in parts if isinstance(p, Thought))
    text_out = "".join(p for p in parts if isinstance(p, str))
    return thought, text_out, [p for p in parts if isinstance(p, ToolCall)]


HOW = ["whole", "chars", "markers"]


@pytest.mark.parametrize("how", HOW)
def test_reasoning_and_the_final_answer_land_apart(how: str) -> None:
    thought, text, calls = read(THINK + FINAL, how)
    assert thought == "The user wants the weather. Call it."
    assert text == "It is 21 C in Paris."
    assert calls == []


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    "call",
    [
        CALL,  # the recipient after the channel, <|constrain|>json
        "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
        '{"city": "Paris"}',  # the recipient before the channel
        "<|start|>assistant<|channel|>commentary to=functions.get_weather<|message|>"
        '{"city": "Paris"}',  # no content type
    ],
)
def test_a_call_to_an_offered_tool_is_a_tool_call(how: str, call: str) -> None:
    thought, text, calls = read(THINK + call, how)
    assert thought == "The user wants the weather. Call it."
    assert text == ""
    assert [(c.index, c.name, c.arguments) for c in calls] == [
        (0, "get_weather", {"city": "Paris"})
    ]


def test_a_preamble_to_the_user_is_text_and_calls_count() -> None:
    preamble = "<|start|>assistant<|channel|>commentary<|message|>Checking the weather.<|end|>"
    reader = HarmonyReader(TOOLS)
    parts = reader.feed(THINK + preamble + CALL, 30) + reader.finish()
    assert [p for p in parts if isinstance(p, str)] == ["Checking the weather."]
    assert reader.num_calls == 1


def test_reasoning_tokens_are_those_read_in_the_analysis_channel() -> None:
    reader = HarmonyReader(TOOLS)
    reader.feed("<|channel|>analysis<|message|>", 3)
    reader.feed("Some thought", 2)
    reader.feed("<|end|><|start|>assistant<|channel|>final<|message|>", 6)
    reader.feed("Answer", 1)
    assert reader.reasoning_tokens == 2 + 6  # the chunk that closed the analysis too


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize(
    "reply",
    [
        "Plain words, no harmony at all.",  # no header
        "<|channel|>analysis<|mes",  # a header cut by the reply's end
        "<|channel|>monologue<|message|>Hmm.",  # an unknown channel
        "<|start|>user<|message|>Hi",  # a role other than the assistant's
        '<|channel|>commentary to=functions.launch_rockets<|message|>{"go": true}',  # not offered
        "<|channel|>commentary to=browser.search<|message|>{}",  # an unknown recipient
        "<|channel|>commentary to=functions.get_weather<|message|>{not json",  # bad arguments
        '<|channel|>commentary to=functions.get_weather<|message|>["Paris"]',  # not an object
    ],
)
def test_what_breaks_the_grammar_comes_back_as_the_text_it_was(how: str, reply: str) -> None:
    thought, text, calls = read(reply, how)
    assert (thought, text, calls) == ("", reply, [])


def test_broken_grammar_after_good_reasoning_keeps_the_reasoning() -> None:
    thought, text, calls = read(THINK + "<|start|>assistant<|channel|>poem<|message|>x", "markers")
    assert thought == "The user wants the weather. Call it."
    assert text == "<|start|>assistant<|channel|>poem<|message|>x"
    assert calls == []


def test_only_a_marker_being_written_is_held_back() -> None:
    reader = HarmonyReader(TOOLS)
    assert reader.feed("<|channel|>final<|message|>Hello <|", 1) == ["Hello "]
    assert reader.feed("en", 1) == []
    assert reader.feed("d|>", 1) == []  # the message's end: nothing more to send
    assert reader.finish() == []


def test_a_harmony_vocabulary_keeps_its_markers_in_the_text_and_ends_at_return_or_call() -> None:
    meta = harmony_meta()
    tokenizer = Tokenizer.from_metadata(meta)
    ids = tokenizer.encode(THINK + FINAL)
    by_text = {t: i for i, t in enumerate(meta["tokenizer.ggml.tokens"])}
    assert by_text["<|channel|>"] in ids and by_text["<|end|>"] in ids  # each one token
    assert tokenizer.decode(ids, skip_special=True) == THINK + FINAL
    decoder = StreamDecoder(tokenizer)
    assert "".join(decoder.push(i) for i in ids) + decoder.flush() == THINK + FINAL
    assert {by_text["<|return|>"], by_text["<|call|>"]} <= tokenizer.eot_ids
    assert by_text["<|end|>"] not in tokenizer.eot_ids  # it closes a message, not the reply
    im_end = by_text["<|im_end|>"]  # other control tokens are still left out of replies
    assert tokenizer.decode([im_end], skip_special=True) == ""


def test_other_vocabularies_keep_no_markers() -> None:
    tokenizer = Tokenizer.from_metadata(vocab())
    im_start = tokenizer.encode("<|im_start|>")
    assert tokenizer.decode(im_start, skip_special=True) == ""


def test_the_gpt_oss_template_renders_tools_calls_results_and_reasoning() -> None:
    assert speaks_harmony(TEMPLATE) and not speaks_harmony("{{ messages }}")
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need the weather tool.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    ]
    prompt = render_chat(TEMPLATE, messages, tools=tools)
    assert "# Instructions\n\nBe brief." in prompt
    assert "namespace functions {" in prompt and "type get_weather = (_: {" in prompt
    assert "<|start|>user<|message|>Weather in Paris?<|end|>" in prompt
    # the call's reasoning (no final answer follows yet), then the call and its result
    assert "<|start|>assistant<|channel|>analysis<|message|>Need the weather tool.<|end|>" in prompt
    assert (
        '<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": '
        '"Paris"}<|call|>'
    ) in prompt
    assert (
        '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"21 C"<|end|>'
        in prompt
    )
    assert prompt.endswith("<|start|>assistant")
    assert "Reasoning: medium" in prompt  # the template's default effort
    high = render_chat(
        TEMPLATE, messages, tools=tools, template_kwargs={"reasoning_effort": "high"}
    )
    assert "Reasoning: high" in high  # as OpenAI's reasoning_effort asks (openai_messages.py)


def test_a_tool_without_a_description_renders() -> None:
    """gpt-oss's template writes each tool's description unguarded: a tool sent without one
    (the APIs allow it) gets an empty one rather than failing the request."""
    tools = [{"type": "function", "function": {"name": "ping", "parameters": {}}}]
    prompt = render_chat(TEMPLATE, [{"role": "user", "content": "Hi"}], tools=tools)
    assert "// \ntype ping = () => any;" in prompt
