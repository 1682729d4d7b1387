"""The system as `warmfleet up` runs it, for the chaos and soak scripts: `Cluster` with its
children restarted by `warmfleet/supervisor.py`, polled every 0.1 s from the main thread
(the one that spawned them). Besides: a Redis this script can kill and restart (append-only
file on, so a restart on the same directory keeps the state and one on a new directory
loses it), and the spill directory on a small tmpfs that can be filled."""

from __future__ import annotations

import asyncio
import errno
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.processes import Process, kill
from warmfleet.redis_server import RedisServer
from warmfleet.supervisor import Supervisor

POLL_S = 0.1  # as `up` polls its children
FILLER = "chaos-filler.bin"  # no spill file's name: the kvstore's sweep leaves it alone
_MIB = 1 << 20
T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f}s] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class FleetOptions:
    model: Path
    workers: int = 2
    own_redis: bool = False  # a Redis this script restarts (else `up`'s private one)
    spill_tmpfs_mib: int = 0  # the spill directory on a tmpfs this big (0: a plain folder)
    warm_budget: int | None = None
    disk_budget: int | None = None
    keys_file: Path | None = None
    lease_s: float | None = None


class Fleet:
    """Start with `start()`, run `supervise()` as a task of the main thread's loop, `stop()`."""

    def __init__(self, options: FleetOptions) -> None:
        self.options = options
        self.work = Path(tempfile.mkdtemp(prefix="warmfleet-bench-"))
        self.spill_dir = self.work / "spill"
        self.tmpfs = False
        self.redis: RedisServer | None = None
        self.events: list[tuple[float, str]] = []  # what the supervisor reported, and when
        self.cluster: Cluster | None = None
        self.supervisor: Supervisor | None = None

    def start(self) -> Cluster:
        o = self.options
        self.spill_dir.mkdir()
        if o.spill_tmpfs_mib:
            self.tmpfs = _mount_tmpfs(self.spill_dir, o.spill_tmpfs_mib)
            on = f"a {o.spill_tmpfs_mib} MiB tmpfs" if self.tmpfs else "a folder (no tmpfs)"
            log(f"spill directory {self.spill_dir}: {on}")
        if o.own_redis:
            self.redis = self._redis(port=0, fresh=True)
        config = ClusterConfig(
            num_workers=o.workers, model=o.model, spill_dir=self.spill_dir,
            redis_url=self.redis.url if self.redis else None, warm_budget=o.warm_budget,
            disk_budget=o.disk_budget, keys_file=o.keys_file, lease_s=o.lease_s,
            log_dir=self.work / "logs", progress=lambda m: log(f"warmfleet: {m}"),
        )  # fmt: skip
        self.cluster = Cluster(config).start()
        self.supervisor = Supervisor(self.cluster, self._report)
        log(f"cluster up: gRPC {self.cluster.target}, HTTP {self.cluster.http_url}, "
            f"logs {self.cluster.log_dir}")  # fmt: skip
        return self.cluster

    def _report(self, message: str) -> None:
        self.events.append((time.monotonic(), message))
        log(f"supervisor: {message.splitlines()[0]}")

    async def supervise(self, stop: asyncio.Event) -> None:
        """Poll the supervisor until `stop` is set, as `up` does."""
        assert self.supervisor is not None
        while not stop.is_set():
            if (reason := self.supervisor.poll()) is not None:
                raise RuntimeError(f"cannot serve any more: {reason}")
            await asyncio.sleep(POLL_S)

    def processes(self) -> dict[str, Process]:
        """Every running part by name: redis, kvstore, w0.., gateway."""
        assert self.cluster is not None
        procs = dict(self.cluster.processes)
        if self.redis is not None and self.redis.process is not None:
            procs["redis"] = self.redis.process
        return procs

    def _redis(self, port: int, fresh: bool) -> RedisServer:
        data = self.work / "redis-data"
        if fresh:
            shutil.rmtree(data, ignore_errors=True)
        data.mkdir(exist_ok=True)
        args = ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(data)]
        return RedisServer(port=port, log_path=self.work / "redis.log", extra_args=args).start()

    def restart_redis(self, keep_state: bool) -> None:
        """SIGKILL Redis and start it again on its port: from its append-only file, or empty."""
        assert self.redis is not None and self.redis.process is not None
        kill(self.redis.process)
        self.redis.stop(timeout_s=0)  # its private folder; the data folder is ours
        self.redis = self._redis(self.redis.port, fresh=not keep_state)

    def fill_disk(self) -> int:
        """Fill the spill directory's file system; the bytes the filler took."""
        written = 0
        chunk = b"\0" * _MIB
        with (self.spill_dir / FILLER).open("wb") as f:
            try:
                while True:
                    f.write(chunk)
                    f.flush()
                    written += len(chunk)
            except OSError as e:
                if e.errno not in (errno.ENOSPC, errno.EFBIG):
                    raise
        return written

    def free_disk(self) -> None:
        (self.spill_dir / FILLER).unlink(missing_ok=True)

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
        if self.redis is not None:
            self.redis.stop()
        if self.tmpfs:
            subprocess.run(["umount", "-l", str(self.spill_dir)], check=False)
        log(f"stopped; logs kept in {self.work / 'logs'}")


def _mount_tmpfs(path: Path, size_mib: int) -> bool:
    argv = ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(path)]
    return subprocess.run(argv, capture_output=True, check=False).returncode == 0
