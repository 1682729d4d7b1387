"""A Generate request, as any face reads it, checked into the Job a worker runs, or a precise
error naming the field. Everything a request can get wrong is found here, once."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any

from broker.messages import Job
from common.enums import Priority
from common.errors import InvalidRequestError, PromptTooLargeError
from common.ids import check_session_id
from common.sampling import SamplingParams
from engine.text.chat import render_chat, validate_messages
from engine.text.model_config import ModelConfig
from engine.text.tokenizer import Tokenizer
from gateway.bounds import InputBounds
from gateway.harmony import speaks_harmony
from gateway.reasoning import ThoughtSplitter, opens_thought
from gateway.sampling_defaults import Defaults, defaults_for
from gateway.work_gate import WorkGate

DEFAULT_MAX_TOKENS = 256
PROMPT_TAIL_TOKENS = 8  # enough to spell "<think>\n" in any tokenizer's pieces


@dataclass(frozen=True, slots=True)
class GenerateInput:
    """What a client asked for, whatever API it spoke; exactly one of messages, prompt and
    token_ids. `tools`: the functions offered, with messages (engine/text/chat_tools.py's form);
    `template_kwargs`: the chat template's further variables (`enable_thinking` false
    turns reasoning off). Sampling fields left None take `defaults`."""

    session_id: str = ""
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    prompt: str | None = None
    token_ids: list[int] | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    # when the client sent no max_tokens; None: up to the context's end (OpenAI's rule)
    max_tokens_default: int | None = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = field(default=())
    priority: Priority = Priority.NORMAL
    ignore_eos: bool = False
    min_tokens: int = 0
    template_kwargs: dict[str, Any] | None = None
    defaults: Defaults = Defaults.GREEDY

    @property
    def reasoning_off(self) -> bool:
        return (self.template_kwargs or {}).get("enable_thinking") is False


def without_thoughts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages without their reasoning: the model is not to think, or its replies are
    not read for thoughts (a model shown thoughts it never writes would copy them)."""
    return [
        {k: v for k, v in m.items() if k != "reasoning_content"}
        if isinstance(m, dict) and "reasoning_content" in m
        else m
        for m in messages
    ]


def prompt_ids(inp: GenerateInput, tokenizer: Tokenizer, thinking: bool = False) -> list[int]:
    """The prompt's tokens; `thinking`: earlier replies' reasoning is rendered too."""
    given = [n for n in ("messages", "prompt", "token_ids") if getattr(inp, n) is not None]
    if len(given) != 1:
        raise InvalidRequestError("input", "exactly one of messages, prompt or token_ids")
    if inp.messages is not None:
        validate_messages(inp.messages)
        if tokenizer.chat_template is None:
            raise InvalidRequestError("messages", "the model has no chat template; send prompt")
        messages = inp.messages if thinking else without_thoughts(inp.messages)
        prompt = render_chat(
            tokenizer.chat_template, messages, tools=inp.tools, template_kwargs=inp.template_kwargs
        )
        return tokenizer.encode(prompt)
    if inp.prompt is not None:
        if not inp.prompt:
            raise InvalidRequestError("prompt", "is empty")
        return tokenizer.encode(inp.prompt)
    assert inp.token_ids is not None
    if not inp.token_ids:
        raise InvalidRequestError("token_ids", "is empty")
    return list(inp.token_ids)


def sampling_of(
    inp: GenerateInput, room: int, architecture: str = "", thinking: bool = False
) -> SamplingParams:
    """The sampling asked for, the defaults of the request's API (and the model's family:
    `architecture`, and whether it may be `thinking`) where it left a field out; `room`:
    the tokens the context holds after the prompt. A max_tokens past it is cut to it: the
    same tokens come out (the context ends first), and the fair queues charge what can run
    (Claude Code asks 32,000 of an 8,192 context)."""
    max_tokens = inp.max_tokens
    if max_tokens is None:
        max_tokens = room if inp.max_tokens_default is None else inp.max_tokens_default
    default = defaults_for(inp.defaults, architecture, thinking)
    sampling = SamplingParams(
        temperature=default.temperature if inp.temperature is None else inp.temperature,
        top_k=default.top_k if inp.top_k is None else inp.top_k,
        top_p=default.top_p if inp.top_p is None else inp.top_p,
        min_p=inp.min_p or 0.0,
        # fixed here when absent, so that a retry on another worker draws the same tokens
        seed=secrets.randbits(63) if inp.seed is None else inp.seed,
        max_tokens=max_tokens,
        stop=inp.stop,
        ignore_eos=inp.ignore_eos,
        min_tokens=inp.min_tokens,
    )  # checked as asked, then cut to the room
    if sampling.max_tokens <= room:
        return sampling
    return replace(sampling, max_tokens=room, min_tokens=min(sampling.min_tokens, room))


