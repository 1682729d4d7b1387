"""The launcher's supervision without processes: the restart back-off, and what the
supervisor does when a stand-in cluster reports exits (on a clock the test moves)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from common.errors import ServiceError
from warmfleet.supervisor import RestartBackoff, Supervisor


def test_the_back_off_doubles_to_its_cap_and_starts_over_after_a_steady_run() -> None:
    policy = RestartBackoff(first_s=0.5, cap_s=30.0, steady_s=60.0)
    quick = [policy.delay_s(uptime_s=1.0) for _ in range(9)]
    assert quick == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert policy.delay_s(uptime_s=59.9) == 30.0  # not quite a minute: still backing off
    assert policy.delay_s(uptime_s=60.0) == 0.5  # a minute up: a fresh start
    assert policy.delay_s(uptime_s=0.1) == 1.0


@dataclass
class FakeCluster:
    """Exits are set by the test; `restart` gives the child a new pid."""

    worker_ids: list[str] = field(default_factory=lambda: ["w0", "w1"])
    codes: dict[str, int] = field(default_factory=dict)  # children that exited
    pids: dict[str, int] = field(default_factory=lambda: {"w0": 10, "w1": 11, "kvstore": 12})
    forgotten: list[str] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    refuse: bool = False

    @property
    def processes(self) -> dict[str, Any]:
        return {name: SimpleNamespace(pid=pid) for name, pid in self.pids.items()}

    def exited(self) -> dict[str, int]:
        return dict(self.codes)

    def restart(self, name: str, *, deadline_s: float | None) -> None:
        assert deadline_s is None  # never waits: the loop keeps supervising the others
        if self.refuse:
            raise ServiceError("cannot start")
        del self.codes[name]
        self.pids[name] += 100
        self.restarted.append(name)

    def forget_heartbeat(self, worker_id: str) -> None:
        self.forgotten.append(worker_id)

    def log_path(self, name: str) -> Path:
        return Path("/nonexistent") / f"{name}.log"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup() -> tuple[FakeCluster, Clock, list[str], Supervisor]:
    cluster, clock, reports = FakeCluster(), Clock(), list[str]()
    return cluster, clock, reports, Supervisor(cluster, reports.append, clock=clock)


def test_a_dead_worker_loses_its_heartbeat_at_once_and_restarts_after_its_back_off(
    setup: tuple[FakeCluster, Clock, list[str], Supervisor],
) -> None:
    cluster, clock, reports, supervisor = setup
    clock.now += 10
    cluster.codes["w0"] = -9
    assert supervisor.poll() is None
    assert cluster.forgotten == ["w0"] and cluster.restarted == []
    assert reports[0].startswith(
        "w0 was killed by SIGKILL after 10.0 s; starting it again in 0.5 s (restart 1); "
    )
    clock.now += 0.4
    supervisor.poll()
    assert cluster.restarted == [] and cluster.forgotten == ["w0"]  # noted once
    clock.now += 0.1
    supervisor.poll()
    assert cluster.restarted == ["w0"] and supervisor.restarts == {"w0": 1}
    assert reports[-1] == "w0 started again (pid 110)"
    clock.now += 2  # it dies again soon: twice the wait
    cluster.codes["w0"] = 1
    supervisor.poll()
    assert cluster.forgotten == ["w0", "w0"]
    again = "w0 exited with code 1 after 2.0 s; starting it again in 1.0 s (restart 2)"
    assert reports[-1].startswith(again)
    clock.now += 1.0
    supervisor.poll()
    assert cluster.restarted == ["w0", "w0"]


def test_a_clean_exit_is_restarted_too_and_only_workers_have_heartbeats(
    setup: tuple[FakeCluster, Clock, list[str], Supervisor],
) -> None:
    cluster, clock, reports, supervisor = setup
    cluster.codes.update({"w1": 0, "kvstore": -11})  # a drained worker; a crashed kvstore
    supervisor.poll()
    assert cluster.forgotten == ["w1"]
    assert reports[1] == "w1 exited with code 0 after 0.0 s; starting it again in 0.5 s (restart 1)"
    assert reports[0].startswith("kvstore was killed by SIGSEGV")
    clock.now += 0.5
    supervisor.poll()
    assert cluster.restarted == ["kvstore", "w1"] and cluster.codes == {}


def test_a_failed_start_is_retried_after_a_longer_wait_and_redis_ends_it(
    setup: tuple[FakeCluster, Clock, list[str], Supervisor],
) -> None:
    cluster, clock, reports, supervisor = setup
    cluster.codes["w1"] = 1
    cluster.refuse = True
    supervisor.poll()
    clock.now += 0.5
    supervisor.poll()
    assert reports[-1] == "could not start w1 again: cannot start"
    supervisor.poll()  # seen as exited again: a longer wait
    assert "starting it again in 1.0 s (restart 1)" in reports[-1]
    cluster.refuse = False
    clock.now += 1.0
    supervisor.poll()
    assert cluster.restarted == ["w1"] and supervisor.restarts == {"w1": 1}
    cluster.codes["redis"] = -9
    reason = supervisor.poll()
    assert reason is not None and reason.startswith("redis-server was killed by SIGKILL")
