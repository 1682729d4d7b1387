"""An OpenAI Responses request (what Codex CLI speaks) as one chat: `instructions` first,
`input` as a string or items (messages with text parts, `function_call` items joined to the
assistant message before them, each `function_call_output` a `tool` message, a `reasoning`
item's text the `reasoning_content` of the assistant turn after it), the function tools
offered. Nothing is stored: each request carries its whole conversation, and the
session's KV makes that cheap (`previous_response_id` is refused)."""

from __future__ import annotations

from typing import Any

from common.errors import InvalidRequestError
from engine.text.chat_tools import Message, check_tools
from gateway.http_request import Body, get, joined_text, json_arguments
from gateway.openai_messages import EFFORTS, offered

ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text", "text")


def text_of(content: Any, where: str) -> str:
    """A string, or a list of text parts, as one string."""
    text = joined_text(content, TEXT_PARTS)
    if text is None:
        raise InvalidRequestError("input", f"{where}: a string or a list of text parts")
    return text


def chat_of(body: Body) -> list[Message]:
    if body.get("previous_response_id") is not None:
        raise InvalidRequestError(
            "previous_response_id",
            "not supported: responses are not stored; send the whole conversation as input",
        )
    raw = body.get("input")
    if raw is None or raw == "" or raw == []:
        raise InvalidRequestError("input", "is required")
    chat: list[Message] = []
    instructions = get(body, "instructions", str)
    if instructions:
        chat.append({"role": "system", "content": instructions})
    if isinstance(raw, str):
        return [*chat, {"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise InvalidRequestError("input", "must be a string or a list of items")
    thought = ""  # a reasoning item's text, for the assistant turn it comes before
    for i, item in enumerate(raw):
        if isinstance(item, dict) and item.get("type") == "reasoning":
            thought += _reasoning_text(item, f"[{i}]")
        else:
            _add_item(chat, item, f"[{i}]", thought)
            thought = "" if chat[-1]["role"] == "assistant" else thought
    return chat


def _add_item(chat: list[Message], item: Any, where: str, thought: str) -> None:
    if not isinstance(item, dict):
        raise InvalidRequestError("input", f"{where}: must be an object")
    kind = item.get("type", "message")
    last = chat[-1] if chat else None
    joins = last is not None and last["role"] == "assistant" and not thought
    if kind == "message":
        role = ROLES.get(str(item.get("role")))
        if role is None:
            raise InvalidRequestError("input", f"{where}.role: user, assistant, system, developer")
        chat.append({"role": role, "content": text_of(item.get("content"), where)})
    elif kind == "function_call":
        call = _call(item, where)
        if joins:
            assert last is not None
            last.setdefault("tool_calls", []).append(call)
        else:
            chat.append({"role": "assistant", "content": "", "tool_calls": [call]})
    elif kind == "function_call_output":
        output = text_of(item.get("output"), f"{where}.output")
        chat.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
    else:
        kinds = "message, function_call, function_call_output and reasoning"
        raise InvalidRequestError("input", f"{where}: items are {kinds}")
    if thought and chat[-1]["role"] == "assistant":
        chat[-1]["reasoning_content"] = thought


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text: its reasoning_text parts (a summary is not what the model
    wrote, and encrypted content only OpenAI reads)."""
    parts = item.get("content") or []
    if not isinstance(parts, list):
        raise InvalidRequestError("input", f"{where}.content: a list of reasoning_text parts")
    texts = [p.get("text") for p in parts if isinstance(p, dict)]
    if not all(isinstance(t, str) for t in texts):
        raise InvalidRequestError("input", f"{where}.content: each part needs its text")
    return "".join(t for t in texts if isinstance(t, str))


def _call(item: dict[str, Any], where: str) -> Message:
    arguments = item.get("arguments")
    text = arguments if isinstance(arguments, str) else ""  # other values: no arguments
    parsed = json_arguments(text, "input", f"{where}.arguments")
    return {"id": item.get("call_id"), "type": "function",
            "function": {"name": item.get("name"), "arguments": parsed}}  # fmt: skip


def tools_of(body: Body) -> list[Message] | None:
    """The function tools the model may call (see openai_messages.offered); others, such as
    web_search, are left out: the model can call only functions."""
    tools = offered(body) or []
    functions = [t for t in tools if isinstance(t, dict) and t.get("type") == "function"]
    converted = [{"type": "function", "function": {k: v for k, v in t.items() if k != "type"}}
                 for t in functions]  # fmt: skip
    check_tools(converted)
    return converted or None


def check_format(body: Body) -> None:
    """Structured output (text.format json_schema or json_object) is not supported."""
    form = get(body, "text", dict, {}).get("format")
    kind = form.get("type", "text") if isinstance(form, dict) else "text"
    if kind != "text":
        raise InvalidRequestError("text.format", f"{kind!r} is not supported (only text)")


def template_kwargs_of(body: Body) -> dict[str, Any] | None:
    """`reasoning.effort` "none" turns the template's thinking off; low, medium or high is
    the template's `reasoning_effort` (gpt-oss's)."""
    effort = get(body, "reasoning", dict, {}).get("effort")
    if effort == "none":
        return {"enable_thinking": False}
    return {"reasoning_effort": effort} if effort in EFFORTS else None
