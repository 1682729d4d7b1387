"""Placement's ranking of workers, as Lua shared by the scripts that place a request
(DISPATCH, and a draining worker's HAND_OVER in broker/fair_queue.py): a live worker stands
by (load, idle sessions held, id), the least first. Its load is the entries on its pinned
stream (running, paused, waiting for a restore or not yet read: an entry leaves at the
request's end) plus the requests it runs from a dead worker's stream (`num_adopted` in its
heartbeat)."""

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
