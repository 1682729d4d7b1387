"""What every HTTP endpoint that generates does: read the body and the caller, build the job,
admit it, and follow its results; the API modules only translate."""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

from starlette.requests import Request

from broker.messages import Completion, Job, TokenChunk
from common.errors import NotFoundError
from gateway.auth import KeyRing
from gateway.core import GatewayCore
from gateway.http_request import Body, read_json, tenant_of, time_left_of
from gateway.tool_calls import Piece, ToolCallScanner
from gateway.validate import GenerateInput, JobBuilder

Results = AsyncGenerator[TokenChunk | Completion, None]


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

    @property
    def headers(self) -> dict[str, str]:
        return {"X-Session-Id": self.session_id, "X-Request-Id": self.job.request_id}


async def start(ctx: HttpContext, request: Request, inp: GenerateInput) -> Started:
    """Authenticate, build and admit the job; its results are yet to be read."""
    tenant = tenant_of(request, ctx.keys)
    job = await ctx.jobs.build(inp, tenant.name, time_left_of(request))
    await ctx.core.admit(job, tenant)
    return Started(job, inp.session_id, int(time.time()), ctx.core.results(job))


async def scanned(
    started: Started, scanner: ToolCallScanner
) -> AsyncGenerator[list[Piece] | Completion, None]:
    """A streamed job's results as what to send: each chunk's text and calls, what the
    scanner held back at the end, then the completion."""
    async with aclosing(started.results) as results:
        async for message in results:
            if isinstance(message, TokenChunk):
                yield scanner.feed(message.text)
            else:
                yield scanner.finish()
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
