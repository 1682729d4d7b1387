"""An OpenAI chat request's messages and tools, as the chat template takes them: contents
as strings, tool calls' arguments as objects (OpenAI sends them as JSON text), an assistant
message's reasoning as `reasoning_content`; and the template's further variables."""

from __future__ import annotations

from typing import Any

from common.errors import InvalidRequestError
from engine.text.chat_tools import Message, check_tools
from gateway.http_request import Body, get, joined_text, json_arguments


def content_text(content: Any, where: str) -> str:
    """A string, or a list of text parts, as one string."""
    text = joined_text(content)
    if text is None:
        raise InvalidRequestError("messages", f"{where}.content: a string or a list of text parts")
    return text


def chat_messages(body: Body) -> list[Message]:
    """`messages`, contents flattened to strings, `developer` read as `system`."""
    raw = get(body, "messages", list)
    if raw is None:
        raise InvalidRequestError("messages", "is required")
    messages = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise InvalidRequestError("messages", f"[{i}]: must be an object")
        role, content = m.get("role"), m.get("content")
        calls = m.get("tool_calls")
        if role == "assistant" and calls is not None:
            content = "" if content is None else content
            calls = _calls(calls, f"[{i}]")
        if content is not None and not isinstance(content, str):
            content = content_text(content, f"[{i}]")
        message = {"role": "system" if role == "developer" else role, "content": content}
        if calls is not None:
            message["tool_calls"] = calls
        thought = m.get("reasoning_content")
        if thought is None and isinstance(m.get("reasoning"), str):
            thought = m["reasoning"]  # OpenRouter's name for it
        if role == "assistant" and thought is not None:
            message["reasoning_content"] = thought  # checked with the rest of the chat
        if role == "tool":
            message["tool_call_id"] = m.get("tool_call_id")
        messages.append(message)
    return messages


def _calls(calls: Any, where: str) -> list[Message]:
    """The calls with their arguments parsed (checked further with the rest of the chat)."""
    if not isinstance(calls, list):
        raise InvalidRequestError("messages", f"{where}.tool_calls: must be a list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise InvalidRequestError("messages", f"{where}.tool_calls[{j}]: needs a function")
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            what = f"{where}.tool_calls[{j}].function.arguments"
            arguments = json_arguments(arguments, "messages", what)
        out.append({"id": call.get("id"), "type": "function",
                    "function": {"name": fn.get("name"), "arguments": arguments}})  # fmt: skip
    return out


def offered(body: Body) -> list[Any] | None:
    """`tools` as sent, when the model may call them: None when none are offered or
    `tool_choice` is none. The model cannot be made to call one, so "required" and a named
    tool are refused."""
    tools = get(body, "tools", list)
    choice = body.get("tool_choice")
    if choice == "none" or not tools:
        return None
    if choice not in (None, "auto"):
        raise InvalidRequestError(
            "tool_choice", "only auto and none are supported: the model is never forced to call"
        )
    return list(tools)


def tools_of(body: Body) -> list[Message] | None:
    """The tools the model may call (see `offered`)."""
    tools = offered(body)
    if tools is None:
        return None
    check_tools(tools)
    return [{"type": "function", "function": t["function"]} for t in tools]


EFFORTS = ("low", "medium", "high")  # what gpt-oss's template reads as reasoning_effort


def template_kwargs_of(body: Body) -> dict[str, Any] | None:
    """`chat_template_kwargs` (as vLLM and llama-server take them), with enable_thinking
    false when `reasoning_effort` is "none", and the effort as the template's
    `reasoning_effort` when it is low, medium or high (gpt-oss's "Reasoning:" line)."""
    kwargs = dict(get(body, "chat_template_kwargs", dict, {}))
    effort = get(body, "reasoning_effort", str)
    if effort == "none":
        kwargs["enable_thinking"] = False
    elif effort in EFFORTS:
        kwargs["reasoning_effort"] = effort
    return kwargs or None
