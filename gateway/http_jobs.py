"""What every HTTP endpoint that generates does: read the body and the caller, build the job,
admit it, and follow its results, read as reasoning, text and tool calls; the API modules
only translate."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request

from broker.messages import Completion, Job, TokenChunk
from common.errors import NotFoundError
from gateway.auth import KeyRing
from gateway.core import GatewayCore
from gateway.harmony import HarmonyReader
from gateway.http_request import Body, read_json, tenant_of, time_left_of
from gateway.reasoning import Thought, ThoughtSplitter
from gateway.tool_calls import Piece, ToolCall, ToolCallScanner, merge_text
from gateway.validate import GenerateInput, JobBuilder

Results = AsyncGenerator[TokenChunk | Completion, None]
Part = Piece | Thought  # what to send: the answer's text, a tool call, or reasoning


class Reader(Protocol):
    """A reply read as it streams into what to send (ReplyReader; HarmonyReader for
    gpt-oss's harmony)."""

    @property
    def num_calls(self) -> int: ...

    @property
    def reasoning_tokens(self) -> int: ...

    def feed(self, text: str, num_tokens: int) -> list[Part]: ...

    def finish(self) -> list[Part]: ...


def read_whole(reader: Reader, chunks: list[TokenChunk]) -> tuple[str, str, list[ToolCall]]:
    """A reply read at once: its reasoning, its text and its calls."""
    parts = [p for ch in chunks for p in reader.feed(ch.text, len(ch.token_ids))]
    parts += reader.finish()
    thought = "".join(p.text for p in parts if isinstance(p, Thought))
    return (thought, *merge_text([p for p in parts if not isinstance(p, Thought)]))


@dataclass(frozen=True, slots=True)
class HttpContext:
    """What the HTTP endpoints share."""

    core: GatewayCore
    jobs: JobBuilder
    keys: KeyRing
    model_names: tuple[str, ...]  # the first is the id reported; any of them is accepted
    max_body_bytes: int

    @property
    def model_id(self) -> str:
        return self.model_names[0]

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            raise NotFoundError(
                f"model {name!r} is not served here (served: {', '.join(self.model_names)})"
            )

    async def body(self, request: Request) -> Body:
        return await read_json(request, self.max_body_bytes)


@dataclass(frozen=True, slots=True)
class Started:
    job: Job
    session_id: str
    created: int  # unix seconds
    results: Results
    splitter: ThoughtSplitter  # where the reply's reasoning ends
    harmony: bool = False  # the model writes harmony (gpt-oss)

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Session-Id": self.session_id, "X-Request-Id": self.job.request_id}

    def reader(self, tools: list[dict[str, Any]] | None) -> Reader:
        """The reader of the reply, for the request's tools."""
        scanner = ToolCallScanner.offering(tools)
        if self.harmony:
            return HarmonyReader(scanner.names)
        return ReplyReader(self.splitter, scanner)


async def start(ctx: HttpContext, request: Request, inp: GenerateInput) -> Started:
    """Authenticate, build and admit the job; its results are yet to be read."""
    tenant = tenant_of(request, ctx.keys)
    job = await ctx.jobs.build(inp, tenant.name, time_left_of(request))
    found = await ctx.core.session_for(tenant.name, job.session_id, job.prompt_ids)
    job = found.placed(job)
    await ctx.core.admit(job, tenant, found.holder)
    splitter = ctx.jobs.splitter(job)
    results = ctx.core.results(job)
    return Started(job, job.session_id, int(time.time()), results, splitter, ctx.jobs.harmony)


class ReplyReader:
    """A reply read as it streams: its reasoning first (the splitter), then the answer's
    text and tool calls (the scanner)."""

    def __init__(self, splitter: ThoughtSplitter, scanner: ToolCallScanner) -> None:
        self.splitter = splitter
        self.scanner = scanner

    @property
    def num_calls(self) -> int:
        return self.scanner.calls

    @property
    def reasoning_tokens(self) -> int:
        return self.splitter.span_tokens

    def feed(self, text: str, num_tokens: int) -> list[Part]:
        return self._answer(self.splitter.feed(text, num_tokens))

    def finish(self) -> list[Part]:
        return self._answer(self.splitter.finish()) + self.scanner.finish()

    def _answer(self, parts: list[Thought | str]) -> list[Part]:
        out: list[Part] = []
        for p in parts:
            out += [p] if isinstance(p, Thought) else self.scanner.feed(p)
        return out


async def scanned(
    started: Started, reader: Reader
) -> AsyncGenerator[list[Part] | Completion, None]:
    """A streamed job's results as what to send: each chunk's reasoning, text and calls,
    what the reader held back at the end, then the completion."""
    async with aclosing(started.results) as results:
        async for message in results:
            if isinstance(message, TokenChunk):
                yield reader.feed(message.text, len(message.token_ids))
            else:
                yield reader.finish()
                yield message


async def collect(started: Started) -> tuple[list[TokenChunk], Completion]:
    """Read every result of a job that is not streamed."""
    chunks: list[TokenChunk] = []
    async with aclosing(started.results) as results:
        async for message in results:
            if isinstance(message, Completion):
                return chunks, message
            chunks.append(message)
    raise AssertionError("a job's results end with its completion")
