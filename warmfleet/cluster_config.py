"""What `warmfleet up` (and the tests) start: one typed config, checked when built, and the
command line of each part it implies."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from common.errors import InvalidRequestError

Progress = Callable[[str], None]
PathLike = str | os.PathLike[str]


def print_progress(message: str) -> None:
    """The default progress callback: one "warmfleet: ..." line on stderr."""
    print(f"warmfleet: {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class ClusterConfig:
    num_workers: int = 2
    port: int = 0  # the gateway's gRPC port; 0 picks a free one
    http_port: int = 0  # the gateway's HTTP port; 0 picks a free one
    kvstore_port: int = 0
    redis_url: str | None = None  # None: a private redis-server
    model: PathLike | None = None  # None: the default model (fetched once, by the launcher)
    threads_per_worker: int | None = None  # None: the cores shared out
    device: str | None = None  # the workers' --device (None: theirs by default)
    weights: str | None = None  # the workers' --weights (None: theirs by default)
    kv_dtype: str | None = None  # the workers' --kv-dtype (None: theirs by default)
    lease_s: float | None = None
    spill_dir: PathLike | None = None
    warm_budget: int | None = None
    disk_budget: int | None = None
    keys_file: PathLike | None = None  # the gateway's API keys (None: one local tenant)
    local_max_concurrent: int | None = None  # that local tenant's limits (None: the gateway's)
    local_max_queued: int | None = None
    worker_args: Sequence[str] = ()  # more `warmfleet worker` options
    gateway_args: Sequence[str] = ()  # more `warmfleet gateway` options
    extra_env: Mapping[str, str] = field(default_factory=dict)
    log_dir: PathLike | None = None  # None: a new temp folder (kept after stop)
    progress: Progress = print_progress
    cli_module: str = "warmfleet.cli"  # tests swap in stand-ins for the worker and gateway

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise InvalidRequestError("--workers", f"must be at least 1, got {self.num_workers}")
        ports = (("--port", self.port), ("--http-port", self.http_port),
                 ("--kvstore-port", self.kvstore_port))  # fmt: skip
        for name, port in ports:
            if not 0 <= port <= 65535:
                raise InvalidRequestError(name, f"must be in [0, 65535], got {port}")
        if self.threads_per_worker is not None and self.threads_per_worker < 1:
            raise InvalidRequestError(
                "--threads", f"must be at least 1, got {self.threads_per_worker}"
            )

    @property
    def threads(self) -> int:
        """BLAS and kernel threads of each worker."""
        return self.threads_per_worker or max(1, (os.cpu_count() or 1) // self.num_workers)

    def _base(self, role: str, redis_url: str) -> list[str]:
        return [sys.executable, "-m", self.cli_module, role, "--redis-url", redis_url]

    def worker_argv(self, worker_id: str, redis_url: str, metrics_port: int = 0) -> list[str]:
        argv = self._base("worker", redis_url)
        argv += ["--worker-id", worker_id, "--threads", str(self.threads)]
        argv += ["--metrics-port", str(metrics_port)] if metrics_port else []
        argv += _options(
            model=self.model,
            lease_s=self.lease_s,
            spill_dir=self.spill_dir,
            warm_budget=self.warm_budget,
            device=self.device,
            weights=self.weights,
            kv_dtype=self.kv_dtype,
        )
        return argv + list(self.worker_args)

    def kvstore_argv(self, port: int, redis_url: str, metrics_port: int = 0) -> list[str]:
        argv = [*self._base("kvstore", redis_url), "--port", str(port)]
        argv += ["--metrics-port", str(metrics_port)] if metrics_port else []
        return argv + _options(spill_dir=self.spill_dir, disk_budget=self.disk_budget)

    def gateway_argv(self, port: int, http_port: int, redis_url: str) -> list[str]:
        argv = [*self._base("gateway", redis_url), "--port", str(port)]
        argv += ["--http-port", str(http_port)]
        argv += _options(model=self.model, keys=self.keys_file,
                         local_max_concurrent=self.local_max_concurrent,
                         local_max_queued=self.local_max_queued)  # fmt: skip
        return argv + list(self.gateway_args)


def _options(**values: object) -> list[str]:
    """--name value for each value given (None: left out)."""
    argv: list[str] = []
    for name, value in values.items():
        if value is not None:
            argv += [f"--{name.replace('_', '-')}", str(value)]
    return argv
