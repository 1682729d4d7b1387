"""Which workers take requests, watched from a thread: the gateway's health follows it, and
a request that finds no worker waits on it for one to come."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import redis

from broker.gateway_broker import GatewayBroker

log = logging.getLogger("warmfleet.gateway")


class WorkerWatch:
    def __init__(
        self,
        broker: GatewayBroker,
        on_change: Callable[[bool], None],
        interval_s: float = 0.25,
    ) -> None:
        self.broker = broker
        self.on_change = on_change  # called with True when a worker takes requests again
        self.interval_s = interval_s
        self.live: list[str] = []
        self._serving: bool | None = None
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="worker-watch", daemon=True)

    def start(self) -> WorkerWatch:
        self.poll()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval_s + 5.0)

    def wait_for_worker(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` until some worker takes requests; whether one does."""
        with self._cond:
            return self._cond.wait_for(lambda: bool(self.live), timeout=max(0.0, timeout_s))

    def poll(self) -> None:
        """Read the live workers once (Redis unreachable: none)."""
        try:
            live = self.broker.live_workers()
        except redis.RedisError as e:
            if self._serving is not False:
                log.warning("cannot read the workers' state: %s", e)
            live = []
        with self._cond:
            self.live = live
            if live:
                self._cond.notify_all()
        serving = bool(live)
        if serving != self._serving:
            log.info(
                "%s", f"serving: worker(s) {', '.join(live)} take requests" if serving
                else "not serving: no worker takes requests",
            )  # fmt: skip
            self._serving = serving
            self.on_change(serving)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.poll()
