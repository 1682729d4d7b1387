"""The gateway's side of the Redis protocol: route and enqueue, read tokens, sessions."""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from broker import keys
from broker.wire import Control, Fields, WireRequest

CANCEL_TTL_S = 600

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


# Fork in one step: the new session's record is the source's, and the order to copy the KV
# goes on the stream that the new session's requests will be routed to, so the copy comes
# first. Returns 0 if the source is missing, -1 if the new id is taken, else the stream
# used ("" when the source's KV is gone and there is nothing to copy).
FORK = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return -1 end
local worker = redis.call('HGET', KEYS[1], 'worker') or ''
local tier = redis.call('HGET', KEYS[1], 'tier') or 'gone'
local stream = ''
if worker ~= '' and redis.call('EXISTS', ARGV[3] .. worker) == 1 then
  stream = ARGV[4] .. worker
elseif tier == 'disk' then
  stream = ARGV[5]
else
  worker = ''
  tier = 'gone'
end
redis.call('HSET', KEYS[2], 'worker', worker, 'tier', tier == 'hot' and 'warm' or tier,
           'num_tokens', redis.call('HGET', KEYS[1], 'num_tokens') or '0',
           'kv_bytes', redis.call('HGET', KEYS[1], 'kv_bytes') or '0', 'last_used', ARGV[6])
redis.call('ZADD', KEYS[3], ARGV[6], ARGV[2])
if stream ~= '' then
  redis.call('XADD', stream, '*', 'op', 'fork_session', 'tenant', ARGV[7],
             'session_id', ARGV[1], 'new_session_id', ARGV[2])
end
return stream
"""


@dataclass(frozen=True, slots=True)
class Routed:
    stream: str  # "" when no worker is alive: nothing was enqueued
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
        self._fork = r.register_script(FORK)

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

    def fork_session(self, tenant: str, session_id: str, new_session_id: str) -> int | str:
        """0: no such source; -1: the new id exists; else the stream the copy order went on."""
        result: int | str = self._fork(
            keys=[
                keys.session_key(tenant, session_id),
                keys.session_key(tenant, new_session_id),
                keys.session_index(tenant),
            ],
            args=[
                session_id,
                new_session_id,
                keys.heartbeat_key(""),
                keys.pinned_stream(""),
                keys.shared_stream("normal"),
                f"{time.time():.3f}",
                tenant,
            ],
        )
        return result

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
