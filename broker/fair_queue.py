"""Fair queues: strict priority classes, and weighted fair sharing between tenants within a
class, decided atomically in Redis (Lua), so any number of gateways and workers agree.

Within a class, tenants are served by start-time fair queuing on tokens: each tenant has a
virtual finish time that grows by cost / weight per request dispatched (cost: prompt
tokens plus max_tokens; when the request ends, the tokens it did not use are given back, so
a reply that stops early costs what it ran); a tenant that becomes active starts at the
class's virtual clock;
the active tenant with the smallest virtual start time goes next. A flooding tenant
therefore waits behind a quiet one instead of ahead of it, and over time tenants get tokens
in proportion to their weights. (Deficit round robin needs a quantum tuned to request
sizes and a scan per round; virtual time is one sorted-set lookup per dispatch and exact
for requests of any size.)

A request whose session is warm on a live worker skips the queue: it goes to that worker's
pinned stream, unless its tenant already runs as many requests as it may (max_concurrent).
Then it waits in its tenant's queue like any other, marked with that worker, which takes it
when the tenant's turn comes, if it has a free slot then (else placement below decides, as
for a new session). Every other request waits in its tenant's list until a worker with room
dispatches it, which moves it onto the worker's pinned stream, where leases and fail-over
work as for pinned requests. Key names are built inside the scripts from prefixes, so the
scripts assume one Redis (not a Redis Cluster).

Placement: a queued request (a new session, or one whose KV no live worker holds) goes to
the least loaded live worker, not to whichever dispatches first; broker/placement.py ranks
the workers, and a draining worker's hand-over follows the same ranking. DISPATCH takes the
head of the queues only if no other live worker with a free slot (load under the
heartbeat's `max_running`) stands before it; else it leaves the request where it is, wakes
that worker (an entry on its own wake stream) and stops. The order in which requests leave
the queues is untouched, so the fairness above holds; and the worker first in that order
always takes, so an idle worker never watches work wait (the exception: a worker that died
idle is deferred to until its heartbeat lapses). Loads are read inside the script, so two
workers never both see themselves first. Prefix placement (a new session to the worker
holding its prompt's prefix): see broker/placement.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from broker import keys
from broker.placement import placement_script
from common.enums import PRIORITIES

# A worker takes requests while its heartbeat key exists and its draining key does not.
# KEYS: session hash, tenant's queued count, total queued count, the request's hash,
#       the tenant's list, the class's active set, the class's virtual times, wake stream,
#       running counts, the session's affinity, the gateways' counters, the session hash
#       of the prompt's longest known prefix (gateway/session_find.py)
# ARGV: the job (encoded), heartbeat prefix, pinned-stream prefix, workers set, request id, tenant,
#       cost, weight, tenant's queue bound, total bound, ttl (s), tenant's running bound,
#       draining prefix, PREFIX_SLACK
# The session goes to the worker the index names, else to the one that last started it
# (the index lags the worker by the kvstore's reaction time; an agent's next turn does not),
# else to the worker holding the session that last sent the longest prefix of its prompt in
# memory, while that worker has room (broker/placement.py); while its tenant runs fewer than
# its running bound, else it is queued, its hash naming that worker ('h') for DISPATCH.
ENQUEUE = placement_script("""
local hb, draining, pinned = ARGV[2], ARGV[13], ARGV[3]
$standing
local function takes(w)
  return w and w ~= '' and redis.call('EXISTS', ARGV[2] .. w) == 1
    and redis.call('EXISTS', ARGV[13] .. w) == 0
end
$prefix_holder
local worker = redis.call('HGET', KEYS[1], 'worker')
if not takes(worker) then
  worker = redis.call('GET', KEYS[10])
end
if not takes(worker) then
  worker = prefix_holder(KEYS[12], ARGV[4], tonumber(ARGV[14]))
