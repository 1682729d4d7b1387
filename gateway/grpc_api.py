"""The gRPC face of the gateway: `warmfleet.v1.Inference` over GatewayCore, on grpc.aio.
The reply's text streams as the model wrote it; the completion says how much of it is the
reasoning span."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

import grpc

from broker.messages import Completion
from broker.records import SessionRecord
from common.errors import InvalidRequestError
from common.grpc_errors import statuses_async
from common.ids import require_session_id
from common.pb_maps import FINISH_REASON, KV_SOURCE, PRIORITY_FROM_PB, tier_pb
from common.v1 import inference_pb2 as pb
from common.v1 import inference_pb2_grpc
from gateway.auth import KeyRing, Tenant
from gateway.bounds import InputBounds
from gateway.core import GatewayCore
from gateway.reasoning import ThoughtSplitter
from gateway.validate import GenerateInput, JobBuilder

SESSION_METADATA_KEY = "x-session-id"


def input_of(request: pb.GenerateRequest, session_id: str, bounds: InputBounds) -> GenerateInput:
    """The request as any face reads it; lists too long to fit are refused before they are
    copied."""

    def opt(name: str) -> object:
        return getattr(request, name) if request.HasField(name) else None

    if request.priority not in PRIORITY_FROM_PB:
        raise InvalidRequestError("priority", f"unknown value {request.priority}")
    kind = request.WhichOneof("input")
    if kind == "messages":
        bounds.check_count("messages", len(request.messages.messages))
    elif kind == "token_ids":
        bounds.check_count("token_ids", len(request.token_ids.ids))
    return GenerateInput(
        session_id=session_id,
        messages=[_message(m) for m in request.messages.messages] if kind == "messages" else None,
        prompt=request.prompt if kind == "prompt" else None,
        token_ids=list(request.token_ids.ids) if kind == "token_ids" else None,
        temperature=opt("temperature"),  # type: ignore[arg-type]
        top_k=opt("top_k"),  # type: ignore[arg-type]
        top_p=opt("top_p"),  # type: ignore[arg-type]
        min_p=opt("min_p"),  # type: ignore[arg-type]
        seed=opt("seed"),  # type: ignore[arg-type]
        max_tokens=opt("max_tokens"),  # type: ignore[arg-type]
        stop=tuple(request.stop),
        priority=PRIORITY_FROM_PB[request.priority],
        ignore_eos=bool(request.ignore_eos),
        min_tokens=int(request.min_tokens),
    )  # fmt: skip


def _message(m: pb.ChatMessage) -> dict[str, str]:
    message = {"role": m.role, "content": m.content}
    if m.reasoning_content:
        message["reasoning_content"] = m.reasoning_content
    return message


def completion_pb(c: Completion, splitter: ThoughtSplitter) -> pb.Completion:
    """The completion, its reasoning span as the splitter that read the reply found it."""
    u, t = c.usage, c.timings
    usage = pb.Usage(
        prompt_tokens=u.prompt_tokens,
        cached_tokens=u.cached_tokens,
        completion_tokens=u.completion_tokens,
        reasoning_tokens=splitter.span_tokens,
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
        stop_sequence=c.stop_sequence,
        reasoning_chars=splitter.span_chars,
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
    def __init__(self, core: GatewayCore, jobs: JobBuilder, keys: KeyRing) -> None:
        self.core = core
        self.jobs = jobs
        self.keys = keys

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        async with statuses_async(context):
            tenant = self._tenant(context)
            metadata = dict(context.invocation_metadata() or ())
            session_id = request.session_id or str(metadata.get(SESSION_METADATA_KEY, ""))
            inp = input_of(request, session_id, self.jobs.bounds)
            job = await self.jobs.build(inp, tenant.name, context.time_remaining())
            found = await self.core.session_for(tenant.name, job.session_id, job.prompt_ids, "grpc")
            job = found.placed(job)
            await self.core.admit(job, tenant, found.holder)
            splitter = self.jobs.splitter(job)
            async with aclosing(self.core.results(job)) as results:
                async for message in results:
                    if isinstance(message, Completion):
                        splitter.finish()
                        yield pb.GenerateResponse(completion=completion_pb(message, splitter))
                    else:
                        splitter.feed(message.text, len(message.token_ids))
                        chunk = pb.Chunk(index=message.index, token_ids=message.token_ids,
                                         text=message.text)  # fmt: skip
                        yield pb.GenerateResponse(chunk=chunk)

    async def GetSession(
        self, request: pb.GetSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.Session:
        async with statuses_async(context):
            tenant = self._tenant(context).name
            sid = require_session_id(request.session_id)
            return session_pb(sid, await self.core.get_session(tenant, sid))
        raise AssertionError("unreachable")

    async def ListSessions(
        self, request: pb.ListSessionsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListSessionsResponse:
        async with statuses_async(context):
            tenant = self._tenant(context).name
            page, token = await self.core.list_sessions(
                tenant, request.page_token, request.page_size
            )
            return pb.ListSessionsResponse(
                sessions=[session_pb(sid, r) for sid, r in page], next_page_token=token
            )
        raise AssertionError("unreachable")

    async def DeleteSession(
        self, request: pb.DeleteSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.DeleteSessionResponse:
        async with statuses_async(context):
            tenant = self._tenant(context).name
            sid = require_session_id(request.session_id)
            return pb.DeleteSessionResponse(deleted=await self.core.delete_session(tenant, sid))
        raise AssertionError("unreachable")

    async def ForkSession(
        self, request: pb.ForkSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.Session:
        async with statuses_async(context):
            tenant = self._tenant(context).name
            source = require_session_id(request.session_id)
            new = require_session_id(request.new_session_id, "new_session_id")
            return session_pb(new, await self.core.fork_session(tenant, source, new))
        raise AssertionError("unreachable")

    def _tenant(self, context: grpc.aio.ServicerContext) -> Tenant:
        """The caller's tenant (every call is checked first)."""
        return self.keys.tenant(context.invocation_metadata() or ())
