"""Sessions found by their prompts, in Redis (gateway/session_find.py says how they are
used). Keys are tenant-scoped, as the hashes (common/block_hash.py) are.

- A session's head is its latest prompt but the last few tokens: the chain hash of its
  whole blocks keys a hash whose field is the session and whose value the head's length and
  the hash of its tokens past those blocks ("length:hex"). A request naming no session
  whose prompt starts with a head continues that session. One head a session: a new one
  replaces the last. The gateway writes them (REMEMBER).
- The fleet's prefix index: the chain hash after some of a prompt's whole blocks up to its
  head (mark_blocks, its prefix marks) names the session a worker last started a request
  with that prefix on. The gateway puts the marks in the job (Job.prefix_marks), the worker
  that starts it in the session's HOT event, and the kvstore writes them from that event
  (kvstore/writer.py). Which worker holds each such session warm, or that it is on disk,
  is its record, kept by the kvstore from the same events. FIND takes the longest marked
  prefix whose session a worker holds in memory, so that a new session goes to that
  worker (which then shares all the leading blocks, marked or not); when none is held, the
  longest whose session is on disk, so that the worker it lands on reads those blocks from
  its host's spill directory where they are (worker/shared_prefix.py).

Heads expire HEAD_TTL_S after the last request that wrote them, marks MARK_TTL_S after the
last request started on them. A prompt has at most MAX_MARKS marks: a tenant sending many
long prompts costs Redis ~15 KB each."""

from __future__ import annotations

from dataclasses import dataclass

HEAD_TTL_S = 24 * 3600
MARK_TTL_S = 3600
MAX_MARKS = 128


def mark_blocks(num_blocks: int) -> list[int]:
    """Which whole blocks of a prompt of `num_blocks` are marked (counts from its start):
    every 4th up to 64 (a system prompt's end within 64 tokens of 16), then every 32nd,
    at most MAX_MARKS (up to ~58k tokens)."""
    fine = range(4, min(num_blocks, 64) + 1, 4)
    coarse = range(96, num_blocks + 1, 32)
    return [*fine, *coarse][:MAX_MARKS]


@dataclass(frozen=True, slots=True)
class PrefixHolder:
    """The session a worker last started on the longest marked prefix of a prompt, held in
    memory by `worker`; else, with no worker, the one on the longest such prefix whose
    session is on disk (its blocks are in its host's spill directory); `mark`: which of the
    prompt's marks (1 = the first), 0 when no session holds one."""

    session_id: str = ""
    worker: str = ""
    mark: int = 0


def head_key(tenant: str, blocks: bytes) -> str:
    """Hash: each session whose head's whole blocks hash to `blocks`, and its head's rest."""
    return f"wf:head:{tenant}:{blocks.hex()}"


def head_of_key(tenant: str, session_id: str) -> str:
    """String: the hash (hex) of the whole blocks of the session's head, so that its next
    head replaces it."""
    return f"wf:headof:{tenant}:{session_id}"


def head_prefix(tenant: str) -> str:
    return f"wf:head:{tenant}:"


def mark_key(tenant: str, mark: bytes) -> str:
    """String: the session a worker last started a request with the blocks of `mark` on."""
    return f"wf:prefix:{tenant}:{mark.hex()}"


def mark_prefix(tenant: str) -> str:
    return f"wf:prefix:{tenant}:"


# KEYS: the new head's key, the session's head-of key
# ARGV: the new head's blocks (hex), the session id, the tenant's head-key prefix, the
#       head's "length:hex", the heads' ttl (s)
REMEMBER = """
local old = redis.call('GET', KEYS[2])
if old and old ~= ARGV[1] then
  redis.call('HDEL', ARGV[3] .. old, ARGV[2])
end
redis.call('HSET', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('SET', KEYS[2], ARGV[1], 'EX', ARGV[5])
"""

# KEYS: the session's head-of key; ARGV: the session id, the tenant's head-key prefix
FORGET = """
local old = redis.call('GET', KEYS[1])
if old then
  redis.call('HDEL', ARGV[2] .. old, ARGV[1])
end
redis.call('DEL', KEYS[1])
"""

# KEYS: the head keys of a prompt's whole blocks in order, then its prefix marks' keys
# ARGV: how many head keys, the tenant's session-record key prefix
# Returns {the session of the latest mark whose session a worker holds in memory (its
# record names one), else of the latest whose session is on disk, or '', {block count,
# session, head's rest, ...} of every head among the blocks, that worker ('' on disk), that
# mark's place among the marks or 0}
FIND = """
local n = tonumber(ARGV[1])
local heads = {}
for i = 1, n do
  local all = redis.call('HGETALL', KEYS[i])
  for j = 1, #all, 2 do
    table.insert(heads, tostring(i))
    table.insert(heads, all[j])
    table.insert(heads, all[j + 1])
  end
end
local on_disk = {'', heads, '', 0}
for i = #KEYS, n + 1, -1 do
  local holder = redis.call('GET', KEYS[i])
  if holder then
    local record = redis.call('HMGET', ARGV[2] .. holder, 'worker', 'tier')
    if record[1] and record[1] ~= '' then
      return {holder, heads, record[1], i - n}
    end
    if record[2] == 'disk' and on_disk[4] == 0 then
      on_disk = {holder, heads, '', i - n}
    end
  end
end
return on_disk
"""
