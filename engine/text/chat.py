"""Render chat messages to a prompt string with the model's Jinja2 chat template. An
assistant message may carry its reasoning in `reasoning_content` (the field Qwen 3's
template reads); a template that reads `thinking` instead (gpt-oss's) gets it there, and
for one that reads neither the reasoning goes back into the content between think tags, as
the model wrote it."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2 import meta
from jinja2.sandbox import ImmutableSandboxedEnvironment

from common.errors import InvalidRequestError
from engine.text.chat_tools import (
    Message,
    check_tool_calls,
    check_tools,
    described,
    tools_as_text,
)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ROLES = frozenset({"system", "user", "assistant", "tool"})
# the variables render_chat sets itself; template_kwargs may not replace them
OWN_VARIABLES = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token"})


def _raise_exception(message: str) -> NoReturn:
    raise InvalidRequestError("messages", message)


def _tojson(value: Any, indent: int | None = None) -> str:
    # As transformers does: Jinja's own tojson escapes <, >, & and ' for HTML, which would change
    # the prompt the model was trained on.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    """The compiled template; built once per distinct template string."""
    return _environment().from_string(template)


@functools.lru_cache(maxsize=16)
def reads_tools(template: str) -> bool:
    """Whether the template renders `tools` itself."""
    try:
        return "tools" in meta.find_undeclared_variables(_environment().parse(template))
    except jinja2.TemplateError:
        return False  # rendering says what is wrong


def validate_messages(messages: object) -> None:
    """Raise InvalidRequestError("messages", ...) naming the first bad message and its problem."""
    if not isinstance(messages, list) or not messages:
        raise InvalidRequestError("messages", "must be a non-empty list of messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidRequestError("messages", f"[{i}]: must be an object, not {_kind(message)}")
        role = message.get("role")
        if not isinstance(role, str):
            raise InvalidRequestError(
                "messages", f"[{i}].role: must be a string, not {_kind(role)}"
            )
        if role not in ROLES:
            expected = ", ".join(sorted(ROLES))
            raise InvalidRequestError(
                "messages", f"[{i}].role: unknown role {role!r} (expected one of {expected})"
            )
        content = message.get("content")
        if not isinstance(content, str):
            raise InvalidRequestError(
                "messages", f"[{i}].content: must be a string, not {_kind(content)}"
            )
        if message.get("reasoning_content") is not None:
            _check_reasoning(message, role, i)
        if message.get("tool_calls") is not None:
            if role != "assistant":
                raise InvalidRequestError("messages", f"[{i}].tool_calls: only on assistant")
            check_tool_calls(message["tool_calls"], f"[{i}]")


def _check_reasoning(message: Message, role: str, i: int) -> None:
    if role != "assistant":
        raise InvalidRequestError("messages", f"[{i}].reasoning_content: only on assistant")
    if not isinstance(message["reasoning_content"], str):
        kind = _kind(message["reasoning_content"])
        raise InvalidRequestError("messages", f"[{i}].reasoning_content: a string, not {kind}")


def reads_reasoning(template: str) -> bool:
    """Whether the template renders an assistant message's `reasoning_content` itself."""
    return "reasoning_content" in template


def reads_thinking(template: str) -> bool:
    """Whether the template renders an assistant message's reasoning from a `thinking`
    field (gpt-oss's harmony template: its analysis channel)."""
    return "message.thinking" in template


def thoughts_as_thinking(messages: list[Message]) -> list[Message]:
    """Each assistant message's `reasoning_content` as its `thinking`."""
    return [
        {("thinking" if k == "reasoning_content" else k): v for k, v in m.items()} for m in messages
    ]


def thoughts_in_content(messages: list[Message]) -> list[Message]:
    """Each assistant message's reasoning written before its content, between think tags
    (the form Qwen 3 and DeepSeek R1 write it in)."""
    out = []
    for m in messages:
        if "reasoning_content" in m:
            thought = m["reasoning_content"]
            m = {k: v for k, v in m.items() if k != "reasoning_content"}
            if thought:
                m["content"] = f"{THINK_OPEN}\n{thought}\n{THINK_CLOSE}\n\n{m['content']}"
        out.append(m)
    return out


def _kind(value: object) -> str:
    return "missing" if value is None else type(value).__name__


def render_chat(
    template: str,
    messages: list[Message],
    *,
    tools: list[Message] | None = None,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    template_kwargs: Mapping[str, object] | None = None,
) -> str:
    """The prompt for `messages` (and the `tools` offered); a bad message or a failing
    template is InvalidRequestError. `template_kwargs` are further variables the template
    reads, as llama-server's and vLLM's chat_template_kwargs (Qwen 3's enable_thinking)."""
    validate_messages(messages)
    taken = sorted(OWN_VARIABLES & set(template_kwargs or {}))
    if taken:
        raise InvalidRequestError("chat_template_kwargs", f"cannot set {', '.join(taken)}")
    if tools is not None:
        check_tools(tools)
        tools = described(tools)
    if reads_thinking(template) and not reads_reasoning(template):
        messages = thoughts_as_thinking(messages)
    elif not reads_reasoning(template):
        messages = thoughts_in_content(messages)
    with_tools = bool(tools) or any(m["role"] == "tool" or m.get("tool_calls") for m in messages)
    if with_tools and not reads_tools(template):
        messages, tools = tools_as_text(messages, tools), None
    try:
        compiled = _compile(template)
    except jinja2.TemplateError as e:
        raise InvalidRequestError("chat_template", f"does not compile: {e}") from e
    try:
        return compiled.render(
            **(template_kwargs or {}),
            messages=messages,
            **({"tools": tools} if tools else {}),
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except InvalidRequestError:
        raise
    except Exception as e:
        # The template is code from the model file; whatever fails inside it fails this
        # request, never the server.
        raise InvalidRequestError("messages", f"chat template failed: {e}") from e