def build_job(
    inp: GenerateInput,
    tenant: str,
    tokenizer: Tokenizer,
    config: ModelConfig,
    timeout_s: float,
    thinking: bool = False,
) -> Job:
    """Everything checked that can be checked here; raises InvalidRequestError subclasses.
    `thinking`: the model's replies may reason (see JobBuilder.thinking)."""
    check_session_id(inp.session_id)
    ids = prompt_ids(inp, tokenizer, thinking)
    config.check_prompt(ids)
    room = config.context_length - len(ids)
    sampling = sampling_of(inp, room, config.architecture, thinking)
    now = time.time()
    return Job(
        request_id=uuid.uuid4().hex,
        tenant=tenant,
        session_id=inp.session_id,
        prompt_ids=tuple(ids),
        sampling=sampling,
        priority=inp.priority,
        accepted_at=now,
        deadline_at=now + timeout_s,
    )


def input_size(inp: GenerateInput, bounds: InputBounds) -> int:
    """The bytes of the input's text (for token ids, their count); raises PromptTooLargeError
    (or PromptTooLongError) when its size alone shows it cannot fit. Cheap: nothing is
    tokenized or copied, so it runs on the event loop, before any expensive step."""
    if inp.messages is not None:
        bounds.check_count("messages", len(inp.messages))
        texts = [
            m.get(k)
            for m in inp.messages
            if isinstance(m, dict)
            for k in ("content", "reasoning_content")
        ]
        calls = [m["tool_calls"] for m in inp.messages if isinstance(m, dict) and "tool_calls" in m]
        if calls or inp.tools:  # their JSON is written into the prompt
            texts += [json.dumps(calls), json.dumps(inp.tools)]
        return bounds.check_text("messages", (t for t in texts if isinstance(t, str)))
    if inp.prompt is not None:
        return bounds.check_text("prompt", (inp.prompt,))
    if inp.token_ids is not None:
        bounds.check_count("token_ids", len(inp.token_ids))
        return len(inp.token_ids)
    return 0


class JobBuilder:
    """Builds jobs off the event loop: tokenizing a long prompt takes a while, and the loop
    serves every other stream meanwhile. Inputs too large to fit are refused first, by their
    size, on the loop; the rest wait for one of the gate's few threads (gateway/work_gate.py),
    which refuses them with a retry hint when too much input waits already. `thoughts`:
    replies are read for a think span (`--reasoning-parser`)."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        config: ModelConfig,
        default_timeout_s: float,
        gate: WorkGate,
        thoughts: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.default_timeout_s = default_timeout_s
        self.gate = gate
        self.bounds = InputBounds.of(tokenizer, config)
        self.thoughts = thoughts
        self.harmony = speaks_harmony(tokenizer.chat_template)  # gpt-oss's replies

    def thinking(self, inp: GenerateInput) -> bool:
        """Whether the reply may reason: the gateway reads think spans and the request did
        not turn reasoning off."""
        return self.thoughts and not inp.reasoning_off

    def splitter(self, job: Job) -> ThoughtSplitter:
        """The reader of the job's reply: in its reasoning from the start when the prompt
        left a think span open (a few tokens' text is all that takes)."""
        if not self.thoughts:
            return ThoughtSplitter(enabled=False)
        tail = self.tokenizer.decode(job.prompt_ids[-PROMPT_TAIL_TOKENS:])
        return ThoughtSplitter(inside=opens_thought(tail))

    async def build(self, inp: GenerateInput, tenant: str, time_left_s: float | None) -> Job:
        """The job, with the client's deadline when it sent one (else the default)."""
        timeout_s = self.default_timeout_s
        if time_left_s is not None:
            timeout_s = min(time_left_s, timeout_s)
        size = self._size(inp)
        return await self.gate.run(
            size,
            build_job,
            inp,
            tenant,
            self.tokenizer,
            self.config,
            timeout_s,
            self.thinking(inp),
        )

    async def count_tokens(self, inp: GenerateInput) -> int:
        """How many tokens the input's prompt has (the same checks as `build`)."""
        ids = await self.gate.run(
            self._size(inp), prompt_ids, inp, self.tokenizer, self.thinking(inp)
        )
        return len(ids)

    def _size(self, inp: GenerateInput) -> int:
        try:
            return input_size(inp, self.bounds)
        except PromptTooLargeError:
            self.gate.on_large()  # the request's text is freed soon: trim the heap then
            raise
