"""Which workers take requests, read every quarter second on the gateway's event loop: the
gateway's health follows it, and a request that finds no worker waits on it for one."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import redis

from broker.gateway_broker import GatewayBroker

log = logging.getLogger("warmfleet.gateway")


class WorkerWatch:
    def __init__(
        self,
        broker: GatewayBroker,
        on_change: Callable[[bool], Any] = lambda serving: None,
        interval_s: float = 0.25,
    ) -> None:
        self.broker = broker
        self.on_change = on_change  # called with True when a worker takes requests again
        self.interval_s = interval_s
        self.live: list[str] = []
        self._serving: bool | None = None
        self._live_event = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> WorkerWatch:
        await self.poll()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="worker-watch")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def wait_for_worker(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` until some worker takes requests; whether one does."""
        try:
            await asyncio.wait_for(self._live_event.wait(), timeout=max(0.0, timeout_s))
        except TimeoutError:
            return False
        return True

    async def poll(self) -> None:
        """Read the live workers once (Redis unreachable: none)."""
        try:
            live = await self.broker.live_workers()
        except redis.RedisError as e:
            if self._serving is not False:
                log.warning("cannot read the workers' state: %s", e)
            live = []
        self.live = live
        if live:
            self._live_event.set()
        else:
            self._live_event.clear()
        serving = bool(live)
        if serving != self._serving:
            log.info(
                "%s", f"serving: worker(s) {', '.join(live)} take requests" if serving
                else "not serving: no worker takes requests",
            )  # fmt: skip
            self._serving = serving
            self.on_change(serving)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            await self.poll()
