"""Tools in a chat: the offered functions and the calls and results in its history, in the
form transformers' chat templates take (`tools`: [{"type": "function", "function": {name,
description, parameters}}]; an assistant message's `tool_calls`: [{"id", "type": "function",
"function": {"name", "arguments": {...}}}]; a `tool` message's `tool_call_id`). A template
that reads `tools` renders them itself; for one that does not (SmolLM2's), they are written
into the messages as text, in the Hermes form that the reply is scanned for."""

from __future__ import annotations

import json
from typing import Any

from common.errors import InvalidRequestError

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
RESULT_OPEN, RESULT_CLOSE = "<tool_response>", "</tool_response>"
Message = dict[str, Any]

_PROMPT = """\
# Tools

You can call these functions. Their signatures, one JSON object per line:
<tools>
{tools}
</tools>

To call a function, reply with a JSON object holding its name and its arguments between \
{open} and {close} tags, one block per call:
{open}
{{"name": "<function name>", "arguments": {{<arguments as a JSON object>}}}}
{close}
The results come back between {result_open} and {result_close} tags."""


def check_tools(tools: object) -> None:
    """Raise InvalidRequestError("tools", ...) unless a list of named function objects."""
    if not isinstance(tools, list):
        raise InvalidRequestError("tools", "must be a list")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or tool.get("type") != "function":
            raise InvalidRequestError("tools", f"[{i}]: must be {{type: function, function}}")
        name = fn.get("name")
        if not isinstance(name, str) or not name or len(name) > 64:
            raise InvalidRequestError("tools", f"[{i}].function.name: a string of 1-64 chars")
        if not isinstance(fn.get("parameters", {}), dict):
            raise InvalidRequestError("tools", f"[{i}].function.parameters: must be an object")


def check_tool_calls(calls: object, where: str) -> None:
    if not isinstance(calls, list) or not calls:
        raise InvalidRequestError("messages", f"{where}.tool_calls: must be a non-empty list")
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequestError("messages", f"{where}.tool_calls[{j}]: needs function.name")
        if not isinstance(fn.get("arguments"), dict):
            raise InvalidRequestError(
                "messages", f"{where}.tool_calls[{j}].function.arguments: must be an object"
            )


def call_text(call: Message) -> str:
    fn = call["function"]
    body = json.dumps({"name": fn["name"], "arguments": fn["arguments"]}, ensure_ascii=False)
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def described(tools: list[Message]) -> list[Message]:
    """The tools, each function with a description (empty where the request gave none):
    templates such as gpt-oss's write it unguarded, and a missing one fails them."""
    out = []
    for tool in tools:
        fn = tool["function"]
        out.append(tool if "description" in fn else {**tool, "function": {**fn, "description": ""}})
    return out


def tools_as_text(messages: list[Message], tools: list[Message] | None) -> list[Message]:
    """The chat with its tools, calls and results written as text: the offered tools after
    the system message (one is added when there is none), each call as a block in its
    assistant message, and each run of results as one user message."""
    out: list[Message] = []
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and m.get("tool_calls"):
            parts = [m["content"]] if m["content"] else []
            parts += [call_text(call) for call in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(parts)})
        elif m["role"] == "tool":
            result = f"{RESULT_OPEN}\n{m['content']}\n{RESULT_CLOSE}"
            if i and messages[i - 1]["role"] == "tool":  # one message for a run of results
                out[-1] = {"role": "user", "content": out[-1]["content"] + "\n" + result}
            else:
                out.append({"role": "user", "content": result})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    if tools:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        prompt = _PROMPT.format(
            tools=listed, open=CALL_OPEN, close=CALL_CLOSE,
            result_open=RESULT_OPEN, result_close=RESULT_CLOSE,
        )  # fmt: skip
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{prompt}"}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out
