"""The gateway's side of the Redis protocol: route and enqueue, read tokens, sessions."""

from __future__ import annotations

from dataclasses import dataclass

import redis

from broker import keys, kv_commands, kv_events
from broker.wire import Fields, WireRequest

CANCEL_TTL_S = 600
REPLY_NOT_FOUND = "not_found"  # the kvstore's answer (kvstore.index.REPLY_NOT_FOUND)

# Route and enqueue in one step: to the pinned stream of the live worker that holds the
# session, else to the shared stream of the priority class; nowhere when no worker is alive
# (the request would wait for nobody). Checking the heartbeat inside
# the script closes the race with a worker dying between the check and the XADD.
ROUTE_AND_ENQUEUE = """
local worker = redis.call('HGET', KEYS[1], 'worker')
local stream = KEYS[2]
if worker and worker ~= '' and redis.call('EXISTS', ARGV[2] .. worker) == 1 then
  stream = ARGV[3] .. worker
else
  worker = ''
  local alive = false
  for _, w in ipairs(redis.call('SMEMBERS', ARGV[4])) do
    if redis.call('EXISTS', ARGV[2] .. w) == 1 then
      alive = true
      break
    end
  end
  if not alive then
    return {'', ''}
  end
end
redis.call('XADD', stream, '*', 'body', ARGV[1])
return {stream, worker}
"""


@dataclass(frozen=True, slots=True)
class Routed:
    stream: str  # "" when no worker is alive: nothing was enqueued
    worker_id: str  # "" when the request went to a shared stream


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
        self._route = r.register_script(ROUTE_AND_ENQUEUE)

    def enqueue(self, request: WireRequest) -> Routed:
        body = request.encode()["body"]
        sid = request.session_id
        session = keys.session_key(request.tenant, sid) if sid else "wf:session:-"
        stream, worker = self._route(
            keys=[session, keys.shared_stream(request.priority)],
            args=[body, keys.heartbeat_key(""), keys.pinned_stream(""), keys.WORKERS],
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
        return kv_commands.call(self.r, kv_events.DELETE, key) != REPLY_NOT_FOUND

    def fork_session(self, tenant: str, session_id: str, new_session_id: str) -> str:
        """A new session starting from a copy of another's KV: "ok", "not_found" (no such
        source) or "exists" (the new id is taken). Raises ServiceError as delete does."""
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
