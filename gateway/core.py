"""What the gateway does for a request, whatever face it came in by: admit it (route and
enqueue, waiting for a worker when none is live), then follow its results, and the session
calls. Outcomes other than a result are the named errors of common/errors.py."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import redis

from broker.fair_queue import Admission
from broker.gateway_broker import Bounds, GatewayBroker, Result
from broker.messages import AnswerStatus, Completion, Job, JobError, TokenChunk
from broker.records import SessionRecord
from common.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    InvalidRequestError,
    JobFailedError,
    NotFoundError,
    PermissionDeniedError,
    ProtocolError,
    QueueFullError,
    ServiceError,
    UnavailableError,
)
from gateway.auth import Tenant
from gateway.worker_watch import WorkerWatch

log = logging.getLogger("warmfleet.gateway")
POLL_MS = 1000  # longest single wait on a request's out stream
MAX_PAGE_SIZE = 1000
Active = Callable[[], bool]  # whether the client still waits
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    default_timeout_s: float = 600.0  # a request without a client deadline ends after this
    max_queued: int = 1024  # requests waiting in the fair queues, all tenants together
    worker_wait_s: float = 30.0  # a request that finds no live worker waits this long for one

    def __post_init__(self) -> None:
        if self.default_timeout_s <= 0:
            raise InvalidRequestError("default_timeout_s", "must be > 0")
        if self.max_queued < 1:
            raise InvalidRequestError("max_queued", "must be >= 1")
        if self.worker_wait_s < 0:
            raise InvalidRequestError("worker_wait_s", "must be >= 0")


def retry_after_ms(queued: int) -> int:
    """A hint for a refused request: about a second per 32 requests ahead, 1-60 s."""
    return min(60_000, 1000 * max(1, -(-queued // 32)))


class GatewayCore:
    def __init__(self, broker: GatewayBroker, config: GatewayConfig, watch: WorkerWatch) -> None:
        self.broker = broker
        self.config = config
        self.watch = watch

    def admit(self, job: Job, tenant: Tenant, active: Active) -> Admission:
        """Route and enqueue; while no worker takes requests, wait for one (up to the
        deadline and worker_wait_s). Raises PermissionDeniedError, QueueFullError,
        UnavailableError."""
        if not tenant.allows(job.priority):
            raise PermissionDeniedError(
                f"priority {job.priority} is above this key's ceiling ({tenant.max_priority})"
            )
        bounds = Bounds(tenant.weight, tenant.max_queued, self.config.max_queued,
                        tenant.max_concurrent)  # fmt: skip
        t0 = time.time()
        give_up = min(job.deadline_at, t0 + self.config.worker_wait_s)
        while True:
            admission = self._redis(lambda: self.broker.enqueue(job, bounds))
            left = give_up - time.time()
            if admission.kind in ("tenant_full", "full"):
                whose = "this tenant's" if admission.kind == "tenant_full" else "the"
                retry = retry_after_ms(admission.queued)
                raise QueueFullError(
                    f"{whose} queue is full ({admission.queued} requests waiting); "
                    f"retry after {retry} ms", retry
                )  # fmt: skip
            if admission.kind != "no_worker":
                return admission
            if left <= 0 or not active():
                raise UnavailableError(f"no worker is running (waited {time.time() - t0:.0f} s)")
            self.watch.wait_for_worker(min(left, 1.0))

    def results(self, job: Job, active: Active) -> Iterator[TokenChunk | Completion]:
        """The job's chunks, each token index once (a job retried elsewhere replays its
        tokens), then its completion. Raises JobFailedError, DeadlineExceededError (the
        job is taken out of the queue or cancelled first), UnavailableError."""
        after, next_index = "0", 0
        while True:
            left_ms = int((job.deadline_at - time.time()) * 1000)
            if left_ms <= 0:
                queued = self._redis(lambda: self._withdraw(job))
                where = "while queued (removed from the queue)" if queued else "while running"
                raise DeadlineExceededError(f"deadline exceeded {where}")
            if not active():
                return
            for entry_id, message in self._read(job, after, min(POLL_MS, left_ms)):
                after = entry_id
                if isinstance(message, JobError):
                    raise JobFailedError(message.code, message.message)
                if isinstance(message, Completion):
                    yield message
                    return
                skip = max(0, next_index - message.index)
                if skip > len(message.token_ids) or (skip == len(message.token_ids) and skip):
                    continue
                next_index = message.index + len(message.token_ids)
                yield TokenChunk(message.index + skip, message.token_ids[skip:], message.text)

    def give_up(self, job: Job) -> None:
        """The client went away: free its place in the queue, or its sequence."""
        try:
            self._withdraw(job)
        except redis.RedisError as e:
            log.warning("could not cancel %s: %s", job.request_id, e)

    def _withdraw(self, job: Job) -> bool:
        """Out of the queue if it is still there (True), else cancelled on its worker."""
        if self.broker.unqueue(job):
            return True
        self.broker.cancel(job.request_id)
        return False

    def _read(self, job: Job, after: str, block_ms: int) -> list[tuple[str, Result]]:
        try:
            return self._redis(lambda: self.broker.read_results(job.request_id, after, block_ms))
        except ProtocolError as e:
            raise UnavailableError(f"unreadable result: {e}") from e

    # ---- sessions ------------------------------------------------------------------

    def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        record = self._redis(lambda: self.broker.get_session(tenant, session_id))
        if record is None:
            raise NotFoundError(f"no session {session_id!r}")
        return record

    def list_sessions(
        self, tenant: str, page_token: str, page_size: int
    ) -> tuple[list[tuple[str, SessionRecord]], str]:
        """A page of (session id, record), most recent first, and the next page's token."""
        size = page_size or 100
        if size > MAX_PAGE_SIZE:
            raise InvalidRequestError("page_size", f"at most {MAX_PAGE_SIZE}, got {size}")
        offset = int(page_token) if page_token.isdigit() and len(page_token) < 10 else -1
        if offset < 0 and page_token:
            raise InvalidRequestError("page_token", "not a token we issued")
        offset = max(0, offset)
        records = self._redis(lambda: self.broker.list_sessions(tenant, offset, size + 1))
        more = len(records) > size
        return records[:size], str(offset + size) if more else ""

    def delete_session(self, tenant: str, session_id: str) -> bool:
        return bool(self._redis(lambda: self.broker.delete_session(tenant, session_id)))

    def fork_session(self, tenant: str, source: str, new: str) -> SessionRecord:
        answer = self._redis(lambda: self.broker.fork_session(tenant, source, new))
        if answer.status == AnswerStatus.NOT_FOUND:
            raise NotFoundError(f"no session {source!r}")
        if answer.status == AnswerStatus.EXISTS:
            raise AlreadyExistsError(f"session {new!r} already exists")
        if answer.status == AnswerStatus.ERROR:
            raise UnavailableError(answer.message)
        return self.get_session(tenant, new)  # NotFoundError if deleted again in between

    @staticmethod
    def _redis(call: Callable[[], T]) -> T:
        try:
            return call()
        except redis.RedisError as e:
            raise UnavailableError(f"queue unavailable: {e}") from e
        except ServiceError as e:
            raise UnavailableError(str(e)) from e
