"""The operators' gRPC service `warmfleet.v1.KVStore`: usage, and eviction by hand."""

from __future__ import annotations

import grpc
import redis

from broker import keys, kv_commands
from broker.messages import AnswerStatus, CommandOp
from common.enums import Tier
from common.errors import FailedPreconditionError, NotFoundError, UnavailableError
from common.grpc_errors import fail, statuses
from common.ids import require_session_id
from common.pb_maps import tier_pb
from common.v1 import kvstore_pb2 as pb
from common.v1 import kvstore_pb2_grpc
from kvstore.service import KVStore

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["KVStore"].full_name


class KVStoreService(kvstore_pb2_grpc.KVStoreServicer):
    def __init__(self, store: KVStore) -> None:
        self.store = store

    def GetUsage(self, request: pb.GetUsageRequest, context: grpc.ServicerContext) -> pb.KVUsage:
        store, index = self.store, self.store.index
        try:
            counters, behind = store.counters(), store.events_behind()
        except redis.RedisError as e:
            fail(context, UnavailableError(f"redis: {e}"))
        with store.lock:
            workers = sorted(set(store.statuses) | {r.worker for r in index.records.values()})
            usage = [self._worker(w) for w in workers if w]
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
            warm_bytes=index.warm_bytes(worker),
            spilling_bytes=sum(of(Tier.SPILLING)),
            num_hot=len(of(Tier.HOT)),
            num_warm=len(of(Tier.WARM)),
            num_spilling=len(of(Tier.SPILLING)),
        )

    def Evict(self, request: pb.EvictRequest, context: grpc.ServicerContext) -> pb.EvictResponse:
        tenant = request.tenant or keys.DEFAULT_TENANT
        with statuses(context):
            session_id = require_session_id(request.session_id)
            key = keys.cache_key(tenant, session_id)
            try:
                answer = kv_commands.call(self.store.r, CommandOp.EVICT, key)
            except redis.RedisError as e:
                raise UnavailableError(str(e)) from e
            if answer.status == AnswerStatus.NOT_FOUND:
                raise NotFoundError(f"no session {session_id!r}")
            if answer.tier == Tier.HOT:
                raise FailedPreconditionError(
                    f"session {session_id!r} is in a running request; it is not evicted"
                )
            return pb.EvictResponse(tier=tier_pb(answer.tier))


_COUNTERS = [f.name for f in pb.KVCounters.DESCRIPTOR.fields]
