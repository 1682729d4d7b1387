"""The whole fleet at a glance, read from Redis in a few pipelined round trips: the queues
(depth and oldest wait per class and tenant), the workers (their heartbeats), the sessions
(how many, and the most recently used), the kvstore's usage report (with the sessions per
tier) and the gateways' counters. The dashboard, `/metrics` and `warmfleet top` all show
this one snapshot. Its parts are read one after another, not in one transaction: while
requests move, `waiting` may briefly differ from the sum of the lanes' depths.

A snapshot is plain JSON-ready data:

    {"time": unix s,
     "queues": {"waiting": n, "running": {tenant: n}, "admitted": n, "refused": n,
                "lanes": [{"priority", "tenant", "depth", "oldest_age_s"}]},
     "workers": [{"id", "state": "alive"|"draining"|"gone", "heartbeat_age_s", "running",
                  "paused", "slots", "sessions", "pool_bytes", "warm_budget", "kv_blocks",
                  "kv_dtype", "kv_bytes_per_token", "sessions_per_gib",
                  "steps", "generated_tokens", "prefill_tokens", "step_seconds", "weights"}],
     "sessions": {"total": n, "tiers": {tier: n},
                  "recent": [{"tenant", "session_id", "tier", "worker", "tokens", "bytes",
                              "last_used"}]},
     "kvstore": {"alive": bool, "usage": GetUsage as JSON, or null while it is down},
     "responses": {"grpc OK": n, "http 429": n, ...}}

`rates(before, after)` turns two snapshots into per-second figures.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from broker import codec, keys
from broker.messages import Job
from broker.records import SessionRecord
from common.enums import PRIORITIES
from common.errors import ProtocolError

Snapshot = dict[str, Any]
Lane = dict[str, Any]
GIB = 1 << 30
RECENT_SESSIONS = 500  # sessions listed per snapshot at most (most recently used first)
RESPONSE_PREFIX = "status:"  # fields of keys.STATS that count responses by status


async def read(r: aioredis.Redis, max_sessions: int = RECENT_SESSIONS) -> Snapshot:
    """One snapshot of the fleet (raises redis.RedisError)."""
    now = time.time()
    pipe = r.pipeline(transaction=False)
    pipe.smembers(keys.WORKERS)
    for p in PRIORITIES:
        pipe.zrange(keys.fair_active(p), 0, -1)
    for key in (keys.RUNNING, keys.STATS):
        pipe.hgetall(key)
    pipe.mget([keys.QUEUED, keys.KV_USAGE])
    pipe.exists(keys.KVSTORE_HEARTBEAT)
    pipe.smembers(keys.TENANTS)
    found = await pipe.execute()
    workers, *active, running, stats, (queued, usage_json), kv_alive, tenants = found
    lanes = [(p, t) for p, names in zip(PRIORITIES, active, strict=True) for t in sorted(names)]
    usage = json.loads(usage_json) if usage_json else None
    lane_list, worker_list, sessions = await asyncio.gather(  # independent: one wait, not three
        _lanes(r, lanes, now), _workers(r, sorted(workers), now),
        _sessions(r, sorted(tenants), max_sessions),
    )  # fmt: skip
    return {
        "time": now,
        "queues": {
            "waiting": int(queued or 0),
            "running": {t: int(n) for t, n in sorted(running.items()) if int(n) > 0},
            "admitted": int(stats.get("admitted", 0)),
            "refused": int(stats.get("refused", 0)),
            "lanes": lane_list,
        },
        "workers": worker_list,
        "sessions": {
            **sessions,
            "tiers": dict(usage["tiers"]) if usage else {},
        },
        "kvstore": {"alive": bool(kv_alive), "usage": usage},
        "responses": {
            k.removeprefix(RESPONSE_PREFIX): int(v)
            for k, v in sorted(stats.items())
            if k.startswith(RESPONSE_PREFIX)
        },
    }


async def _lanes(r: aioredis.Redis, lanes: Sequence[tuple[str, str]], now: float) -> list[Lane]:
    """Each non-empty fair queue: its depth and how long its head has waited."""
    pipe = r.pipeline(transaction=False)
    for p, t in lanes:
        pipe.llen(keys.fair_queue(p, t))
        pipe.lindex(keys.fair_queue(p, t), 0)
    found = await pipe.execute()
    depths, heads = found[0::2], found[1::2]
    pipe = r.pipeline(transaction=False)
    for rid in heads:
        pipe.hget(keys.queued_request(rid or ""), "b")
    bodies = await pipe.execute() if heads else []
    return [
        {"priority": p, "tenant": t, "depth": int(depth), "oldest_age_s": _age(body, now)}
        for (p, t), depth, body in zip(lanes, depths, bodies, strict=True)
        if int(depth)
    ]


async def _workers(r: aioredis.Redis, workers: list[str], now: float) -> list[dict[str, Any]]:
    pipe = r.pipeline(transaction=False)
    for w in workers:
        pipe.get(keys.heartbeat_key(w))
        pipe.exists(keys.draining_key(w))
    found = await pipe.execute()
    return [
        _worker(w, beat, bool(draining), now)
        for w, beat, draining in zip(workers, found[0::2], found[1::2], strict=True)
    ]


async def _sessions(r: aioredis.Redis, tenants: list[str], max_sessions: int) -> dict[str, Any]:
    """How many sessions the tenants have, and the most recently used ones."""
    pipe = r.pipeline(transaction=False)
    for t in tenants:
        pipe.zcard(keys.session_index(t))
        pipe.zrevrange(keys.session_index(t), 0, max_sessions - 1, withscores=True)
    found = await pipe.execute()
    listed = zip(tenants, found[1::2], strict=True)
    recent = sorted(((score, t, sid) for t, ids in listed for sid, score in ids), reverse=True)
    recent = recent[:max_sessions]
    pipe = r.pipeline(transaction=False)
    for _, t, sid in recent:
        pipe.hgetall(keys.session_key(t, sid))
    records = await pipe.execute() if recent else []
    return {
        "total": sum(int(n) for n in found[0::2]),
        "recent": [
            _session(t, sid, fields)
            for (_, t, sid), fields in zip(recent, records, strict=True)
            if fields  # deleted since it was listed
        ],
    }


def rates(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """Per-second figures between two snapshots: admitted and refused requests, tokens
    generated (all workers, and each), each worker's mean step time, responses by status."""
    dt = max(1e-3, after["time"] - before["time"])

    def per_s(new: float, old: float) -> float:
        return max(0.0, new - old) / dt  # a restart (Redis, a worker) counts from zero

    earlier = {w["id"]: w for w in before["workers"]}
    by_worker, step_ms = {}, {}
    for w in after["workers"]:
        old = earlier.get(w["id"], w)
        by_worker[w["id"]] = per_s(w["generated_tokens"], old["generated_tokens"])
        steps = w["steps"] - old["steps"]
        took = w["step_seconds"] - old["step_seconds"]
        step_ms[w["id"]] = round(1000 * took / steps, 3) if steps > 0 and took >= 0 else None
    qa, qb = after["queues"], before["queues"]
    return {
        "admitted_per_s": per_s(qa["admitted"], qb["admitted"]),
        "refused_per_s": per_s(qa["refused"], qb["refused"]),
        "tokens_per_s": sum(by_worker.values()),
        "tokens_per_s_by_worker": by_worker,
        "step_ms_by_worker": step_ms,  # mean step between the two (None: no step)
        "responses_per_s": {
            code: per_s(n, before["responses"].get(code, 0))
            for code, n in after["responses"].items()
        },
    }


