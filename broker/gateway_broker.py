"""The gateway's side of the Redis protocol: route and enqueue, read tokens, sessions."""

from __future__ import annotations

import json
from dataclasses import dataclass

import redis

from broker import keys
from broker.wire import Control, Fields, WireRequest

CANCEL_TTL_S = 600

# Route and enqueue in one step: to the pinned stream of the live worker that holds the
# session, else to the shared stream of the priority class. Checking the heartbeat inside
# the script closes the race with a worker dying between the check and the XADD.
ROUTE_AND_ENQUEUE = """
local worker = redis.call('HGET', KEYS[1], 'worker')
local stream = KEYS[2]
if worker and worker ~= '' and redis.call('EXISTS', ARGV[2] .. worker) == 1 then
  stream = ARGV[3] .. worker
else
  worker = ''
end
redis.call('XADD', stream, '*', 'body', ARGV[1])
return {stream, worker}
"""


@dataclass(frozen=True, slots=True)
class Routed:
    stream: str
    worker_id: str  # "" when the request went to a shared stream


@dataclass(frozen=True, slots=True)
class SessionRecord:
    session_id: str
    worker_id: str
    tier: str  # hot, warm, gone (later: disk)
    num_tokens: int
    kv_bytes: int
    last_used: float


class GatewayBroker:
    def __init__(self, r: redis.Redis) -> None:
        self.r = r
        self._route = r.register_script(ROUTE_AND_ENQUEUE)

    def enqueue(self, request: WireRequest) -> Routed:
        body = request.encode()["body"]
        sid = request.session_id
        session = keys.session_key(request.tenant, sid) if sid else "wf:session:-"
        stream, worker = self._route(
            keys=[session, keys.shared_stream(request.priority)],
            args=[body, keys.heartbeat_key(""), keys.pinned_stream("")],
        )
        return Routed(stream, worker)

    def read_out(self, request_id: str, after: str, block_ms: int) -> list[tuple[str, Fields]]:
        """Events after entry `after` ("0" for all), waiting up to block_ms for the first."""
        reply = self.r.xread({keys.out_stream(request_id): after}, block=block_ms, count=64)
        return [(eid, fields) for _, entries in reply or [] for eid, fields in entries]

    def cancel(self, request_id: str) -> None:
        self.r.set(keys.cancel_key(request_id), "1", ex=CANCEL_TTL_S)

    def alive(self, worker_ids: list[str]) -> list[bool]:
        if not worker_ids:
            return []
        pipe = self.r.pipeline(transaction=False)
        for w in worker_ids:
            pipe.exists(keys.heartbeat_key(w))
        return [bool(x) for x in pipe.execute()]

    def live_workers(self) -> list[str]:
        workers = sorted(self.r.smembers(keys.WORKERS))
        return [w for w, up in zip(workers, self.alive(workers), strict=True) if up]

    def worker_status(self, worker_id: str) -> dict[str, object] | None:
        raw = self.r.get(keys.heartbeat_key(worker_id))
        return json.loads(raw) if raw else None

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
        """Forget the session; whoever holds its KV is told to drop it: the live worker that
        has it in memory, or any worker of the host when it is on disk."""
        key = keys.session_key(tenant, session_id)
        record = self.r.hgetall(key)
        worker, tier = record.get("worker", ""), record.get("tier", "")
        stream = None
        if worker and self.alive([worker])[0]:
            stream = keys.pinned_stream(worker)
        elif tier == "disk":
            stream = keys.shared_stream("normal")
        pipe = self.r.pipeline(transaction=True)
        pipe.delete(key)
        pipe.zrem(keys.session_index(tenant), session_id)
        if stream is not None:
            drop = Control("drop_session", {"tenant": tenant, "session_id": session_id})
            pipe.xadd(stream, drop.encode())
        return bool(pipe.execute()[0])

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
