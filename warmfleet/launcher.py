"""`Cluster`: Redis (private, or given), N worker processes and the gateway, started and stopped
in order. `warmfleet up` and the cluster tests both run the system through it."""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from warmfleet.errors import ServiceError
from warmfleet.models import resolve_model
from warmfleet.parent_watch import PARENT_ENV
from warmfleet.probes import HealthProbe, HeartbeatMark, heartbeat_is_fresh, mark_heartbeat
from warmfleet.processes import (
    Process,
    describe_exit,
    format_tail,
    free_port,
    kill,
    port_is_free,
    signal_process,
    spawn,
    wait_exit,
)
from warmfleet.redis_server import RedisServer

Progress = Callable[[str], None]
_POLL_S = 0.1
_REDIS_TIMEOUT_S = 2.0


def print_progress(message: str) -> None:
    """The default progress callback: one "warmfleet: ..." line on stderr."""
    print(f"warmfleet: {message}", file=sys.stderr, flush=True)


@dataclass(slots=True)
class _Child:
    name: str
    argv: list[str]
    grpc_target: str = ""  # gateway and kvstore: ready when its health check says SERVING
    process: Process | None = None
    mark: HeartbeatMark | None = None  # workers: the heartbeat key before this start


class Cluster:
    """The whole system on this machine. `start()` returns once every part is ready."""

    def __init__(
        self,
        num_workers: int = 2,
        port: int = 0,
        redis_url: str | None = None,
        model: str | os.PathLike[str] | None = None,
        threads_per_worker: int | None = None,
        lease_s: float | None = None,
        extra_env: Mapping[str, str] | None = None,
        log_dir: str | os.PathLike[str] | None = None,
        progress: Progress = print_progress,
        worker_args: Sequence[str] = (),
        cli_module: str = "warmfleet.cli",
        spill_dir: str | os.PathLike[str] | None = None,
        warm_budget: int | None = None,
        disk_budget: int | None = None,
        kvstore_port: int = 0,
        keys_file: str | os.PathLike[str] | None = None,
        gateway_args: Sequence[str] = (),
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be at least 1, got {num_workers}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {port}")
        self.num_workers = num_workers
        self.port = port or free_port()
        self.kvstore_port = kvstore_port or free_port()
        self.spill_dir = Path(spill_dir) if spill_dir is not None else None
        self._warm_budget = warm_budget
        self._disk_budget = disk_budget
        self._keys_file = keys_file  # the gateway's API keys (None: one local tenant)
        self.threads_per_worker = threads_per_worker or max(1, (os.cpu_count() or 1) // num_workers)
        self._given_redis_url = redis_url
        self._model = model
        self._lease_s = lease_s
        self._worker_args = tuple(worker_args)  # more `warmfleet worker` options
        self._gateway_args = tuple(gateway_args)  # more `warmfleet gateway` options
        self._env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            PARENT_ENV: str(os.getpid()),
            **(extra_env or {}),
        }
        # Kept after stop(), so a failed run can be read afterwards.
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="warmfleet-"))
        self._progress = progress
        self._cli_module = cli_module  # tests swap in stand-ins for the worker and gateway
        self._redis_server: RedisServer | None = None
        self._redis: redis.Redis | None = None
        self._workers: list[_Child] = []
        self._gateway: _Child | None = None
        self._kvstore: _Child | None = None

    @property
    def target(self) -> str:
        """Where clients connect: "127.0.0.1:PORT"."""
        return f"127.0.0.1:{self.port}"

    @property
    def kvstore_target(self) -> str:
        """Where operators reach the KVStore service: "127.0.0.1:PORT"."""
        return f"127.0.0.1:{self.kvstore_port}"

    @property
    def redis_url(self) -> str:
        """The Redis every part uses (the private server's URL once started)."""
        if self._given_redis_url is not None:
            return self._given_redis_url
        if self._redis_server is None:
            raise RuntimeError("the private Redis is not started yet")
        return self._redis_server.url

    @property
    def worker_ids(self) -> list[str]:
        return [f"w{i}" for i in range(self.num_workers)]

    @property
    def processes(self) -> dict[str, Process]:
        """Every child process started so far, by name ("redis", "kvstore", "w0", ...,
        "gateway")."""
        procs: dict[str, Process] = {}
        if self._redis_server is not None and self._redis_server.process is not None:
            procs["redis"] = self._redis_server.process
        for child in self._children():
            if child.process is not None:
                procs[child.name] = child.process
        return procs

    def _children(self) -> list[_Child]:
        return [c for c in (self._kvstore, *self._workers, self._gateway) if c is not None]

    def log_path(self, name: str) -> Path:
        """The file that holds a child's stdout and stderr ("redis", "kvstore", "w0", ...,
        "gateway")."""
        return self.log_dir / f"{name}.log"

    def start(self, deadline_s: float = 180.0) -> Cluster:
        """Start Redis (unless a URL was given), the kvstore, the workers, then the gateway;
        wait until ready.

        Ready means every worker has written a fresh heartbeat and the gateway's and the
        kvstore's health checks answer SERVING. Raises ServiceError when a child exits first
        (naming it, with the end of its log) or when `deadline_s` passes; everything started
        is stopped again then.
        """
        if self._redis is not None:
            raise RuntimeError("Cluster.start() called twice")
        deadline = time.monotonic() + deadline_s
        try:
            self._start(deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, deadline: float) -> None:
        if not port_is_free(self.port):
            raise ServiceError(f"port {self.port} is in use; choose another one (--port)")
        if not port_is_free(self.kvstore_port):
            raise ServiceError(
                f"port {self.kvstore_port} is in use; choose another one (--kvstore-port)"
            )
        model = resolve_model(
            self._model, progress=lambda m: self._progress(m.removeprefix("warmfleet: "))
        )
        self._model = model  # fetched once here, not once per worker
        if self._given_redis_url is None:
            self._redis_server = RedisServer(log_path=self.log_path("redis"))
            self._redis_server.start()
            self._progress(f"redis-server ready at {self._redis_server.url}")
        self._redis = redis.Redis.from_url(
            self.redis_url,
            socket_timeout=_REDIS_TIMEOUT_S,
            socket_connect_timeout=_REDIS_TIMEOUT_S,
            retry=Retry(NoBackoff(), 0),  # readiness polls itself; redis-py's retries take ~4 s
        )
        self._check_redis()
        self._kvstore = _Child("kvstore", self._kvstore_argv(), self.kvstore_target)
        self._progress(f"starting the kvstore on {self.kvstore_target}")
        self._spawn(self._kvstore)
        self._workers = [_Child(w, self._worker_argv(w)) for w in self.worker_ids]
        self._progress(
            f"starting {self.num_workers} worker(s) ({', '.join(self.worker_ids)}; "
            f"{self.threads_per_worker} thread(s) each) with {model.name}"
        )
        for child in self._workers:
            self._spawn(child)
        self._gateway = _Child("gateway", self._gateway_argv(), self.target)
        self._progress(f"starting the gateway on {self.target}")
        self._spawn(self._gateway)
        self._wait_ready(self._children(), deadline)

    def _check_redis(self) -> None:
        assert self._redis is not None
        try:
            self._redis.ping()
        except redis.RedisError as e:
            raise ServiceError(f"cannot reach Redis at {self.redis_url}: {e}") from e

    def _worker_argv(self, worker_id: str) -> list[str]:
        argv = [sys.executable, "-m", self._cli_module, "worker", "--redis-url", self.redis_url]
        argv += ["--worker-id", worker_id, "--threads", str(self.threads_per_worker)]
        if self._model is not None:
            argv += ["--model", str(self._model)]
        if self._lease_s is not None:
            argv += ["--lease-s", str(self._lease_s)]
        if self.spill_dir is not None:
            argv += ["--spill-dir", str(self.spill_dir)]
        if self._warm_budget is not None:
            argv += ["--warm-budget", str(self._warm_budget)]
        return argv + list(self._worker_args)

    def _kvstore_argv(self) -> list[str]:
        argv = [sys.executable, "-m", self._cli_module, "kvstore", "--redis-url", self.redis_url]
        argv += ["--port", str(self.kvstore_port)]
        if self.spill_dir is not None:
            argv += ["--spill-dir", str(self.spill_dir)]
        if self._disk_budget is not None:
            argv += ["--disk-budget", str(self._disk_budget)]
        return argv

    def _gateway_argv(self) -> list[str]:
        argv = [sys.executable, "-m", self._cli_module, "gateway", "--redis-url", self.redis_url]
        argv += ["--port", str(self.port)]
        if self._model is not None:
            argv += ["--model", str(self._model)]
        if self._keys_file is not None:
            argv += ["--keys", str(self._keys_file)]
        return argv + list(self._gateway_args)

    def _spawn(self, child: _Child, extra_args: Sequence[str] = ()) -> None:
        if not child.grpc_target:
            assert self._redis is not None
            child.mark = mark_heartbeat(self._redis, child.name)
        argv = [*child.argv, *extra_args]
        child.process = spawn(argv, self.log_path(child.name), self._env)

    def _wait_ready(self, children: list[_Child], deadline: float) -> None:
        """Poll until every child in `children` is ready; see `start()` for the errors."""
        t0 = time.monotonic()
        pending = {c.name: c for c in children}
        reasons: dict[str, str] = {}
        self._progress(f"waiting for {', '.join(pending)} (each loads the model)")
        probes = {c.name: HealthProbe(c.grpc_target) for c in children if c.grpc_target}
        try:
            while pending:
                self._raise_if_exited(pending.values())
                for name, child in list(pending.items()):
                    reason = self._not_ready_reason(child, probes.get(name))
                    if reason is None:
                        del pending[name]
                        self._progress(f"{name} ready after {time.monotonic() - t0:.1f} s")
                    else:
                        reasons[name] = reason
                if pending and time.monotonic() >= deadline:
                    raise ServiceError(self._timeout_message(pending, reasons, t0))
                if pending:
                    time.sleep(_POLL_S)
        finally:
            for probe in probes.values():
                probe.close()

    def _raise_if_exited(self, children: Iterable[_Child]) -> None:
        """Raise ServiceError if the private Redis or one of `children` has exited."""
        redis_process = self._redis_server.process if self._redis_server else None
        if redis_process is not None and (code := redis_process.poll()) is not None:
            log = format_tail(self.log_path("redis"))
            raise ServiceError(f"redis-server {describe_exit(code)}; {log}")
        for child in children:
            assert child.process is not None
            if (code := child.process.poll()) is not None:
                log = format_tail(self.log_path(child.name))
                raise ServiceError(f"{child.name} {describe_exit(code)} before it was ready; {log}")

    def _not_ready_reason(self, child: _Child, health: HealthProbe | None) -> str | None:
        if health is not None:
            return health.not_serving_reason()
        assert self._redis is not None and child.mark is not None
        try:
            fresh = heartbeat_is_fresh(self._redis, child.name, child.mark)
        except redis.RedisError as e:
            return f"redis: {e}"
        return None if fresh else "no heartbeat yet"

    def _timeout_message(
        self, pending: dict[str, _Child], reasons: dict[str, str], t0: float
    ) -> str:
        waited = ", ".join(f"{n} ({reasons.get(n, 'not checked')})" for n in pending)
        tails = "\n".join(f"{n}: {format_tail(self.log_path(n), 10)}" for n in pending)
        return f"not ready after {time.monotonic() - t0:.0f} s: {waited}\n{tails}"

    def exited(self) -> dict[str, int]:
        """The children (workers, gateway, private redis) that have exited, with exit codes."""
        return {n: code for n, p in self.processes.items() if (code := p.poll()) is not None}

    def kill(self, name: str) -> int | None:
        """SIGKILL a child ("kvstore", "w0", ...) as a crash would, and reap it; its exit
        code."""
        process = self._child(name).process
        if process is None:
            raise RuntimeError(f"{name} was never started")
        return kill(process)

    def terminate(self, name: str, timeout_s: float = 60.0) -> int | None:
        """SIGTERM a child (a worker drains, the others stop cleanly) and wait up to
        `timeout_s` for it to exit; its exit code, None if it still runs."""
        process = self._child(name).process
        if process is None:
            raise RuntimeError(f"{name} was never started")
        signal_process(process, signal.SIGTERM)
        return wait_exit(process, timeout_s)

    def restart(
        self, name: str, *, deadline_s: float | None = 120.0, extra_args: Sequence[str] = ()
    ) -> None:
        """Start a child again after it exited, with `extra_args` after its usual options
        for this start only; wait until it is ready unless `deadline_s` is None. Its log
        continues in the same file."""
        child = self._child(name)
        if child.process is not None and child.process.poll() is None:
            raise RuntimeError(f"{child.name} is still running")
        self._progress(f"restarting {child.name}")
        self._spawn(child, extra_args)
        if deadline_s is not None:
            self._wait_ready([child], time.monotonic() + deadline_s)

    def _child(self, name: str) -> _Child:
        for child in self._children():
            if child.name == name:
                return child
        raise KeyError(f"no child named {name!r}")

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop the gateway (it drains its streams first), then the workers, the kvstore, then
        the private Redis.

        Each gets SIGTERM and is SIGKILLed when its share of `timeout_s` has passed: the gateway
        may use two thirds, the workers the rest. `timeout_s=0` kills at once. Idempotent.
        """
        deadline = time.monotonic() + timeout_s
        if self._gateway is not None:
            self._terminate([self._gateway], deadline - timeout_s / 3)
        self._terminate(self._workers, deadline)
        if self._kvstore is not None:  # last: it applies the workers' final events
            self._terminate([self._kvstore], max(deadline, time.monotonic() + 2.0))
        if self._redis is not None:
            self._redis.close()
        if self._redis_server is not None:
            self._redis_server.stop(max(0.0, min(5.0, deadline - time.monotonic())))

    def _terminate(self, children: list[_Child], deadline: float) -> None:
        """SIGTERM `children`, then SIGKILL those still running at `deadline`."""
        running = [c for c in children if c.process is not None and c.process.poll() is None]
        patient = deadline > time.monotonic()
        for child in running:
            assert child.process is not None
            signal_process(child.process, signal.SIGTERM)
        for child in running:
            assert child.process is not None
            if wait_exit(child.process, deadline - time.monotonic()) is None:
                if patient:
                    self._progress(f"{child.name} did not stop in time; killing it")
                kill(child.process)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
