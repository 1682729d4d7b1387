"""A private, memory-only `redis-server` on a free loopback port, for `warmfleet up` and tests."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from common.errors import ServiceError
from warmfleet.processes import Process, describe_exit, format_tail, free_port, spawn, terminate

INSTALL_HINT = (
    "install it (Debian/Ubuntu: apt-get install -y redis-server; macOS: brew install redis) "
    "or pass --redis-url to use a running Redis"
)
_PORT_RETRIES = 3  # a picked port can be taken before redis-server binds it
_POLL_S = 0.05


class RedisServer:
    """Runs `redis-server` from PATH on 127.0.0.1, with no persistence, until `stop()`.

    Use it as a context manager, or call `start()` and `stop()` yourself.
    """

    def __init__(
        self,
        *,
        port: int = 0,
        binary: str = "redis-server",
        start_timeout_s: float = 10.0,
        stop_timeout_s: float = 5.0,
        log_path: Path | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self._requested_port = port
        self._binary = binary
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._log_path = log_path
        self._extra_args = list(extra_args)
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._process: Process | None = None
        self._port = 0

    @property
    def port(self) -> int:
        """The TCP port it listens on (0 before `start()`)."""
        return self._port

    @property
    def url(self) -> str:
        """`redis://127.0.0.1:PORT/0`."""
        return f"redis://127.0.0.1:{self._port}/0"

    @property
    def process(self) -> Process | None:
        """The `redis-server` process, once started."""
        return self._process

    @property
    def log_path(self) -> Path | None:
        """The file that receives the server's output, once started."""
        return self._log_path

    def start(self) -> RedisServer:
        """Start the server and return once it answers PING.

        Raises ServiceError when the binary is missing (with how to install it), when it
        exits early (with its last output lines), or when it does not answer within
        `start_timeout_s`.
        """
        if self._process is not None:
            raise RuntimeError("RedisServer.start() called twice")
        binary = shutil.which(self._binary)
        if binary is None:
            raise ServiceError(f"{self._binary} not found on PATH; {INSTALL_HINT}")
        # Its working dir is private, so nothing (dump.rdb, ...) can land in the caller's cwd.
        self._workdir = tempfile.TemporaryDirectory(prefix="warmfleet-redis-")
        if self._log_path is None:
            self._log_path = Path(self._workdir.name) / "redis.log"
        try:
            for attempt in range(_PORT_RETRIES):
                port = self._requested_port or free_port()
                if self._launch(binary, port, last_try=attempt == _PORT_RETRIES - 1):
                    return self
            raise AssertionError("unreachable")  # the last try raises instead of returning False
        except BaseException:
            self.stop()
            raise

    def _launch(self, binary: str, port: int, *, last_try: bool) -> bool:
        """Start on `port` and wait for PING. False when the port was taken and a retry helps."""
        assert self._workdir is not None and self._log_path is not None
        argv = [
            binary,
            "--port", str(port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", self._workdir.name,
            *self._extra_args,
        ]  # fmt: skip
        log_offset = self._log_path.stat().st_size if self._log_path.exists() else 0
        self._process = proc = spawn(argv, self._log_path)
        self._port = port
        deadline = time.monotonic() + self._start_timeout_s
        client = redis.Redis(
            host="127.0.0.1",
            port=port,
            socket_timeout=1.0,
            socket_connect_timeout=1.0,
            retry=Retry(NoBackoff(), 0),  # we poll; redis-py's default retries take ~4 s
        )
        try:
            while True:
                code = proc.poll()
                if code is not None:
                    output = self._log_path.read_bytes()[log_offset:]
                    port_taken = b"Address already in use" in output
                    if port_taken and not self._requested_port and not last_try:
                        return False
                    raise ServiceError(
                        f"redis-server on port {port} {describe_exit(code)} before it was "
                        f"ready; {format_tail(self._log_path)}"
                    )
                if _answers_ping(client, proc.pid):
                    return True
                if time.monotonic() >= deadline:
                    raise ServiceError(
                        f"redis-server on port {port} did not answer PING within "
                        f"{self._start_timeout_s:.0f} s; {format_tail(self._log_path)}"
                    )
                time.sleep(_POLL_S)
        finally:
            client.close()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the server: SIGTERM, then SIGKILL after `timeout_s` (default `stop_timeout_s`).

        Idempotent; removes its private working dir.
        """
        if self._process is not None:
            terminate(self._process, self._stop_timeout_s if timeout_s is None else timeout_s)
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _answers_ping(client: redis.Redis, pid: int) -> bool:
    """True once the server with process id `pid` answers on the client's port.

    Checking the pid matters when the port is taken: another server would answer PING
    before ours has failed to bind.
    """
    try:
        return bool(client.ping()) and client.info("server").get("process_id") == pid
    except (redis.ConnectionError, redis.TimeoutError):
        return False
