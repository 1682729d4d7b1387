"""The gateway's side of the Redis protocol: route and enqueue, read tokens, sessions."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from broker import fair_queue, keys, kv_commands, kv_events
from broker.fair_queue import Admission
from broker.wire import Fields, WireRequest

CANCEL_TTL_S = 600


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session_id: str
    worker_id: str
    tier: str  # hot, warm, spilling, disk or gone
    num_tokens: int
    kv_bytes: int
    last_used: float


class GatewayBroker:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._enqueue = r.register_script(fair_queue.ENQUEUE)
        self._unqueue = r.register_script(fair_queue.UNQUEUE)
        self._live = r.register_script(fair_queue.LIVE_WORKERS)

    def enqueue(
        self,
        request: WireRequest,
        cost: int,
        weight: int,
        max_queued: int,
        max_total: int,
        max_running: int,
    ) -> Admission:
        """Route and enqueue in one step (see broker/fair_queue.py): onto the pinned stream
        of the live worker that holds the session, else into the tenant's fair queue of its
        class, unless no worker is alive or the tenant's queue or all queues are full."""
        sid, tenant, rid = request.session_id, request.tenant, request.request_id
        session = keys.session_key(tenant, sid) if sid else "wf:session:-"
        ttl_s = max(1, int(request.deadline_at - time.time()) + 1)
        kind, detail = self._enqueue(
            keys=[
                session,
                keys.tenant_queued(tenant),
                keys.QUEUED,
                keys.queued_request(rid),
                keys.fair_queue(request.priority, tenant),
                keys.fair_active(request.priority),
                keys.fair_state(request.priority),
                keys.WAKE,
                keys.RUNNING,
                keys.affinity_key(tenant, sid) if sid else "wf:affinity:-",
            ],
            args=[
                request.encode()["body"],
                keys.heartbeat_key(""),
                keys.pinned_stream(""),
                keys.WORKERS,
                rid,
                tenant,
                cost,
                weight,
                max_queued,
                max_total,
                ttl_s,
                max_running,
                keys.draining_key(""),
            ],
        )
        if kind == "pinned":
            return Admission(kind, worker_id=detail)
        return Admission(kind, queued=int(detail or 0))

    def unqueue(self, request: WireRequest) -> bool:
        """Take a request out of its fair queue; False if a worker has it already."""
        removed = self._unqueue(
            keys=[
                keys.fair_queue(request.priority, request.tenant),
                keys.queued_request(request.request_id),
                keys.tenant_queued(request.tenant),
                keys.QUEUED,
                keys.fair_active(request.priority),
            ],
            args=[request.request_id, request.tenant],
        )
        return bool(removed)

    def read_out(self, request_id: str, after: str, block_ms: int) -> list[tuple[str, Fields]]:
        """Events after entry `after` ("0" for all), waiting up to block_ms for the first."""
        reply = self.r.xread({keys.out_stream(request_id): after}, block=block_ms, count=64)
        return [(eid, fields) for _, entries in reply or [] for eid, fields in entries]

    def cancel(self, request_id: str) -> None:
        self.r.set(keys.cancel_key(request_id), "1", ex=CANCEL_TTL_S)

    def live_workers(self) -> list[str]:
        """The workers that take requests now: registered, heartbeat fresh, not draining."""
        return sorted(self._live(args=fair_queue.live_workers_args()))

    def alive(self, worker_ids: list[str]) -> list[bool]:
        if not worker_ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for w in worker_ids:
            pipe.exists(keys.heartbeat_key(w))
        return [bool(x) for x in pipe.execute()]

    def get_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        fields = self.r.hgetall(keys.session_key(tenant, session_id))
        return self._record(session_id, fields) if fields else None

    def list_sessions(self, tenant: str, offset: int, limit: int) -> list[SessionRecord]:
        """Most recently used first."""
        ids = self.r.zrevrange(keys.session_index(tenant), offset, offset + limit - 1)
        pipe = self.r.pipeline(transaction=False)
        for sid in ids:
            pipe.hgetall(keys.session_key(tenant, sid))
        return [self._record(s, f) for s, f in zip(ids, pipe.execute(), strict=True) if f]

    def delete_session(self, tenant: str, session_id: str) -> bool:
        """Forget the session everywhere (index, worker memory, spill file); False if there
        was no such session. The kvstore carries it out; raises ServiceError when it does
        not answer in time."""
        key = keys.cache_key(tenant, session_id)
        return kv_commands.call(self.r, kv_events.DELETE, key) != kv_events.REPLY_NOT_FOUND

    def fork_session(self, tenant: str, session_id: str, new_session_id: str) -> str:
        """A new session starting from a copy of another's KV: kv_events.REPLY_OK,
        REPLY_NOT_FOUND (no such source) or REPLY_EXISTS (the new id is taken). Raises
        ServiceError as delete does."""
        source, new = keys.cache_key(tenant, session_id), keys.cache_key(tenant, new_session_id)
        return kv_commands.call(self.r, kv_events.FORK, source, new)

    def _record(self, session_id: str, f: dict[str, str]) -> SessionRecord:
        worker = f.get("worker", "")
        tier = f.get("tier", "gone")
        if worker and not self.alive([worker])[0]:
            worker, tier = "", "gone"
        return SessionRecord(
            session_id,
            worker,
            tier,
            int(f.get("num_tokens", 0)),
            int(f.get("kv_bytes", 0)),
            float(f.get("last_used", 0)),
        )
