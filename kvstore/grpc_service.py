"""The operators' gRPC service `warmfleet.v1.KVStore`: usage, and eviction by hand."""

from __future__ import annotations

import grpc
import redis

from broker import keys, kv_commands
from broker import kv_events as ev
from gateway.validate import require_session_id
from kvstore.index import HOT, SPILLING, WARM
from kvstore.service import KVStore
from warmfleet.errors import InvalidRequestError, ServiceError
from warmfleet.grpc_serve import abort
from warmfleet.v1 import inference_pb2 as ipb
from warmfleet.v1 import kvstore_pb2 as pb
from warmfleet.v1 import kvstore_pb2_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["KVStore"].full_name
TIER = {
    "hot": ipb.TIER_HOT,
    "warm": ipb.TIER_WARM,
    "spilling": ipb.TIER_SPILLING,
    "disk": ipb.TIER_DISK,
    "gone": ipb.TIER_GONE,
}


class KVStoreService(kvstore_pb2_grpc.KVStoreServicer):
    def __init__(self, store: KVStore) -> None:
        self.store = store

    def GetUsage(self, request: pb.GetUsageRequest, context: grpc.ServicerContext) -> pb.KVUsage:
        store, index = self.store, self.store.index
        try:
            counters, behind = store.counters(), store.events_behind()
        except redis.RedisError as e:
            abort(context, grpc.StatusCode.UNAVAILABLE, f"redis: {e}")
        with store.lock:
            workers = sorted(set(store.statuses) | {r.worker for r in index.records.values()})
            usage = [self._worker(w) for w in workers if w]
            tiers = index.tier_counts()
            disk = pb.DiskUsage(
                spill_dir=str(store.spill_dir),
                used_bytes=index.disk_bytes,
                budget_bytes=index.disk_budget or 0,
                num_files=tiers["disk"],
            )
        return pb.KVUsage(
            workers=usage,
            disk=disk,
            tiers=pb.TierCounts(**tiers),
            counters=pb.KVCounters(**{f: counters.get(f, 0) for f in _COUNTERS}),
            events_behind=behind,
        )

    def _worker(self, worker: str) -> pb.WorkerUsage:
        index, status = self.store.index, self.store.statuses.get(worker, {})
        records = [index.records[k] for k in index.on_worker(worker)]

        def of(tier: str) -> list[int]:
            return [r.nbytes for r in records if r.tier == tier]

        return pb.WorkerUsage(
            worker_id=worker,
            alive=worker in index.alive,
            pool_bytes=int(status.get("pool_bytes", 0)),
            warm_budget_bytes=index.budgets.get(worker, 0),
            warm_bytes=sum(of(WARM)),
            spilling_bytes=sum(of(SPILLING)),
            num_hot=len(of(HOT)),
            num_warm=len(of(WARM)),
            num_spilling=len(of(SPILLING)),
        )

    def Evict(self, request: pb.EvictRequest, context: grpc.ServicerContext) -> pb.EvictResponse:
        tenant = request.tenant or keys.DEFAULT_TENANT
        try:
            session_id = require_session_id(request.session_id)
            answer = kv_commands.call(self.store.r, ev.EVICT, keys.cache_key(tenant, session_id))
        except InvalidRequestError as e:
            abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        except (ServiceError, redis.RedisError) as e:
            abort(context, grpc.StatusCode.UNAVAILABLE, str(e))
        if answer == ev.REPLY_NOT_FOUND:
            abort(context, grpc.StatusCode.NOT_FOUND, f"no session {session_id!r}")
        if answer == HOT:
            abort(
                context,
                grpc.StatusCode.FAILED_PRECONDITION,
                f"session {session_id!r} is in a running request; it is not evicted",
            )
        return pb.EvictResponse(tier=TIER.get(answer, ipb.TIER_UNSPECIFIED))


_COUNTERS = [f.name for f in pb.KVCounters.DESCRIPTOR.fields]