def _age(body: str | None, now: float) -> float | None:
    """How long the request at a lane's head has waited (None: it left meanwhile)."""
    if not body:
        return None
    try:
        job = codec.decode(body, Job)
    except ProtocolError:
        return None
    return round(max(0.0, now - job.accepted_at), 3)


def _worker(worker_id: str, beat: str | None, draining: bool, now: float) -> dict[str, Any]:
    # no heartbeat: registered, but dead (or not yet deregistered); its figures are zeros
    s: dict[str, Any] = json.loads(beat) if beat else {"at": now}
    return {
        "id": worker_id,
        "state": "gone" if not beat else "draining" if draining or s.get("stopping") else "alive",
        "heartbeat_age_s": round(max(0.0, now - s.get("at", now)), 3),
        "running": s.get("num_running", 0) - len(s.get("paused", [])),
        "paused": len(s.get("paused", [])),
        "slots": s.get("max_running", 0),
        "sessions": s.get("num_sessions", 0),
        "pool_bytes": s.get("pool_bytes", 0),
        "warm_budget": s.get("warm_budget", 0),
        "kv_blocks": s.get("kv_blocks", {}),
        "kv_dtype": s.get("kv_dtype", ""),
        "kv_bytes_per_token": s.get("kv_bytes_per_token", 0),
        "sessions_per_gib": sessions_per_gib(s.get("num_sessions", 0), s.get("pool_bytes", 0)),
        "steps": s.get("steps", 0),
        "generated_tokens": s.get("generated_tokens", 0),
        "prefill_tokens": s.get("prefill_tokens", 0),
        "step_seconds": s.get("step_seconds", 0.0),
        "weights": s.get("weights", ""),
    }


def sessions_per_gib(num_sessions: int, pool_bytes: int) -> float | None:
    """The warm sessions a GiB holds at their mean size, shared blocks counted once (None
    while none is held)."""
    return round(num_sessions * GIB / pool_bytes, 1) if num_sessions and pool_bytes else None


def _session(tenant: str, session_id: str, fields: dict[str, str]) -> dict[str, Any]:
    record = SessionRecord.from_fields(fields)
    return {
        "tenant": tenant,
        "session_id": session_id,
        "tier": str(record.tier),
        "worker": record.worker,
        "tokens": record.num_tokens,
        "bytes": record.nbytes,
        "last_used": record.last_used,
    }
