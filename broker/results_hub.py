"""Jobs' results for a gateway, read for all its open streams by one reader task: one XREAD
over every open out stream (plus a wake stream, so that a stream opened while the reader
waits joins at once). A thousand open streams cost one Redis connection, not a thousand,
and no thread."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis

from broker import codec, keys
from broker.messages import Completion, JobError, TokenChunk
from common.backoff import Backoff
from common.errors import ProtocolError

log = logging.getLogger("warmfleet.gateway")
Result = TokenChunk | Completion | JobError
WAKE_MAXLEN = 16
WAKE_DELETE_S = 1.0  # a stopping gateway waits this long at most for Redis to delete it


@dataclass(slots=True)
class Subscription:
    """One job's results as they arrive; a Redis error or an unreadable message arrives as
    the exception."""

    request_id: str
    queue: asyncio.Queue[Result | Exception] = field(default_factory=asyncio.Queue)
    last_id: str = "0"


class ResultsHub:
    def __init__(self, r: aioredis.Redis, block_ms: int = 1000) -> None:
        self.r = r
        self.block_ms = block_ms
        self.wake = keys.hub_wake(uuid.uuid4().hex)
        self._subs: dict[str, Subscription] = {}  # by out stream
        self._wake_id = "0"
        self._has_subs = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self, request_id: str) -> Subscription:
        """Start receiving a job's results (from its first one, whenever it was written)."""
        sub = Subscription(request_id)
        self._subs[keys.out_stream(request_id)] = sub
        self._has_subs.set()
        await self.r.xadd(self.wake, {"w": "1"}, maxlen=WAKE_MAXLEN, approximate=True)
        return sub

    def close(self, request_id: str) -> None:
        self._subs.pop(keys.out_stream(request_id), None)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="results-hub")

    async def stop(self) -> None:
        """Stop reading, and delete the wake stream if Redis still answers: a gateway
        stopping because Redis is gone must not fail on its way out."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        try:
            await asyncio.wait_for(self.r.delete(self.wake), WAKE_DELETE_S)
        except (redis.RedisError, TimeoutError) as e:
            log.info("results reader: wake stream %s left in Redis: %s", self.wake, e or "timeout")

    async def _run(self) -> None:
        backoff = Backoff()
        while True:
            if not self._subs:
                self._has_subs.clear()
                await self._has_subs.wait()
            streams = {name: sub.last_id for name, sub in self._subs.items()}
            streams[self.wake] = self._wake_id
            try:
                reply = await self.r.xread(streams, block=self.block_ms, count=256)
            except redis.RedisError as e:
                self._fail_all(e)
                await asyncio.sleep(backoff.next_s())
                continue
            backoff.reset()
            for name, entries in reply or []:
                self._deliver(name, entries)

    def _deliver(self, name: str, entries: list[tuple[str, dict[str, str]]]) -> None:
        if name == self.wake:
            self._wake_id = entries[-1][0]
            return
        sub = self._subs.get(name)
        if sub is None:  # closed meanwhile
            return
        for entry_id, entry in entries:
            sub.last_id = entry_id
            try:
                sub.queue.put_nowait(codec.decode_fields(entry, TokenChunk, Completion, JobError))
            except ProtocolError as e:
                sub.queue.put_nowait(e)

    def _fail_all(self, error: Exception) -> None:
        """Redis failed: every open stream ends (its client hears UNAVAILABLE at once)."""
        if self._subs:
            log.warning("results reader: %s; %d open stream(s) end", error, len(self._subs))
        for sub in self._subs.values():
            sub.queue.put_nowait(error)
        self._subs.clear()
