"""The gRPC Inference service: validate, route, enqueue, and stream tokens back."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import redis

from broker import kv_events
from broker.fair_queue import Admission
from broker.gateway_broker import GatewayBroker, SessionRecord
from broker.wire import WireRequest, parse_tokens
from engine.config import ModelConfig
from engine.tokenizer import Tokenizer
from gateway.auth import AuthError, KeyRing, Tenant
from gateway.validate import build_request, require_session_id
from gateway.worker_watch import WorkerWatch
from warmfleet.errors import InvalidRequestError, PromptTooLongError, ServiceError
from warmfleet.grpc_serve import abort
from warmfleet.v1 import inference_pb2 as pb
from warmfleet.v1 import inference_pb2_grpc

log = logging.getLogger("warmfleet.gateway")
SESSION_METADATA_KEY = "x-session-id"
POLL_MS = 1000  # longest single wait on a request's out stream
MAX_PAGE_SIZE = 1000
FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "cancelled": pb.FINISH_REASON_CANCELLED,
}
KV_SOURCE = {
    "cold": pb.KV_SOURCE_COLD,
    "warm": pb.KV_SOURCE_WARM,
    "disk": pb.KV_SOURCE_DISK,
    "prefix": pb.KV_SOURCE_PREFIX,
}
TIER = {
    "hot": pb.TIER_HOT,
    "warm": pb.TIER_WARM,
    "spilling": pb.TIER_SPILLING,
    "disk": pb.TIER_DISK,
    "gone": pb.TIER_GONE,
}


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    default_timeout_s: float = 600.0  # a request without a client deadline ends after this
    max_queued: int = 1024  # requests waiting in the fair queues, all tenants together
    worker_wait_s: float = 30.0  # a request that finds no live worker waits this long for one

    def __post_init__(self) -> None:
        if self.default_timeout_s <= 0:
            raise InvalidRequestError("default_timeout_s", "must be > 0")
        if self.worker_wait_s < 0:
            raise InvalidRequestError("worker_wait_s", "must be >= 0")
        if self.max_queued < 1:
            raise InvalidRequestError("max_queued", "must be >= 1")


def retry_after_ms(queued: int) -> int:
    """A hint for a refused request: about a second per 32 requests ahead, 1-60 s."""
    return min(60_000, 1000 * max(1, -(-queued // 32)))


def completion_pb(raw: dict[str, Any]) -> pb.Completion:
    u, t = raw["usage"], raw["timings"]
    return pb.Completion(
        request_id=raw["request_id"],
        finish_reason=FINISH[raw["finish_reason"]],
        usage=pb.Usage(**u),
        timings=pb.Timings(**t),
        worker_id=raw["worker_id"],
        kv_source=KV_SOURCE[raw["kv_source"]],
        seed=raw["seed"],
    )


def session_pb(record: SessionRecord) -> pb.Session:
    return pb.Session(
        session_id=record.session_id,
        tier=TIER.get(record.tier, pb.TIER_GONE),
        worker_id=record.worker_id,
        num_tokens=record.num_tokens,
        kv_bytes=record.kv_bytes,
        last_used_unix_s=record.last_used,
    )


class InferenceService(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self,
        broker: GatewayBroker,
        tokenizer: Tokenizer,
        model_config: ModelConfig,
        config: GatewayConfig,
        keys: KeyRing | None = None,
        watch: WorkerWatch | None = None,
    ) -> None:
        self.broker = broker
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.config = config
        self.keys = keys or KeyRing.open()  # no key file: one local tenant
        self.watch = watch or WorkerWatch(broker, lambda serving: None)

    def Generate(
        self, request: pb.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.GenerateResponse]:
        tenant = self._tenant(context)
        metadata = dict(context.invocation_metadata())
        session_id = request.session_id or str(metadata.get(SESSION_METADATA_KEY, ""))
        remaining = context.time_remaining()
        timeout_s = (
            min(remaining, self.config.default_timeout_s)
            if remaining
            else self.config.default_timeout_s
        )
        try:
            wire = build_request(
                request, session_id, tenant.name, self.tokenizer, self.model_config, timeout_s
            )
        except PromptTooLongError as e:
            abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED, str(e))
        except InvalidRequestError as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        if not tenant.allows(wire.priority):
            abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"priority {wire.priority} is above this key's ceiling ({tenant.max_priority})",
            )
        admission = self._admit(wire, tenant, context)
        if admission.kind in ("tenant_full", "full"):
            whose = "this tenant's" if admission.kind == "tenant_full" else "the"
            retry_ms = retry_after_ms(admission.queued)
            context.set_trailing_metadata((("retry-after-ms", str(retry_ms)),))
            abort(
                context,
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{whose} queue is full ({admission.queued} requests waiting); "
                f"retry after {retry_ms} ms",
            )
        context.add_callback(lambda: self._on_rpc_end(wire, context))
        yield from self._stream(wire, context)

    def _admit(self, wire: WireRequest, tenant: Tenant, context: grpc.ServicerContext) -> Admission:
        """Route and enqueue; while no worker takes requests, wait for one (up to the
        deadline and --worker-wait-s), then UNAVAILABLE."""
        cost = len(wire.prompt_ids) + int(wire.sampling["max_tokens"])
        t0 = time.time()
        give_up = min(wire.deadline_at, t0 + self.config.worker_wait_s)
        while True:
            try:
                admission = self.broker.enqueue(
                    wire,
                    cost,
                    tenant.weight,
                    tenant.max_queued,
                    self.config.max_queued,
                    tenant.max_concurrent,
                )
            except redis.RedisError as e:
                abort(context, grpc.StatusCode.UNAVAILABLE, f"queue unavailable: {e}")
            left = give_up - time.time()
            if admission.kind != "no_worker":
                return admission
            if left <= 0 or not context.is_active():
                abort(
                    context,
                    grpc.StatusCode.UNAVAILABLE,
                    f"no worker is running (waited {time.time() - t0:.0f} s for one)",
                )
            self.watch.wait_for_worker(min(left, 1.0))

    def _on_rpc_end(self, wire: WireRequest, context: grpc.ServicerContext) -> None:
        if context.is_active():
            return
        try:  # the client went away or the deadline passed: free its place or its sequence
            if not self.broker.unqueue(wire):
                self.broker.cancel(wire.request_id)
        except redis.RedisError as e:
            log.warning("could not cancel %s: %s", wire.request_id, e)

    def _stream(
        self, wire: WireRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.GenerateResponse]:
        rid, after, next_index = wire.request_id, "0", 0
        while True:
            left_ms = int((wire.deadline_at - time.time()) * 1000)
            if left_ms <= 0:
                self._expire(wire, context)
            if not context.is_active():
                return
            try:
                events = self.broker.read_out(rid, after, min(POLL_MS, left_ms))
            except redis.RedisError as e:
                abort(context, grpc.StatusCode.UNAVAILABLE, f"queue unavailable: {e}")
            for entry_id, fields in events:
                after = entry_id
                kind = fields["k"]
                if kind == "chunk":
                    index, ids = int(fields["i"]), parse_tokens(fields["t"])
                    # a request retried on another worker replays its tokens: send each once
                    skip = max(0, next_index - index)
                    if skip > len(ids) or (skip == len(ids) and ids):
                        continue
                    next_index = index + len(ids)
                    yield pb.GenerateResponse(
                        chunk=pb.Chunk(index=index + skip, token_ids=ids[skip:], text=fields["x"])
                    )
                elif kind == "done":
                    yield pb.GenerateResponse(completion=completion_pb(json.loads(fields["c"])))
                    return
                else:
                    code = getattr(grpc.StatusCode, fields["code"], grpc.StatusCode.INTERNAL)
                    abort(context, code, fields["m"])

    def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.ServicerContext
    ) -> pb.Session:
        tenant = self._tenant(context).name
        session_id = self._session_id(request.session_id, context)
        record = self._session_call(context, lambda: self.broker.get_session(tenant, session_id))
        if record is None:
            abort(context, grpc.StatusCode.NOT_FOUND, f"no session {request.session_id!r}")
        return session_pb(record)

    def ListSessions(
        self, request: pb.ListSessionsRequest, context: grpc.ServicerContext
    ) -> pb.ListSessionsResponse:
        size = request.page_size or 100
        if size > MAX_PAGE_SIZE:
            abort(
                context,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"page_size: at most {MAX_PAGE_SIZE}, got {size}",
            )
        try:
            offset = int(request.page_token or "0")
            if offset < 0:
                raise ValueError
        except ValueError:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, "page_token: not a token we issued")
        tenant = self._tenant(context).name
        records = self._session_call(
            context, lambda: self.broker.list_sessions(tenant, offset, size + 1)
        )
        more = len(records) > size
        return pb.ListSessionsResponse(
            sessions=[session_pb(r) for r in records[:size]],
            next_page_token=str(offset + size) if more else "",
        )

    def DeleteSession(
        self, request: pb.DeleteSessionRequest, context: grpc.ServicerContext
    ) -> pb.DeleteSessionResponse:
        tenant = self._tenant(context).name
        sid = self._session_id(request.session_id, context)
        deleted = self._session_call(context, lambda: self.broker.delete_session(tenant, sid))
        return pb.DeleteSessionResponse(deleted=deleted)

    def ForkSession(
        self, request: pb.ForkSessionRequest, context: grpc.ServicerContext
    ) -> pb.Session:
        tenant = self._tenant(context).name
        source = self._session_id(request.session_id, context)
        new = self._session_id(request.new_session_id, context, field="new_session_id")
        result = self._session_call(context, lambda: self.broker.fork_session(tenant, source, new))
        if result == kv_events.REPLY_NOT_FOUND:
            abort(context, grpc.StatusCode.NOT_FOUND, f"no session {source!r}")
        if result == kv_events.REPLY_EXISTS:
            abort(context, grpc.StatusCode.ALREADY_EXISTS, f"session {new!r} already exists")
        record = self._session_call(context, lambda: self.broker.get_session(tenant, new))
        if record is None:  # deleted again in between
            abort(context, grpc.StatusCode.NOT_FOUND, f"no session {new!r}")
        return session_pb(record)

    def _expire(self, wire: WireRequest, context: grpc.ServicerContext) -> None:
        """The deadline passed: out of the queue if it is still there, else cancelled."""
        try:
            queued = self.broker.unqueue(wire)
            if not queued:
                self.broker.cancel(wire.request_id)
        except redis.RedisError as e:
            abort(context, grpc.StatusCode.UNAVAILABLE, f"queue unavailable: {e}")
        where = "while queued (removed from the queue)" if queued else "while running"
        abort(context, grpc.StatusCode.DEADLINE_EXCEEDED, f"deadline exceeded {where}")

    def _tenant(self, context: grpc.ServicerContext) -> Tenant:
        """The caller's tenant (every call is checked first); UNAUTHENTICATED otherwise."""
        try:
            return self.keys.tenant(context.invocation_metadata())
        except AuthError as e:
            abort(context, grpc.StatusCode.UNAUTHENTICATED, str(e))

    def _session_id(
        self, session_id: str, context: grpc.ServicerContext, field: str = "session_id"
    ) -> str:
        try:
            return require_session_id(session_id, field)
        except InvalidRequestError as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def _session_call(self, context: grpc.ServicerContext, call: Any) -> Any:
        try:
            return call()
        except redis.RedisError as e:
            abort(context, grpc.StatusCode.UNAVAILABLE, f"queue unavailable: {e}")
        except ServiceError as e:
            abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
