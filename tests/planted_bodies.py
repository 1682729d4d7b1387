"""Request bodies with one field planted with hostile JSON (nested past the bound, or a lone
surrogate) for every JSON-bearing and text field of the HTTP routes, written as text."""

from __future__ import annotations

import json
import re
from typing import Any

SURROGATES = ("\ud800", "\udfff", "a\ud83dz")  # json.dumps writes each as its \u escapes

# Bodies with one field planted: RAW (a JSON value) or TEXT (JSON text inside a string, as
# tool arguments are sent) is replaced by hostile JSON written as text; a nested list that
# deep would make json.dumps recurse.
RAW, TEXT = "@raw@", "@text@"
HI = {"role": "user", "content": "hi"}
CHAT, TEXTS, MESSAGES = "/v1/chat/completions", "/v1/completions", "/v1/messages"
COUNT, RESPONSES = "/v1/messages/count_tokens", "/v1/responses"
FORK = "/v1/sessions/fuzz-a/fork"
F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": TEXT}}
USE = {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": RAW}}
RESULT = {"type": "tool_result", "tool_use_id": "t1", "content": RAW}
RESPONSES_F = {"type": "function", "name": "f", "parameters": {"type": "object"}}
ITEM_CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": TEXT}
THINKING = {"type": "thinking", "thinking": RAW, "signature": RAW}
ANTHROPIC_TEMPLATES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": RAW}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": RAW}]}]},
    {"system": RAW, "messages": [HI]},
    {"messages": [HI], "stop_sequences": [RAW]},
    {"messages": [HI, {"role": "assistant", "content": [USE]}]},
    {"messages": [HI, {"role": "assistant", "content": [{**USE, "input": RAW}]}]},
    {"messages": [HI, {"role": "assistant", "content": [{**USE, "name": RAW}]}]},
    {"messages": [{"role": "user", "content": [RESULT]}]},
    {"messages": [HI], "tools": [{"name": "f", "input_schema": RAW}]},
    {"messages": [HI], "tools": [{"name": RAW, "description": RAW, "input_schema": {}}]},
    {"messages": [HI], "metadata": {"user_id": RAW}, "model": RAW},
    {"messages": [HI, {"role": "assistant", "content": [THINKING]}], "thinking": RAW},
]
# (route, body): every JSON-bearing field and every text field of the five routes and fork
PLANTED: list[tuple[str, Any]] = [
    (CHAT, RAW),
    (CHAT, {"messages": RAW}),
    (CHAT, {"messages": [{"role": "user", "content": RAW}]}),
    (CHAT, {"messages": [{"role": RAW, "content": "hi"}]}),
    (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": RAW}]}]}),
    (CHAT, {"messages": [{"role": "system", "content": RAW}, HI], "stop": [RAW]}),
    (CHAT, {"messages": [HI], "tools": [{**F, "function": {"name": "f", "parameters": RAW}}]}),
    (CHAT, {"messages": [HI], "tools": [{**F, "function": {"name": RAW, "description": RAW}}]}),
    (
        CHAT,
        {
            "messages": [HI, {"role": "assistant", "content": "", "tool_calls": [CALL]}],
            "tools": [F],
        },
    ),
    (
        CHAT,
        {
            "messages": [
                HI,
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [{**CALL, "function": {"name": RAW, "arguments": "{}"}}],
                },
                {"role": "tool", "tool_call_id": RAW, "content": RAW},
            ],
            "tools": [F],
        },
    ),
    (CHAT, {"messages": [HI, {"role": "assistant", "content": "", "reasoning_content": RAW}]}),
    (CHAT, {"messages": [HI], "chat_template_kwargs": RAW, "reasoning_effort": RAW}),
    (TEXTS, {"prompt": RAW}),
    (TEXTS, {"prompt": "hi", "stop": RAW, "model": RAW}),
    *[
        (route, {"max_tokens": 2, **body})
        for route in (MESSAGES, COUNT)
        for body in ANTHROPIC_TEMPLATES
    ],
    (RESPONSES, {"input": RAW}),
    (RESPONSES, {"input": "hi", "instructions": RAW, "prompt_cache_key": RAW}),
    (RESPONSES, {"input": [{"type": "message", "role": "user", "content": RAW}]}),
    (RESPONSES, {"input": [{"role": "user", "content": [{"type": "input_text", "text": RAW}]}]}),
    (
        RESPONSES,
        {
            "input": [
                HI,
                ITEM_CALL,
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
            ],
            "tools": [RESPONSES_F],
        },
    ),
    (
        RESPONSES,
        {
            "input": [
                HI,
                {**ITEM_CALL, "name": RAW, "call_id": RAW, "arguments": "{}"},
                {"type": "function_call_output", "call_id": RAW, "output": RAW},
            ]
        },
    ),
    (RESPONSES, {"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": RAW}]}),
    (
        RESPONSES,
        {
            "input": [
                HI,
                {
                    "type": "reasoning",
                    "id": RAW,
                    "summary": RAW,
                    "content": [{"type": "reasoning_text", "text": RAW}],
                },
            ],
            "reasoning": RAW,
        },
    ),
    (FORK, {"new_session_id": RAW}),
]
DEPTHS = (65, 999, 10_000, 100_000, 1_000_000)  # past the bound: the walk's, then the parser's


def nested(depth: int) -> str:
    """JSON text `depth` levels deep: objects where that stays well under the body's limit."""
    if depth > 100_000:
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "0" + "}" * depth


def planted(body: Any, raw: str, rest: str | None = None) -> bytes:
    """`body` as JSON with each RAW replaced by the JSON text `raw`, each TEXT by it as a JSON
    string's content; with `rest`, only the first is `raw`, the others `rest`."""
    pieces = re.split(f'("{RAW}"|{TEXT})', json.dumps(body))
    for n in range(1, len(pieces), 2):
        value = raw if rest is None or n == 1 else rest
        pieces[n] = json.dumps(value)[1:-1] if pieces[n] == TEXT else value
    return "".join(pieces).encode()


def hostile_bodies() -> list[tuple[str, bytes, str]]:
    """(route, body, a word its refusal must hold): in each planted field, a value nested past
    the bound at every depth (one field a body: two of 10^6 would pass the body's limit), and
    each lone surrogate, as a string and as a key."""
    cases = []
    for i, (route, body) in enumerate(PLANTED):
        for depth in DEPTHS:
            cases.append((route, planted(body, nested(depth), '"x"'), "nested deeper"))
        lone = SURROGATES[i % len(SURROGATES)]
        refusal = "JSON object" if body == RAW else "surrogate"  # a body that is one string
        cases.append((route, planted(body, json.dumps(lone)), refusal))
        cases.append((route, planted(body, json.dumps({lone: 1})), "surrogate"))
    return cases
