"""A server-sent events response that notices a client going away at once: the events run
beside a watch on the connection, and when the client disconnects the events' generator is
cancelled and closed (its job cancelled on its worker), not at the next token."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Mapping

from starlette.types import Receive, Scope, Send


def event(data: object, name: str | None = None) -> bytes:
    """One SSE event: `data: <json>` (after `event: <name>` when named)."""
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


DONE = b"data: [DONE]\n\n"


class EventStream:
    def __init__(
        self, events: AsyncGenerator[bytes, None], headers: Mapping[str, str] | None = None
    ) -> None:
        self.events = events
        self.headers = {"cache-control": "no-cache", **(headers or {})}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", b"text/event-stream; charset=utf-8")]
        headers += [(k.lower().encode(), v.encode()) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watch):
                task.cancel()
            await asyncio.gather(pump, watch, return_exceptions=True)
            await self.events.aclose()  # runs its finally: the job is cancelled if unfinished
        if pump.done() and not pump.cancelled() and pump.exception() is None:
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _pump(self, send: Send) -> None:
        async for chunk in self.events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})


async def _disconnected(receive: Receive) -> None:
    """Return when the client has gone away."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
