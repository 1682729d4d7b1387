"""`Cluster`: Redis (private, or given), the kvstore, N worker processes and the gateway,
started and stopped in order. `warmfleet up` and the cluster tests both run the system
through it, from one ClusterConfig."""

from __future__ import annotations

import dataclasses
import os
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from broker.keys import heartbeat_key
from common.errors import ServiceError
from warmfleet.cluster_config import ClusterConfig
from warmfleet.models import resolve_model
from warmfleet.parent_watch import PARENT_ENV
from warmfleet.probes import mark_heartbeat
from warmfleet.processes import (
    Process,
    free_port,
    kill,
    port_is_free,
    signal_process,
    spawn,
    terminate_all,
    wait_exit,
)
from warmfleet.readiness import Child, wait_ready
from warmfleet.redis_server import RedisServer

_REDIS_TIMEOUT_S = 2.0
STOP_NOW_AFTER_S = 1.0  # without Redis: a part still running this long gets a second signal


class Cluster:
    """The whole system on this machine. `start()` returns once every part is ready."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.port = config.port or free_port()
        self.http_port = config.http_port or free_port()
        self.kvstore_port = config.kvstore_port or free_port()
        # where each worker and the kvstore serve Prometheus metrics (the gateway: /metrics)
        self.metrics_ports = {name: free_port() for name in ["kvstore", *self.worker_ids]}
        self.spill_dir = Path(config.spill_dir) if config.spill_dir is not None else None
        self._env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            PARENT_ENV: str(os.getpid()),
            **config.extra_env,
        }
        # Kept after stop(), so a failed run can be read afterwards.
        log_dir = config.log_dir
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="warmfleet-"))
        self._progress = config.progress
        self._redis_server: RedisServer | None = None
        self._redis: redis.Redis | None = None
        self._workers: list[Child] = []
        self._should_stop: Callable[[], bool] = lambda: False
        self._gateway: Child | None = None
        self._kvstore: Child | None = None

    @property
    def num_workers(self) -> int:
        return self.config.num_workers

    @property
    def threads_per_worker(self) -> int:
        return self.config.threads

    @property
    def target(self) -> str:
        """Where clients connect: "127.0.0.1:PORT"."""
        return f"127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        """Where HTTP clients connect: "http://127.0.0.1:PORT" (the APIs are under /v1)."""
        return f"http://127.0.0.1:{self.http_port}"

    def metrics_url(self, name: str) -> str:
        """Where a part serves Prometheus metrics ("gateway", "kvstore", "w0", ...)."""
        if name == "gateway":
            return f"{self.http_url}/metrics"
        return f"http://127.0.0.1:{self.metrics_ports[name]}/metrics"

    @property
    def kvstore_target(self) -> str:
        """Where operators reach the KVStore service: "127.0.0.1:PORT"."""
        return f"127.0.0.1:{self.kvstore_port}"

    @property
    def redis_url(self) -> str:
        """The Redis every part uses (the private server's URL once started)."""
        if self.config.redis_url is not None:
            return self.config.redis_url
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

    def _children(self) -> list[Child]:
        return [c for c in (self._kvstore, *self._workers, self._gateway) if c is not None]

    def log_path(self, name: str) -> Path:
        """The file that holds a child's stdout and stderr ("redis", "kvstore", "w0", ...,
        "gateway")."""
        return self.log_dir / f"{name}.log"

    def start(
        self, deadline_s: float = 180.0, should_stop: Callable[[], bool] = lambda: False
    ) -> Cluster:
        """Start Redis (unless a URL was given), the kvstore, the workers, then the gateway;
        wait until ready.

        Ready means every worker has written a fresh heartbeat and the gateway's and the
        kvstore's health checks answer SERVING. Raises ServiceError when a child exits first
        (naming it, with the end of its log) or when `deadline_s` passes; everything started
        is stopped again then.
        """
        self._should_stop = should_stop  # polled while waiting: a stop request ends the wait
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
        for port, option in ((self.port, "--port"), (self.http_port, "--http-port"),
                             (self.kvstore_port, "--kvstore-port")):  # fmt: skip
            if not port_is_free(port):
                raise ServiceError(f"port {port} is in use; choose another one ({option})")
        model = resolve_model(
            self.config.model, progress=lambda m: self._progress(m.removeprefix("warmfleet: "))
        )
        self.config = dataclasses.replace(self.config, model=model)  # fetched once, here
        if self.config.redis_url is None:
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
        c, url = self.config, self.redis_url
        self._kvstore = Child(
            "kvstore",
            c.kvstore_argv(self.kvstore_port, url, self.metrics_ports["kvstore"]),
            self.kvstore_target,
        )
        self._progress(f"starting the kvstore on {self.kvstore_target}")
        self._spawn(self._kvstore)
        self._workers = [
            Child(w, c.worker_argv(w, url, self.metrics_ports[w])) for w in self.worker_ids
        ]
        self._progress(
            f"starting {self.num_workers} worker(s) ({', '.join(self.worker_ids)}; "
            f"{self.threads_per_worker} thread(s) each) with {model.name}"
        )
        for child in self._workers:
            self._spawn(child)
        gateway_argv = c.gateway_argv(self.port, self.http_port, url)
        self._gateway = Child("gateway", gateway_argv, self.target)
        self._progress(f"starting the gateway on {self.target}")
        self._spawn(self._gateway)
        self._wait_ready(self._children(), deadline)

    def _wait_ready(self, children: list[Child], deadline: float) -> None:
        assert self._redis is not None
        server = self._redis_server.process if self._redis_server else None
        wait_ready(children, deadline, self._redis, self.log_path, self._progress, server,
                   self._should_stop)  # fmt: skip

    def _check_redis(self) -> None:
        assert self._redis is not None
        try:
            self._redis.ping()
        except redis.RedisError as e:
            raise ServiceError(f"cannot reach Redis at {self.redis_url}: {e}") from e

    def _spawn(self, child: Child, extra_args: Sequence[str] = ()) -> None:
        if not child.grpc_target:
            assert self._redis is not None
            child.mark = mark_heartbeat(self._redis, child.name)
        argv = [*child.argv, *extra_args]
        child.process = spawn(argv, self.log_path(child.name), self._env)

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

    def forget_heartbeat(self, worker_id: str) -> None:
        """Delete the heartbeat of a worker seen to exit, so live workers adopt its requests
        now rather than when the key's TTL lapses."""
        assert self._redis is not None
        self._redis.delete(heartbeat_key(worker_id))

    def _child(self, name: str) -> Child:
        for child in self._children():
            if child.name == name:
                return child
        raise KeyError(f"no child named {name!r}")

    def stop(self, timeout_s: float = 15.0, *, drain: bool = True) -> None:
        """Stop the gateway (it drains its streams first), then the workers, the kvstore, then
        the private Redis.

        Each gets SIGTERM and is SIGKILLed when its share of `timeout_s` has passed: the gateway
        may use two thirds, the workers the rest. `timeout_s=0` kills at once. Without `drain`
        (Redis is gone: nothing can be handed over) every part gets SIGTERM at once and a
        second one (stop now) after STOP_NOW_AFTER_S. Idempotent.
        """
        deadline = time.monotonic() + timeout_s
        if not drain:
            self._terminate(self._children(), deadline, again_after_s=STOP_NOW_AFTER_S)
        if self._gateway is not None:
            self._terminate([self._gateway], deadline - timeout_s / 3)
        self._terminate(self._workers, deadline)
        if self._kvstore is not None:  # last: it applies the workers' final events
            self._terminate([self._kvstore], max(deadline, time.monotonic() + 2.0))
        if self._redis is not None:
            self._redis.close()
        if self._redis_server is not None:
            self._redis_server.stop(max(0.0, min(5.0, deadline - time.monotonic())))

    def _terminate(
        self, children: list[Child], deadline: float, again_after_s: float | None = None
    ) -> None:
        """SIGTERM `children` (again after `again_after_s`); SIGKILL those left at `deadline`."""
        running = {c.name: c.process for c in children if c.process is not None}
        timeout_s = deadline - time.monotonic()
        for name in terminate_all(running, timeout_s, again_after_s=again_after_s):
            if timeout_s > 0:
                self._progress(f"{name} did not stop in time; killed it")

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
