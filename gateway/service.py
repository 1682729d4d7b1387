"""The gRPC face of the gateway: `warmfleet.v1.Inference` over GatewayCore."""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from broker.messages import Completion
from broker.records import SessionRecord
from common.grpc_errors import statuses
from common.ids import require_session_id
from common.pb_maps import FINISH_REASON, KV_SOURCE, tier_pb
from common.v1 import inference_pb2 as pb
from common.v1 import inference_pb2_grpc
from engine.config import ModelConfig
from engine.tokenizer import Tokenizer
from gateway.auth import KeyRing, Tenant
from gateway.core import GatewayCore
from gateway.validate import build_job

SESSION_METADATA_KEY = "x-session-id"


def completion_pb(c: Completion) -> pb.Completion:
    u, t = c.usage, c.timings
    usage = pb.Usage(
        prompt_tokens=u.prompt_tokens,
        cached_tokens=u.cached_tokens,
        completion_tokens=u.completion_tokens,
    )
    timings = pb.Timings(
        queue_wait_s=t.queue_wait_s,
        time_to_first_token_s=t.time_to_first_token_s,
        decode_tokens_per_s=t.decode_tokens_per_s,
        total_s=t.total_s,
    )
    return pb.Completion(
        request_id=c.request_id,
        finish_reason=FINISH_REASON[c.finish_reason],
        usage=usage,
        timings=timings,
        worker_id=c.worker_id,
        kv_source=KV_SOURCE[c.kv_source],
        seed=c.seed,
    )


def session_pb(session_id: str, record: SessionRecord) -> pb.Session:
    return pb.Session(
        session_id=session_id,
        tier=tier_pb(record.tier),
        worker_id=record.worker,
        num_tokens=record.num_tokens,
        kv_bytes=record.nbytes,
        last_used_unix_s=record.last_used,
    )


class InferenceService(inference_pb2_grpc.InferenceServicer):
    def __init__(
        self, core: GatewayCore, tokenizer: Tokenizer, model_config: ModelConfig, keys: KeyRing
    ) -> None:
        self.core = core
        self.tokenizer = tokenizer
        self.model_config = model_config
        self.keys = keys

    def Generate(
        self, request: pb.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.GenerateResponse]:
        with statuses(context):
            tenant = self._tenant(context)
            metadata = dict(context.invocation_metadata())
            session_id = request.session_id or str(metadata.get(SESSION_METADATA_KEY, ""))
            remaining = context.time_remaining()
            timeout_s = self.core.config.default_timeout_s
            timeout_s = min(remaining, timeout_s) if remaining else timeout_s
            job = build_job(request, session_id, tenant.name, self.tokenizer, self.model_config,
                            timeout_s)  # fmt: skip
            self.core.admit(job, tenant, context.is_active)
            context.add_callback(lambda: None if context.is_active() else self.core.give_up(job))
            for message in self.core.results(job, context.is_active):
                if isinstance(message, Completion):
                    yield pb.GenerateResponse(completion=completion_pb(message))
                else:
                    chunk = pb.Chunk(index=message.index, token_ids=message.token_ids,
                                     text=message.text)  # fmt: skip
                    yield pb.GenerateResponse(chunk=chunk)

    def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.ServicerContext
    ) -> pb.Session:
        with statuses(context):
            tenant = self._tenant(context).name
            sid = require_session_id(request.session_id)
            return session_pb(sid, self.core.get_session(tenant, sid))

    def ListSessions(
        self, request: pb.ListSessionsRequest, context: grpc.ServicerContext
    ) -> pb.ListSessionsResponse:
        with statuses(context):
            tenant = self._tenant(context).name
            page, token = self.core.list_sessions(tenant, request.page_token, request.page_size)
            return pb.ListSessionsResponse(
                sessions=[session_pb(sid, r) for sid, r in page], next_page_token=token
            )

    def DeleteSession(
        self, request: pb.DeleteSessionRequest, context: grpc.ServicerContext
    ) -> pb.DeleteSessionResponse:
        with statuses(context):
            tenant = self._tenant(context).name
            sid = require_session_id(request.session_id)
            return pb.DeleteSessionResponse(deleted=self.core.delete_session(tenant, sid))

    def ForkSession(
        self, request: pb.ForkSessionRequest, context: grpc.ServicerContext
    ) -> pb.Session:
        with statuses(context):
            tenant = self._tenant(context).name
            source = require_session_id(request.session_id)
            new = require_session_id(request.new_session_id, "new_session_id")
            return session_pb(new, self.core.fork_session(tenant, source, new))

    def _tenant(self, context: grpc.ServicerContext) -> Tenant:
        """The caller's tenant (every call is checked first)."""
        return self.keys.tenant(context.invocation_metadata())
