"""What the gateway does for a request, whatever face it came in by: admit it (route and
enqueue, waiting for a worker when none is live), then follow its results, and the session
calls. Outcomes other than a result are the named errors of common/errors.py. All of it runs
on the gateway's one event loop: a client that goes away cancels its task."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass
from typing import TypeVar

import redis

from broker.fair_queue import Admission
from broker.gateway_broker import Bounds, GatewayBroker
from broker.messages import AnswerStatus, CommandAnswer, Completion, Job, JobError, TokenChunk
from broker.records import SessionRecord
from broker.results_hub import ResultsHub
from common.errors import (
    AlreadyExistsError,
    DeadlineExceededError,
    InternalError,
    InvalidRequestError,
    JobFailedError,
    NotFoundError,
    PermissionDeniedError,
    QueueFullError,
    ServiceError,
    UnavailableError,
    WarmfleetError,
)
from gateway.auth import Tenant
from gateway.metrics import GatewayMetrics
from gateway.session_find import Found, session_for
from gateway.worker_watch import WorkerWatch

log = logging.getLogger("warmfleet.gateway")
POLL_S = 1.0  # longest single wait for a job's next result
MAX_PAGE_SIZE = 1000
PAGE_TOKEN = re.compile(r"[0-9]{1,9}")  # an offset we issued (ASCII digits: str.isdigit takes "²")
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
    def __init__(
        self,
        broker: GatewayBroker,
        hub: ResultsHub,
        config: GatewayConfig,
        watch: WorkerWatch,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.broker = broker
        self.hub = hub
        self.config = config
        self.watch = watch
        self.metrics = metrics or GatewayMetrics()

    async def admit(self, job: Job, tenant: Tenant, holder: str = "") -> Admission:
        """Route and enqueue (a new session to the worker holding session `holder` where it
        has room: the longest prefix of its prompt); while no worker takes requests, wait
        for one (up to the deadline and worker_wait_s). Raises PermissionDeniedError,
        QueueFullError, UnavailableError."""
        if not tenant.allows(job.priority):
            raise PermissionDeniedError(
                f"priority {job.priority} is above this key's ceiling ({tenant.max_priority})"
            )
        bounds = Bounds(tenant.weight, tenant.max_queued, self.config.max_queued,
                        tenant.max_concurrent)  # fmt: skip
        t0 = time.time()
        give_up = min(job.deadline_at, t0 + self.config.worker_wait_s)
        while True:
            admission = await self._redis(self.broker.enqueue(job, bounds, holder))
            if admission.kind in ("tenant_full", "full"):
                raise self._queue_full(admission, tenant)
            if admission.kind != "no_worker":
                return admission
            left = give_up - time.time()
            if left <= 0:
                raise UnavailableError(f"no worker is running (waited {time.time() - t0:.0f} s)")
            await self.watch.wait_for_worker(min(left, POLL_S))

    def _queue_full(self, admission: Admission, tenant: Tenant) -> QueueFullError:
        """The refusal naming the limit reached, with a retry hint."""
        retry, queued = retry_after_ms(admission.queued), admission.queued
        if admission.kind == "tenant_full":
            setting = "--local-max-queued" if tenant.local else "max_queued of its key"
            whose, limit = "this tenant's", f"its limit, {setting}, is {tenant.max_queued}"
        else:
            whose, limit = "the", f"the gateway's limit, --max-queued, is {self.config.max_queued}"
        return QueueFullError(
            f"{whose} queue is full ({queued} requests waiting; {limit}); retry after {retry} ms",
            retry,
        )

    async def results(self, job: Job) -> AsyncGenerator[TokenChunk | Completion, None]:
        """The job's chunks, each token index once (a job retried elsewhere replays its
        tokens), then its completion. Raises JobFailedError, DeadlineExceededError (the job
        is taken out of the queue or cancelled first), UnavailableError. Closing it early
        (the client went away) cancels the job."""
        sub = await self._redis(self.hub.open(job.request_id))
        next_index, ended, last_token_at = 0, False, 0.0
        try:
            while True:
                message = await self._next(job, sub.queue)
                now = time.time()
                if isinstance(message, Completion):
                    ended = True
                    self.metrics.completed(job, message, now)
                    yield message
                    return
                skip = max(0, next_index - message.index)
                if skip > len(message.token_ids) or (skip == len(message.token_ids) and skip):
                    continue
                fresh = len(message.token_ids) - skip
                if fresh and not last_token_at:
                    self.metrics.first_token(job, now)  # those with it: no gap to measure
                elif fresh:
                    self.metrics.tokens(job, fresh, now - last_token_at)
                last_token_at = now if fresh else last_token_at
                next_index = message.index + len(message.token_ids)
                yield TokenChunk(message.index + skip, message.token_ids[skip:], message.text)
        finally:
            self.hub.close(job.request_id)
            if not ended:
                await asyncio.shield(self.give_up(job))

    async def _next(
        self, job: Job, queue: asyncio.Queue[TokenChunk | Completion | JobError | Exception]
    ) -> TokenChunk | Completion:
        while True:
            left = job.deadline_at - time.time()
            if left <= 0:
                queued = await self._redis(self._withdraw(job))
                where = "while queued (removed from the queue)" if queued else "while running"
                raise DeadlineExceededError(f"deadline exceeded {where}")
            try:
                item = await asyncio.wait_for(queue.get(), timeout=min(POLL_S, left))
            except TimeoutError:
                continue
            if isinstance(item, redis.RedisError):
                raise redis_failure(item)
            if isinstance(item, Exception):
                raise UnavailableError(f"unreadable result: {item}")
            if isinstance(item, JobError):
                raise JobFailedError(item.code, item.message)
            return item

    async def give_up(self, job: Job) -> None:
        """The client went away: free its place in the queue, or its sequence."""
        try:
            await self._withdraw(job)
        except redis.RedisError as e:
            log.warning("could not cancel %s: %s", job.request_id, e)

    async def _withdraw(self, job: Job) -> bool:
        """Out of the queue if it is still there (True), else cancelled on its worker."""
        if await self.broker.unqueue(job):
            return True
        await self.broker.cancel(job.request_id)
        return False

    # ---- sessions ------------------------------------------------------------------

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord:
        record = await self._redis(self.broker.get_session(tenant, session_id))
        if record is None:
            raise NotFoundError(f"no session {session_id!r}")
        return record

    async def list_sessions(
        self, tenant: str, page_token: str, page_size: int
    ) -> tuple[list[tuple[str, SessionRecord]], str]:
        """A page of (session id, record), most recent first, and the next page's token."""
        size = page_size or 100
        if not 0 < size <= MAX_PAGE_SIZE:
            raise InvalidRequestError("page_size", f"in [1, {MAX_PAGE_SIZE}], got {size}")
        if page_token and not PAGE_TOKEN.fullmatch(page_token):
            raise InvalidRequestError("page_token", "not a token we issued")
        offset = int(page_token or "0")
        records = await self._redis(self.broker.list_sessions(tenant, offset, size + 1))
        more = len(records) > size
        return records[:size], str(offset + size) if more else ""

    async def session_for(
        self, tenant: str, session_id: str, prompt_ids: tuple[int, ...], api: str = "http"
    ) -> Found:
        """The session a request runs in: the one it names, else (HTTP) the one its prompt
        continues, else a new one; and the holder of its prompt's prefix, to place it by
        (gateway/session_find.py). A gRPC request naming none stays without a session."""
        find = api == "http"
        found = await self._redis(session_for(self.broker, tenant, session_id, prompt_ids, find))
        placed = "prefix" if found.holder_worker else "disk" if found.holder else "none"
        self.metrics.sessions.labels(tenant, api, found.how, placed).inc()
        return found

    async def delete_session(self, tenant: str, session_id: str) -> bool:
        return await self._redis(self.broker.delete_session(tenant, session_id))

    async def fork_session(self, tenant: str, source: str, new: str) -> SessionRecord:
        answer = await self._redis(self.broker.fork_session(tenant, source, new))
        if answer.status == AnswerStatus.NOT_FOUND:
            raise NotFoundError(f"no session {source!r}")
        if answer.status == AnswerStatus.EXISTS:
            raise AlreadyExistsError(f"session {new!r} already exists")
        if answer.status == AnswerStatus.ERROR:
            raise UnavailableError(answer.message)
        return await self.get_session(tenant, new)  # NotFoundError if deleted in between

    async def evict_session(self, tenant: str, session_id: str) -> CommandAnswer:
        return await self._redis(self.broker.evict_session(tenant, session_id))

    async def drain_worker(self, worker_id: str) -> bool:
        return await self._redis(self.broker.drain_worker(worker_id))

    @staticmethod
    async def _redis(call: Awaitable[T]) -> T:
        try:
            return await call
        except redis.RedisError as e:
            raise redis_failure(e) from e
        except ServiceError as e:
            raise UnavailableError(str(e)) from e


# Redis's refusals that pass (it is loading, busy, out of memory, a replica, failing over):
# anything else it refuses is a command it should never have been sent
PASSING = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
           redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError,
           redis.exceptions.MasterDownError)  # fmt: skip
PASSING_CODES = ("BUSY", "MISCONF", "NOREPLICAS", "NOQUORUM")


def redis_failure(e: redis.RedisError) -> WarmfleetError:
    """A Redis error as a call's outcome: Redis unreachable or refusing for now is
    UnavailableError (a retry may succeed, clients retry UNAVAILABLE); any other refusal is
    InternalError, logged: requests are checked before Redis sees them, so it is a fault of
    ours that a retry would only repeat."""
    if not isinstance(e, redis.ResponseError) or isinstance(e, PASSING):
        return UnavailableError(f"queue unavailable: {e}")
    if str(e).startswith(PASSING_CODES):
        return UnavailableError(f"queue unavailable: {e}")
    log.error("Redis refused a command: %s", e)
    return InternalError(f"Redis refused a command: {e}")
