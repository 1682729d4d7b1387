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
from kvstore import usage
from kvstore.service import KVStore

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["KVStore"].full_name


class KVStoreService(kvstore_pb2_grpc.KVStoreServicer):
    def __init__(self, store: KVStore) -> None:
        self.store = store

    def GetUsage(self, request: pb.GetUsageRequest, context: grpc.ServicerContext) -> pb.KVUsage:
        try:
            return usage.build(self.store)
        except redis.RedisError as e:
            fail(context, UnavailableError(f"redis: {e}"))

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