end
local running = tonumber(redis.call('HGET', KEYS[9], ARGV[6]) or '0')
local bound = tonumber(ARGV[12])
if takes(worker) and (not bound or running < bound) then
  redis.call('XADD', ARGV[3] .. worker, '*', '$field', ARGV[1])
  redis.call('HINCRBY', KEYS[9], ARGV[6], 1)
  redis.call('HINCRBY', KEYS[11], 'admitted', 1)
  return {'pinned', worker}
end
-- the tenant runs as many as it may: the request waits in its queue, for that worker
local holder = takes(worker) and worker or ''
local alive = false
for _, w in ipairs(redis.call('SMEMBERS', ARGV[4])) do
  if takes(w) then
    alive = true
    break
  end
end
if not alive then
  return {'no_worker', ''}
end
local mine = tonumber(redis.call('GET', KEYS[2]) or '0')
if mine >= tonumber(ARGV[9]) then
  redis.call('HINCRBY', KEYS[11], 'refused', 1)
  return {'tenant_full', tostring(mine)}
end
local all = tonumber(redis.call('GET', KEYS[3]) or '0')
if all >= tonumber(ARGV[10]) then
  redis.call('HINCRBY', KEYS[11], 'refused', 1)
  return {'full', tostring(all)}
end
redis.call('HSET', KEYS[4], 'b', ARGV[1], 'c', ARGV[7], 'w', ARGV[8], 'm', ARGV[12], 'h', holder)
redis.call('EXPIRE', KEYS[4], ARGV[11])
redis.call('RPUSH', KEYS[5], ARGV[5])
if not redis.call('ZSCORE', KEYS[6], ARGV[6]) then
  local clock = tonumber(redis.call('HGET', KEYS[7], '~clock') or '0')
  local last = tonumber(redis.call('HGET', KEYS[7], ARGV[6]) or '0')
  redis.call('ZADD', KEYS[6], math.max(clock, last), ARGV[6])
end
redis.call('INCR', KEYS[2])
redis.call('INCR', KEYS[3])
redis.call('XADD', KEYS[8], 'MAXLEN', '~', '1000', '*', 'r', ARGV[5])
redis.call('HINCRBY', KEYS[11], 'admitted', 1)
return {'queued', tostring(all + 1)}
""")

# KEYS: the worker's pinned stream, total queued count, running counts
# ARGV: room for each class in priority order (how many requests in all the worker takes
#       once that class is reached: interactive ones may also take the slots of running
#       batch requests, which they preempt), request-hash prefix, tenant-count prefix,
#       then per class in priority order: active set, virtual times, tenant-list prefix,
#       then (placement) the worker's id, workers set, heartbeat, draining, pinned-stream
#       and wake-stream prefixes, then the charge prefix
DISPATCH = placement_script("""
local me, hb, draining, pinned = ARGV[15], ARGV[17], ARGV[18], ARGV[19]
$standing
local rival, own = nil, nil  -- the first other live worker with a free slot; this one
local function wake(w)  -- one entry is enough: it wakes, then dispatches
  if redis.call('XLEN', ARGV[20] .. w) == 0 then
    redis.call('XADD', ARGV[20] .. w, '*', 'from', me)
  end
end
local function free(w)
  local s = standing(w)
  return s and (not s[4] or s[1] < s[4])
end
local function placed_elsewhere(taken)
  if not own then
    own = standing(me) or {redis.call('XLEN', pinned .. me), 0, me}
    for _, w in ipairs(redis.call('SMEMBERS', ARGV[16])) do
      local s = w ~= me and standing(w)
      if s and (not s[4] or s[1] < s[4]) and (not rival or before(s, rival)) then
        rival = s
      end
    end
  end
  -- this script's own XADDs make its load grow; the others' loads stand still meanwhile
  if not rival or not before(rival, {own[1] + taken, own[2], me}) then
    return false
  end
  wake(rival[3])
  return true
