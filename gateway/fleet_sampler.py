"""The gateway's look at the fleet, once a second on its event loop: the latest snapshot
(broker/fleet.py) for `/metrics` and the dashboard, the per-second rates, ten minutes of
chart points, and each open dashboard's queue of updates. It also adds the responses this
gateway answered to the fleet-wide counts in Redis."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter as Tally
from collections import deque
from collections.abc import Iterator
from typing import Any

import redis
import redis.asyncio as aioredis

from broker import fleet, keys
from gateway.metrics import GatewayMetrics

log = logging.getLogger("warmfleet.gateway")
INTERVAL_S = 1.0
HISTORY_POINTS = 600  # ten minutes at one a second
SUBSCRIBER_BACKLOG = 5  # updates kept for a slow dashboard; older ones are dropped
Update = dict[str, Any]
END: Update = {}  # what a dashboard's stream is sent when the gateway stops


def is_error(code: str) -> bool:
    """Whether a response status ("grpc OK", "http 429"...) is an error."""
    api, _, status = code.partition(" ")
    return status != "OK" if api == "grpc" else not status.isdigit() or int(status) >= 400


class FleetSampler:
    def __init__(
        self, r: aioredis.Redis, metrics: GatewayMetrics, interval_s: float = INTERVAL_S
    ) -> None:
        self.r = r
        self.metrics = metrics
        self.interval_s = interval_s
        self.latest: fleet.Snapshot | None = None
        self.rates: dict[str, Any] | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=HISTORY_POINTS)
        self._subscribers: set[asyncio.Queue[Update]] = set()
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="fleet-sampler")

    async def stop(self) -> None:
        """Stop sampling, and end every dashboard's stream (a server that stops waits for
        its open responses)."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for queue in self._subscribers:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(END)

    @contextlib.contextmanager
    def subscription(self) -> Iterator[asyncio.Queue[Update]]:
        """A queue that receives every update from now on (the newest SUBSCRIBER_BACKLOG
        when the reader falls behind)."""
        queue: asyncio.Queue[Update] = asyncio.Queue(maxsize=SUBSCRIBER_BACKLOG)
        self._subscribers.add(queue)
        try:
            yield queue
        finally:
            self._subscribers.discard(queue)

    def first_update(self) -> Update:
        """What a dashboard that just opened is sent: the latest update and the history."""
        return {**self._update(), "history": list(self.history)}

    async def sample(self) -> None:
        """Read the fleet once (raises redis.RedisError)."""
        unflushed, self.metrics.unflushed = self.metrics.unflushed, Tally()
        try:
            if unflushed:
                pipe = self.r.pipeline(transaction=False)
                for code, n in unflushed.items():
                    pipe.hincrby(keys.STATS, fleet.RESPONSE_PREFIX + code, n)
                await pipe.execute()
        except redis.RedisError:
            self.metrics.unflushed.update(unflushed)  # added at the next try
            raise
        snap = await fleet.read(self.r)
        if self.latest is not None:
            self.rates = fleet.rates(self.latest, snap)
        self.latest = snap
        self.history.append(self._point())
        update = self._update()
        for queue in self._subscribers:
            if queue.full():
                queue.get_nowait()
            queue.put_nowait(update)

    def _point(self) -> dict[str, Any]:
        assert self.latest is not None
        rates = self.rates or {}
        errors = {c: x for c, x in rates.get("responses_per_s", {}).items() if is_error(c)}
        return {
            "time": self.latest["time"],
            "tokens_per_s": rates.get("tokens_per_s", 0.0),
            "waiting": self.latest["queues"]["waiting"],
            "errors_per_s": errors,
        }

    def _update(self) -> Update:
        return {
            "snapshot": self.latest,
            "rates": self.rates,
            "point": self.history[-1] if self.history else None,
        }

    async def _run(self) -> None:
        while True:
            try:
                await self.sample()
                if self._failing:
                    log.info("fleet view restored")
                self._failing = False
            except redis.RedisError as e:
                if not self._failing:
                    log.warning("cannot read the fleet for the dashboard and /metrics: %s", e)
                self._failing = True
            await asyncio.sleep(self.interval_s)
