"""An Anthropic Messages request as one chat: `system` first, text blocks joined, `tool_use`
blocks as the assistant's tool calls, `thinking` blocks as its `reasoning_content`
(`redacted_thinking` ones, which only Anthropic can read, left out), each `tool_result`
block as a `tool` message; the custom tools offered in the chat template's form."""

from __future__ import annotations

from typing import Any

from common.errors import InvalidRequestError
from engine.text.chat_tools import Message, check_tools
from gateway.http_request import Body, get, joined_text

ROLES = ("user", "assistant")
BLOCKS = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use", "thinking", "redacted_thinking"),
}


def text_of(content: Any, where: str) -> str:
    """A string, or a list of text blocks (other block types are not supported)."""
    text = joined_text(content)
    if text is None:
        raise InvalidRequestError(where, "must be a string or a list of text blocks")
    return text


def chat_of(body: Body) -> list[Message]:
    """`system` and `messages` as one chat."""
    raw = get(body, "messages", list)
    if not raw:
        raise InvalidRequestError("messages", "is required (a non-empty list)")
    chat: list[Message] = []
    system = body.get("system")
    if system is not None:
        chat.append({"role": "system", "content": text_of(system, "system")})
    for i, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise InvalidRequestError("messages", f"[{i}]: role must be user or assistant")
        content = m.get("content")
        if isinstance(content, str):
            chat.append({"role": m["role"], "content": content})
        else:
            chat += _blocks(m["role"], content, f"messages[{i}]")
    return chat


def _blocks(role: str, blocks: Any, where: str) -> list[Message]:
    if not isinstance(blocks, list):
        raise InvalidRequestError(where, "content: must be a string or a list of blocks")
    texts, calls, results, thoughts = [], [], [], []
    for j, b in enumerate(blocks):
        kind = b.get("type") if isinstance(b, dict) else None
        if kind not in BLOCKS[role]:
            allowed = " and ".join(BLOCKS[role])
            raise InvalidRequestError(where, f"content[{j}]: {role} blocks are {allowed}")
        assert isinstance(b, dict)
        if kind == "text":
            texts.append(text_of([b], f"{where}.content[{j}]"))
        elif kind == "thinking":
            if not isinstance(b.get("thinking"), str):
                raise InvalidRequestError(where, f"content[{j}]: thinking needs its text")
            thoughts.append(b["thinking"])
        elif kind == "redacted_thinking":
            continue
        elif kind == "tool_use":
            if not isinstance(b.get("name"), str) or not isinstance(b.get("input"), dict):
                raise InvalidRequestError(where, f"content[{j}]: tool_use needs name and input")
            calls.append({"id": b.get("id"), "type": "function",
                          "function": {"name": b["name"], "arguments": b["input"]}})  # fmt: skip
        else:
            text = text_of(b.get("content", ""), f"{where}.content[{j}].content")
            text = f"Error: {text}" if b.get("is_error") else text
            results.append({"role": "tool", "tool_call_id": b.get("tool_use_id"), "content": text})
    if role == "assistant":
        message: Message = {"role": "assistant", "content": "".join(texts)}
        if thoughts:
            message["reasoning_content"] = "".join(thoughts)
        return [{**message, "tool_calls": calls}] if calls else [message]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts else [])


def tools_of(body: Body) -> list[Message] | None:
    """The custom tools offered, unless `tool_choice` is none; the model cannot be made to
    call one, so the choices any and tool are refused."""
    tools = get(body, "tools", list)
    choice = get(body, "tool_choice", dict, {}).get("type", "auto")
    if choice == "none" or not tools:
        return None
    if choice != "auto":
        raise InvalidRequestError(
            "tool_choice", "only auto and none are supported: the model is never forced to call"
        )
    converted = []
    for i, t in enumerate(tools):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom":
            raise InvalidRequestError("tools", f"[{i}]: only custom tools (name, input_schema)")
        schema = t.get("input_schema", {})
        function = {"name": t.get("name"), "description": t.get("description", ""),
                    "parameters": schema}  # fmt: skip
        converted.append({"type": "function", "function": function})
    check_tools(converted)
    return converted


def template_kwargs_of(body: Body) -> dict[str, Any] | None:
    """`thinking` {"type": "disabled"} turns the template's thinking off (its budget_tokens
    are not enforced)."""
    kind = get(body, "thinking", dict, {}).get("type")
    return {"enable_thinking": False} if kind == "disabled" else None
