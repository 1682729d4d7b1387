"""The kvstore's usage report (`KVStore.GetUsage`): per-worker warm bytes against their
budgets, the disk against its budget, sessions per tier, counters. Built in one place for
the gRPC service, the copy published in Redis for dashboards (`wf:kv:usage`) and the
Prometheus metrics."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from google.protobuf import json_format

from common.enums import Tier
from common.v1 import kvstore_pb2 as pb

if TYPE_CHECKING:
    from kvstore.service import KVStore

COUNTERS = [f.name for f in pb.KVCounters.DESCRIPTOR.fields]


def build(store: KVStore) -> pb.KVUsage:
    """Usage now (raises redis.RedisError: the counters and backlog are read from Redis)."""
    counters, behind = store.counters(), store.events_behind()
    index = store.index
    with store.lock:
        workers = sorted(set(store.statuses) | {r.worker for r in index.records.values()})
        usage = [_worker(store, w) for w in workers if w]
        tiers = index.tier_counts()
        disk = pb.DiskUsage(
            spill_dir=str(store.spill_dir),
            used_bytes=index.disk_used,
            budget_bytes=index.disk_budget or 0,
            num_files=tiers["disk"],
        )
    return pb.KVUsage(
        workers=usage,
        disk=disk,
        tiers=pb.TierCounts(**tiers),
        counters=pb.KVCounters(**{f: counters.get(f, 0) for f in COUNTERS}),
        events_behind=behind,
    )


def to_json(usage: pb.KVUsage) -> str:
    """The report as JSON with the proto's field names, every field present."""
    as_dict = json_format.MessageToDict(
        usage, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return json.dumps(as_dict, sort_keys=True)


def _worker(store: KVStore, worker: str) -> pb.WorkerUsage:
    index, status = store.index, store.statuses.get(worker, {})
    records = [index.records[k] for k in index.on_worker(worker)]

    def of(tier: str) -> list[int]:
        return [r.nbytes for r in records if r.tier == tier]

    return pb.WorkerUsage(
        worker_id=worker,
        alive=worker in index.alive,
        pool_bytes=int(status.get("pool_bytes", 0)),
        warm_budget_bytes=index.budgets.get(worker, 0),
        warm_bytes=index.warm_bytes(worker),
        spilling_bytes=sum(of(Tier.SPILLING)),
        num_hot=len(of(Tier.HOT)),
        num_warm=len(of(Tier.WARM)),
        num_spilling=len(of(Tier.SPILLING)),
    )
