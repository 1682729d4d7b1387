"""Checks of the kvstore's work against what the workers report and the files on disk."""

from __future__ import annotations

import time
from pathlib import Path

import redis as redis_lib

from broker import keys
from common.v1 import inference_pb2 as pb
from common.v1 import kvstore_pb2 as kvpb
from engine.kv_files.spill_file import SpillStore, read_summary
from engine.model import Model
from tests.cluster_helpers import records, settle, worker_status
from warmfleet.client import KVStoreClient
from warmfleet.launcher import Cluster


def assert_within_budget(r: redis_lib.Redis, usage: kvpb.KVUsage, budget: int) -> None:
    """Each worker's idle sessions hold at most `budget` bytes (shared blocks once), as the
    kvstore counts them and as the worker does."""
    for w in usage.workers:
        assert w.warm_budget_bytes == budget
        assert w.warm_bytes <= budget, f"{w.worker_id} holds {w.warm_bytes} warm bytes"
        assert worker_status(r, w.worker_id)["pool_bytes"] <= budget


def files_by_session(spill_dir: Path) -> dict[str, Path]:
    found = {}
    for path in spill_dir.glob("*.wfkv"):
        summary = read_summary(path)
        assert summary is not None, f"unreadable spill file {path}"
        found[keys.split_cache_key(summary.key)[1]] = path
    return found


def index_mismatches(r: redis_lib.Redis, cluster: Cluster, spill_dir: Path) -> list[str]:
    """Where the index disagrees with what the workers report holding and the files."""
    index = records(r)
    found = []
    with KVStoreClient(cluster.kvstore_target) as kv:
        counted = {w.worker_id: w.warm_bytes for w in kv.usage().workers}
    for worker in cluster.worker_ids:
        status = worker_status(r, worker)
        held = {sid: rec for sid, rec in index.items() if rec["worker"] == worker}
        if any(rec["tier"] != "warm" for rec in held.values()):
            found.append(f"{worker}: not all warm: {held}")
        if len(held) != status["num_sessions"]:
            found.append(f"{worker} holds {status['num_sessions']}, index says {sorted(held)}")
        if counted.get(worker, 0) != status["pool_bytes"]:
            found.append(f"{worker} pool {status['pool_bytes']} bytes, index says {counted}")
        if sum(int(rec["kv_bytes"]) for rec in held.values()) < status["pool_bytes"]:
            found.append(f"{worker}: its sessions' blocks are fewer than its pool holds")
    on_disk = {sid for sid, rec in index.items() if rec["tier"] == "disk"}
    files = set(files_by_session(spill_dir))
    if on_disk != files:
        extra = {sid: index.get(sid) for sid in files - on_disk}
        found.append(f"disk: index only {on_disk - files}, files only {extra}")
    return found


def assert_index_matches_workers_and_disk(
    r: redis_lib.Redis, cluster: Cluster, spill_dir: Path, after: str = ""
) -> None:
    """Within a few seconds (a worker's status is published every 0.5 s); `after` names
    what was just done, for the message."""
    deadline = time.monotonic() + 10
    while (found := index_mismatches(r, cluster, spill_dir)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not found, (after, found)


def spill_file(spill_dir: Path, session_id: str) -> Path:
    return files_by_session(spill_dir)[session_id]


def evict(kv: KVStoreClient, r: redis_lib.Redis, session_id: str) -> None:
    assert kv.evict(session_id) == pb.TIER_SPILLING
    settle(r, kv)
    assert records(r)[session_id]["tier"] == "disk"


def rewrite_with_fingerprint(path: Path, model: Model, fingerprint: str) -> None:
    summary = read_summary(path)
    assert summary is not None
    c = model.config
    kv = SpillStore(path.parent, model.fingerprint).read(
        summary.key, like=(c.num_layers, c.num_kv_heads, c.head_dim), dtype=model.dtype
    )
    assert kv is not None
    SpillStore(path.parent, fingerprint).write(summary.key, kv)
