"""Placement's ranking of workers, as Lua shared by the scripts that place a request
(broker/fair_queue.py's DISPATCH, and a draining worker's HAND_OVER here): a live worker stands
by (load, idle sessions held, id), the least first. Its load is the entries on its pinned
stream (running, paused, waiting for a restore or not yet read: an entry leaves at the
request's end) plus the requests it runs from a dead worker's stream (`num_adopted` in its
heartbeat).

Prefix placement: a request whose session no live worker holds, but whose prompt starts
with blocks another session of its tenant sent last (the gateway finds that session by the
prompt's prefix marks, broker/prompt_heads.py), goes straight to the worker holding that
session in memory, whose pool then shares those blocks, if that worker has a free batch
slot (load under `max_running`) and runs at most PREFIX_SLACK requests more than the least
loaded live worker. Otherwise the queue places it as any new session, on the least loaded
worker, which recomputes the prefix: that costs less than waiting for a slot to free (a
whole reply: seconds), or than slowing every step of a busier batch while another worker
idles, unless the prefix runs to thousands of tokens on a CPU. So agents sharing a system
prompt fill the holder up to the slack, then spread, and the next ones follow whichever
session sent the prefix last."""

from __future__ import annotations

from string import Template

from broker import keys
from broker.codec import FIELD

PREFIX_SLACK = 2  # requests a prefix's holder may run beyond the least loaded worker

# Needs the locals hb, draining and pinned (the heartbeat, draining and pinned-stream key
# prefixes). standing(w): {load, idle sessions, id, batch slots (nil if unknown)}, or nil
# when w takes nothing now (no heartbeat, or draining).
STANDING = """
local function standing(w)
  local raw = redis.call('GET', hb .. w)
  if not raw or redis.call('EXISTS', draining .. w) == 1 then
    return nil
  end
  local ok, s = pcall(cjson.decode, raw)
  if not ok or type(s) ~= 'table' then
    s = {}
  end
  local load = redis.call('XLEN', pinned .. w) + (tonumber(s.num_adopted) or 0)
  return {load, tonumber(s.num_sessions) or 0, w, tonumber(s.max_running)}
end
local function before(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  if a[2] ~= b[2] then return a[2] < b[2] end
  return a[3] < b[3]
end
"""

# Needs standing() above and takes(w) (the worker takes requests). prefix_holder(record,
# workers, slack): the worker holding the session of hash `record` in memory, if it has
# room for one more request (see above), else nil.
PREFIX_HOLDER = """
local function prefix_holder(record, workers, slack)
  local holder = redis.call('HGET', record, 'worker')
  local s = takes(holder) and standing(holder)
  if not s or (s[4] ~= nil and s[1] >= s[4]) then
    return nil
  end
  for _, w in ipairs(redis.call('SMEMBERS', workers)) do
    local o = standing(w)
    if o and o[1] + slack < s[1] then
      return nil
    end
  end
  return holder
end
"""


def placement_script(script: str) -> str:
    """A script with the stream field that holds a message (codec.FIELD) and the ranking of
    workers above filled in."""
    return Template(script).substitute(field=FIELD, standing=STANDING, prefix_holder=PREFIX_HOLDER)


# A draining worker hands a request it has not started to the worker placement would pick
# (the first by `before` among those with a free slot, else the first of all), in one step
# (the entry leaves its stream as it joins the other).
# KEYS: the draining worker's pinned stream
# ARGV: entry id, the job (encoded), heartbeat prefix, pinned-stream prefix, workers set, draining
#       prefix, the draining worker's id, the consumer group
HAND_OVER = placement_script("""
local me, hb, draining, pinned = ARGV[7], ARGV[3], ARGV[6], ARGV[4]
$standing
local best, room = nil, false
for _, w in ipairs(redis.call('SMEMBERS', ARGV[5])) do
  local s = w ~= me and standing(w)
  if s then
    local free = not s[4] or s[1] < s[4]
    if not best or (free and not room) or (free == room and before(s, best)) then
      best, room = s, free
    end
  end
end
if not best then
  return ''
end
redis.call('XADD', pinned .. best[3], '*', '$field', ARGV[2])
redis.call('XACK', KEYS[1], ARGV[8], ARGV[1])
redis.call('XDEL', KEYS[1], ARGV[1])
return best[3]
""")


# The workers that take requests now (the same rule as ENQUEUE's).
# ARGV: workers set, heartbeat prefix, draining prefix
LIVE_WORKERS = """
local live = {}
for _, w in ipairs(redis.call('SMEMBERS', ARGV[1])) do
  if redis.call('EXISTS', ARGV[2] .. w) == 1 and redis.call('EXISTS', ARGV[3] .. w) == 0 then
    table.insert(live, w)
  end
end
return live
"""


def live_workers_args() -> list[str]:
    """ARGV of LIVE_WORKERS."""
    return [keys.WORKERS, keys.heartbeat_key(""), keys.draining_key("")]
