"""The worker's heartbeat and leases, kept fresh from a thread of their own.

A step can take seconds (a long prefill, a busy machine, the first call of a kernel); if
the heartbeat waited for the loop, a live worker would look dead, another worker would take
over its requests, and both would run them. The thread beats whatever the loop is doing, as
long as the loop makes progress: if no pass completes for `stall_s`, it stops, so a worker
that hangs is taken over like one that died. The heartbeat's TTL is short (a few beats), so
a dead worker is noticed within about a second; the leases, renewed every lease/4, are the
backstop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

import redis

from broker.worker_broker import Delivery, LostState, WorkerBroker

log = logging.getLogger("warmfleet.worker")


class Liveness:
    def __init__(
        self,
        broker: WorkerBroker,
        lease_s: float,
        interval_s: float,
        stall_s: float,
        heartbeat_ttl_s: float,
    ) -> None:
        self.broker = broker
        self.lease_s = lease_s
        self.heartbeat_ttl_s = heartbeat_ttl_s
        self.interval_s = interval_s
        self.stall_s = stall_s
        self.kvstore_alive = False  # the kvstore's heartbeat was seen at the last beat
        self.lost = threading.Event()  # Redis lost this worker's registration or groups
        self._status = "{}"
        self._deliveries: tuple[Delivery, ...] = ()
        self._last_pass = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self._beat_ok_at = time.monotonic()  # when a beat last reached Redis

    def update(self, status_json: str, deliveries: Iterable[Delivery]) -> None:
        """The loop, once per pass: what the heartbeat says, the entries whose leases to
        keep, and proof that it makes progress."""
        self._status = status_json
        self._deliveries = tuple(deliveries)
        self._last_pass = time.monotonic()

    @property
    def lapsed(self) -> bool:
        """The beats have failed for longer than the heartbeat's TTL: the other workers now
        take this one for dead and adopt its requests, so a drain has nothing left to do."""
        return self._failing and time.monotonic() - self._beat_ok_at > self.heartbeat_ttl_s

    def start(self, status_json: str) -> None:
        """Beat once now (so kvstore_alive is known before the first request), then from
        the thread."""
        self.update(status_json, ())
        self._beat(())
        self._thread = threading.Thread(target=self._run, name="liveness", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5.0)

    def _run(self) -> None:
        next_renew = 0.0
        stalled = False
        while not self._stop.wait(self.interval_s):
            now = time.monotonic()
            if now - self._last_pass > self.stall_s:
                if not stalled:
                    log.error(
                        "no pass of the loop for %.0f s: heartbeat and leases stop, so other "
                        "workers take its requests over", now - self._last_pass
                    )  # fmt: skip
                stalled = True
                continue
            stalled = False
            renew = self._deliveries if now >= next_renew else ()
            if renew:
                next_renew = now + self.lease_s / 4
            self._beat(renew)

    def _beat(self, renew: tuple[Delivery, ...]) -> None:
        try:
            beat = self.broker.beat(self._status, self.heartbeat_ttl_s, renew)
        except LostState:
            self.lost.set()
            return
        except redis.RedisError as e:
            if not self._failing:
                log.warning("heartbeat failed: %s (retrying every %.1f s)", e, self.interval_s)
            self._failing = True
            return
        if self._failing:
            log.info("heartbeat restored")
        self._failing = False
        self._beat_ok_at = time.monotonic()
        self.kvstore_alive = beat.kvstore_alive
        if beat.rejoined:
            self.lost.set()
