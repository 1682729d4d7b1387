"""Keeping the parts `warmfleet up` started running: a worker, the kvstore or the gateway
that exits is started again after a back-off, and each exit is reported with its reason.

A worker's heartbeat is deleted the moment its exit is seen, so the live workers adopt its
requests at once rather than when the key's TTL lapses. Every exit is restarted, a clean one
(exit 0: a worker an operator drained) included: `up` has no other way to bring a part
back, so a drained worker comes back fresh, its KV pool empty (docs/faults.md says why).
Only the private Redis is not restarted: its exit ends `up`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import redis

from common.backoff import Backoff
from common.errors import ServiceError
from warmfleet.processes import Process, describe_exit, format_tail

REDIS = "redis"  # the one child whose exit is not repaired


class Supervised(Protocol):
    """What the supervisor needs of a `Cluster`."""

    @property
    def worker_ids(self) -> list[str]: ...

    @property
    def processes(self) -> dict[str, Process]: ...

    def exited(self) -> dict[str, int]: ...

    def restart(self, name: str, *, deadline_s: float | None) -> None: ...

    def forget_heartbeat(self, worker_id: str) -> None: ...

    def log_path(self, name: str) -> Path: ...


@dataclass
class RestartBackoff:
    """How long a child that exited waits before it starts again: `first_s` after its first
    exit, doubling with each exit up to `cap_s`; a child that had run `steady_s` or longer
    before it exited starts over at `first_s`."""

    first_s: float = 0.5
    cap_s: float = 30.0
    steady_s: float = 60.0
    _backoff: Backoff = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._backoff = Backoff(self.first_s, self.cap_s)

    def delay_s(self, uptime_s: float) -> float:
        """The wait before the next start of a child that exited after running `uptime_s`."""
        if uptime_s >= self.steady_s:
            self._backoff.reset()
        return self._backoff.next_s()


class Supervisor:
    """Call `poll()` often (every 0.1 s) from the thread that started the cluster: the
    kernel stops a child when the thread that spawned it ends. Stop polling before stopping
    the cluster, so nothing it stops is started again."""

    def __init__(
        self,
        cluster: Supervised,
        report: Callable[[str], None],
        policy: Callable[[], RestartBackoff] = RestartBackoff,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cluster = cluster
        self.restarts: dict[str, int] = {}  # starts again so far, by child
        self._report = report
        self._policy = policy
        self._clock = clock
        self._since = clock()  # children not restarted yet run since the supervisor began
        self._started: dict[str, float] = {}
        self._due: dict[str, float] = {}  # children waiting out their back-off: when to start
        self._backoffs: dict[str, RestartBackoff] = {}

    def poll(self) -> str | None:
        """Note the children that exited and start those whose back-off is over. Returns why
        serving cannot go on (the private Redis exited), else None."""
        now = self._clock()
        exited = self.cluster.exited()
        if REDIS in exited:  # first: a part that exits because Redis died is not restarted
            log = format_tail(self.cluster.log_path(REDIS), 10)
            return f"redis-server {describe_exit(exited[REDIS])}; {log}"
        for name, code in sorted(exited.items()):
            if name not in self._due:
                self._exited(name, code, now)
        for name, due in sorted(self._due.items()):
            if now >= due:
                self._start(name, now)
        return None

    def _exited(self, name: str, code: int, now: float) -> None:
        if name in self.cluster.worker_ids:
            try:
                self.cluster.forget_heartbeat(name)
            except redis.RedisError as e:  # its TTL ends it instead
                self._report(f"could not delete {name}'s heartbeat: {e}")
        uptime_s = now - self._started.get(name, self._since)
        delay_s = self._backoffs.setdefault(name, self._policy()).delay_s(uptime_s)
        self._due[name] = now + delay_s
        count = self.restarts.get(name, 0) + 1
        tail = "" if code == 0 else f"; {format_tail(self.cluster.log_path(name), 10)}"
        self._report(
            f"{name} {describe_exit(code)} after {uptime_s:.1f} s; starting it again in "
            f"{delay_s:.1f} s (restart {count}){tail}"
        )

    def _start(self, name: str, now: float) -> None:
        del self._due[name]
        self._started[name] = now
        try:
            self.cluster.restart(name, deadline_s=None)
        except (OSError, ServiceError, redis.RedisError) as e:  # retried after its back-off
            self._report(f"could not start {name} again: {e}")
            return
        self.restarts[name] = self.restarts.get(name, 0) + 1
        self._report(f"{name} started again (pid {self.cluster.processes[name].pid})")
