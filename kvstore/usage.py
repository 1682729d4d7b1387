"""The kvstore's usage report (`KVStore.GetUsage`): per-worker warm bytes against their
budgets, the disk against its budget, sessions per tier, counters. Built in one place
(`KVStore.usage` calls it) for the gRPC service, the copy published in Redis for dashboards
(`wf:kv:usage`) and the Prometheus metrics, from the index's public state."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from google.protobuf.message import Message

from common.enums import Tier
from common.v1 import kvstore_pb2 as pb
from kvstore.index import ResidencyIndex

COUNTERS = [f.name for f in pb.KVCounters.DESCRIPTOR.fields]


def build(
    index: ResidencyIndex,
    statuses: dict[str, dict[str, Any]],
    spill_dir: Path,
    counters: dict[str, int],
    events_behind: int,
) -> pb.KVUsage:
    """The report of `index` (not changed meanwhile), the workers' heartbeats (`statuses`),
    the spill directory, the counters and the events not yet applied."""
    table = index.table
    workers = sorted(set(statuses) | {r.worker for r in table.records.values()})
    tiers = table.tier_counts()
    disk = pb.DiskUsage(
        spill_dir=str(spill_dir),
        used_bytes=table.disk.used,
        budget_bytes=index.disk_budget or 0,
        num_files=tiers["disk"],
    )
    return pb.KVUsage(
        workers=[_worker(index, w, statuses.get(w, {})) for w in workers if w],
        disk=disk,
        tiers=pb.TierCounts(**tiers),
        counters=pb.KVCounters(**{f: counters.get(f, 0) for f in COUNTERS}),
        events_behind=events_behind,
    )


def to_json(usage: pb.KVUsage) -> str:
    """The report as JSON with the proto's field names, every field present, numbers as
    numbers (protobuf's own JSON mapping writes 64-bit ones as strings)."""
    return json.dumps(_as_dict(usage), sort_keys=True)


def _as_dict(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        repeated = field.is_repeated
        if field.type == field.TYPE_MESSAGE:
            out[field.name] = [_as_dict(v) for v in value] if repeated else _as_dict(value)
        else:
            out[field.name] = list(value) if repeated else value
    return out


def _worker(index: ResidencyIndex, worker: str, status: dict[str, Any]) -> pb.WorkerUsage:
    records = [index.table.records[k] for k in index.table.on_worker(worker)]

    def of(tier: str) -> list[int]:
        return [r.nbytes for r in records if r.tier == tier]

    return pb.WorkerUsage(
        worker_id=worker,
        alive=worker in index.alive,
        pool_bytes=int(status.get("pool_bytes", 0)),
        warm_budget_bytes=index.budgets.get(worker, 0),
        warm_bytes=index.table.warm_bytes(worker),
        spilling_bytes=sum(of(Tier.SPILLING)),
        num_hot=len(of(Tier.HOT)),
        num_warm=len(of(Tier.WARM)),
        num_spilling=len(of(Tier.SPILLING)),
    )
