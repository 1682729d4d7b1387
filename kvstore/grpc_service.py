"""The operators' gRPC service `warmfleet.v1.KVStore`: usage, and eviction by hand."""

from __future__ import annotations

import grpc
import redis

from broker import keys, kv_commands
from broker.messages import AnswerStatus, CommandOp
from common.enums import Tier
from common.errors import FailedPreconditionError, NotFoundError, UnavailableError
from common.grpc_errors import fail, statuses
from common.grpc_guard import SizeCheck
from common.ids import check_tenant, require_session_id
from common.pb_maps import tier_pb
from common.v1 import kvstore_pb2 as pb
from common.v1 import kvstore_pb2_grpc
from kvstore.service import KVStore

_SERVICE = pb.DESCRIPTOR.services_by_name["KVStore"]
SERVICE_NAME = _SERVICE.full_name
# a request names at most a tenant (64 bytes) and a session id (128): anything much larger
# is refused from its size alone
MAX_REQUEST_BYTES = 1024


def _check_size(size: int) -> str | None:
    if size <= MAX_REQUEST_BYTES:
        return None
    return f"the request is {size} bytes; {SERVICE_NAME}'s are at most {MAX_REQUEST_BYTES}"


def size_checks() -> dict[str, SizeCheck]:
    """Every method's bound, for the server's guard."""
    return {f"/{SERVICE_NAME}/{m.name}": _check_size for m in _SERVICE.methods}


class KVStoreService(kvstore_pb2_grpc.KVStoreServicer):
    def __init__(self, store: KVStore) -> None:
        self.store = store

    def GetUsage(self, request: pb.GetUsageRequest, context: grpc.ServicerContext) -> pb.KVUsage:
        try:
            return self.store.usage()
        except redis.RedisError as e:
            fail(context, UnavailableError(f"redis: {e}"))

    def Evict(self, request: pb.EvictRequest, context: grpc.ServicerContext) -> pb.EvictResponse:
        with statuses(context):
            tenant = check_tenant(request.tenant) if request.tenant else keys.DEFAULT_TENANT
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
