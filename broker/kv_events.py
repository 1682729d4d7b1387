"""What travels on the kvstore's stream (keys.KV_EVENTS): workers' session events, and
commands from the gateway and operators.

An event states where one session's KV now is, from the worker's side; applying it twice
gives the same index, so a kvstore that restarts may replay what it had not acknowledged.
A command asks the kvstore to change the index (delete, fork, evict) and names a reply key
that receives exactly one answer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from broker.wire import Fields

# Event kinds, as a worker reports them
HOT = "hot"  # a request started on the session (detail: where its KV came from)
WARM = "warm"  # idle in the worker's pool
DISK = "disk"  # written to its spill file (detail: the file's mtime in ns)
GONE = "gone"  # the worker no longer holds it and wrote no file (detail: why)
INVENTORY = "inventory"  # everything the worker holds (detail: JSON [[key, tier, n, bytes, t]])

# Reasons of a GONE event that the kvstore counts
REJECTED = "rejected"  # its spill file failed a check on restore
WRITE_FAILED = "write_failed"  # the spill write failed (e.g. disk full)
DROPPED = "dropped"  # DeleteSession, or evicted by a worker with no spill directory

# Commands, and what the kvstore answers (EVICT answers the session's tier otherwise)
DELETE = "delete"
FORK = "fork"
EVICT = "evict"
REPLY_OK, REPLY_NOT_FOUND, REPLY_EXISTS = "ok", "not_found", "exists"


@dataclass(frozen=True, slots=True)
class KVEvent:
    kind: str
    worker: str
    key: str  # the session's cache key (tenant/session id); "" for INVENTORY
    num_tokens: int = 0
    nbytes: int = 0  # KV bytes in memory, or the file's size for DISK
    last_used: float = 0.0  # unix seconds
    detail: str = ""
    reply_to: str = ""  # the command this event completes: answered once it is applied

    def encode(self) -> Fields:
        return {
            "e": self.kind,
            "w": self.worker,
            "k": self.key,
            "n": str(self.num_tokens),
            "b": str(self.nbytes),
            "u": f"{self.last_used:.3f}",
            "d": self.detail,
            "r": self.reply_to,
        }

    @classmethod
    def decode(cls, f: Fields) -> KVEvent:
        n, b, u = int(f["n"]), int(f["b"]), float(f["u"])
        return cls(f["e"], f["w"], f["k"], n, b, u, f.get("d", ""), f.get("r", ""))


@dataclass(frozen=True, slots=True)
class Held:
    """One session in a worker's inventory."""

    key: str
    tier: str  # hot or warm
    num_tokens: int
    nbytes: int
    last_used: float


def inventory_event(worker: str, held: list[Held], now: float) -> KVEvent:
    rows = [[h.key, h.tier, h.num_tokens, h.nbytes, round(h.last_used, 3)] for h in held]
    return KVEvent(INVENTORY, worker, "", last_used=now, detail=json.dumps(rows))


def parse_inventory(event: KVEvent) -> list[Held]:
    return [Held(k, t, int(n), int(b), float(u)) for k, t, n, b, u in json.loads(event.detail)]


@dataclass(frozen=True, slots=True)
class KVCommand:
    op: str  # DELETE, FORK or EVICT
    key: str
    reply_to: str  # a keys.reply_key
    new_key: str = ""  # FORK: the new session's cache key
    # unix seconds; past it the caller has given up and was told so: the command is dropped
    deadline: float = 0.0

    def encode(self) -> Fields:
        return {
            "op": self.op,
            "k": self.key,
            "k2": self.new_key,
            "r": self.reply_to,
            "t": f"{self.deadline:.3f}",
        }

    @classmethod
    def decode(cls, f: Fields) -> KVCommand:
        return cls(f["op"], f["k"], f["r"], f.get("k2", ""), float(f.get("t", 0)))


def decode(fields: Fields) -> KVEvent | KVCommand:
    return KVCommand.decode(fields) if "op" in fields else KVEvent.decode(fields)