end
local n = 0
for c = 0, 2 do
  local room = tonumber(ARGV[1 + c])
  local active, state, prefix = ARGV[6 + c * 3], ARGV[7 + c * 3], ARGV[8 + c * 3]
  while n < room do
    -- the first tenant by virtual time whose running requests are under its bound
    local tenant, start, holder = nil, nil, ''
    local ranked = redis.call('ZRANGE', active, 0, -1, 'WITHSCORES')
    for i = 1, #ranked, 2 do
      local head = redis.call('LINDEX', prefix .. ranked[i], 0)
      local f = head and redis.call('HMGET', ARGV[4] .. head, 'm', 'h') or {}
      local bound = tonumber(f[1] or '')
      local running = tonumber(redis.call('HGET', KEYS[3], ranked[i]) or '0')
      if not bound or running < bound then
        tenant, start, holder = ranked[i], tonumber(ranked[i + 1]), f[2] or ''
        break
      end
    end
    if not tenant then
      break  -- every tenant of this class is at its bound: the next class may go
    end
    if holder ~= me then
      -- the worker holding its session takes it while it has a free slot; else placement
      if holder ~= '' and free(holder) then
        wake(holder)
        return n
      end
      if placed_elsewhere(n) then
        return n  -- a less loaded worker takes it: the queue's order is left as it is
      end
    end
    local list = prefix .. tenant
    local rid = redis.call('LPOP', list)
    if rid then
      redis.call('DECR', ARGV[5] .. tenant)
      redis.call('DECR', KEYS[2])
      local req = ARGV[4] .. rid
      local f = redis.call('HMGET', req, 'b', 'c', 'w')
      local ttl = redis.call('TTL', req)
      redis.call('DEL', req)
      local finish = start
      if f[1] then  -- else it expired in the queue: its deadline passed
        redis.call('XADD', KEYS[1], '*', '$field', f[1])
        redis.call('HINCRBY', KEYS[3], tenant, 1)
        finish = start + tonumber(f[2]) / tonumber(f[3])
        n = n + 1
        -- kept for END, which refunds what the request did not use
        local charge = ARGV[21] .. rid
        redis.call('HSET', charge, 's', state, 'a', active, 't', tenant, 'c', f[2], 'w', f[3])
        redis.call('EXPIRE', charge, math.max(ttl, 1) + 3600)
      end
      redis.call('HSET', state, '~clock', start, tenant, finish)
      if redis.call('LLEN', list) > 0 then
        redis.call('ZADD', active, finish, tenant)
      else
        redis.call('ZREM', active, tenant)
      end
    else
      redis.call('ZREM', active, tenant)
    end
  end
end
return n
""")

# KEYS: the tenant's list, the request's hash, tenant's queued count, total, active set
# ARGV: request id, tenant
UNQUEUE = """
local removed = redis.call('LREM', KEYS[1], 1, ARGV[1])
if removed == 1 then
  redis.call('DEL', KEYS[2])
  redis.call('DECR', KEYS[3])
  redis.call('DECR', KEYS[4])
  if redis.call('LLEN', KEYS[1]) == 0 then
    redis.call('ZREM', KEYS[5], ARGV[2])
  end
end
return removed
"""


@dataclass(frozen=True, slots=True)
class Admission:
    kind: str  # pinned, queued, no_worker, tenant_full or full
    worker_id: str = ""  # pinned: the worker that holds the session
    queued: int = 0  # queued: requests in the queues now; *_full: the bound's count


Rooms = tuple[int, int, int]  # how many requests a worker takes, by class (see DISPATCH)


def dispatch_args(rooms: Rooms, worker_id: str) -> list[str | int]:
    """ARGV of DISPATCH for this worker with these rooms."""
    args: list[str | int] = [*rooms, keys.queued_request(""), keys.tenant_queued("")]
    for p in PRIORITIES:
        args += [keys.fair_active(p), keys.fair_state(p), keys.fair_queue(p, "")]
    args += [worker_id, keys.WORKERS, keys.heartbeat_key(""), keys.draining_key("")]
    return [*args, keys.pinned_stream(""), keys.worker_wake(""), keys.fair_charge("")]
