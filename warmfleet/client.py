"""Small typed gRPC clients for warmfleet's Inference and KVStore services (the CLI, the
tests)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol, cast

import grpc

from common.errors import ServiceError
from common.v1 import inference_pb2 as pb
from common.v1 import inference_pb2_grpc, kvstore_pb2_grpc
from common.v1 import kvstore_pb2 as kvpb

Metadata = Sequence[tuple[str, str]]
_MAX_PAGES = 100_000  # a guard against a server that never ends its page tokens


class GenerateStream(Protocol):
    """The streaming call of Generate: iterate it for responses; `cancel()` ends it early."""

    def __iter__(self) -> Iterator[pb.GenerateResponse]: ...

    def __next__(self) -> pb.GenerateResponse: ...

    def cancel(self) -> bool: ...

    def code(self) -> grpc.StatusCode: ...

    def details(self) -> str: ...


@dataclass(slots=True)
class Reply:
    """One finished generation: the chunks as they came, joined, and the completion message."""

    token_ids: list[int]
    text: str
    completion: pb.Completion
    chunks: list[pb.Chunk]


def parse_priority(priority: int | str | None) -> pb.Priority:
    """A Priority from its name ("interactive", "normal", "batch") or its number.

    Numbers pass through unchecked (proto3 enums are open), so tests can send unknown ones.
    """
    if priority is None:
        return pb.PRIORITY_UNSPECIFIED
    if isinstance(priority, str):
        return pb.Priority.Value(f"PRIORITY_{priority.upper()}")
    return cast(pb.Priority, priority)


def build_request(
    session_id: str,
    *,
    messages: Sequence[Mapping[str, str]] | None = None,
    prompt: str | None = None,
    token_ids: Sequence[int] | None = None,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    seed: int | None = None,
    stop: Sequence[str] = (),
    priority: int | str | None = None,
    ignore_eos: bool | None = None,
    min_tokens: int | None = None,
) -> pb.GenerateRequest:
    """The GenerateRequest for these arguments; unset (None) fields keep the server's default.

    At most one input may be given. An empty one (`messages=[]`, `prompt=""`) is still sent as
    that input, so the server can reject it by name; none at all sends no input.
    """
    inputs = [x for x in (messages, prompt, token_ids) if x is not None]
    if len(inputs) > 1:
        raise ValueError("give at most one of messages, prompt and token_ids")
    request = pb.GenerateRequest(session_id=session_id, stop=list(stop))
    request.priority = parse_priority(priority)
    if messages is not None:
        request.messages.SetInParent()
        for m in messages:
            request.messages.messages.add(role=m["role"], content=m["content"])
    elif prompt is not None:
        request.prompt = prompt
    elif token_ids is not None:
        request.token_ids.SetInParent()
        request.token_ids.ids.extend(token_ids)
    optional = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "min_p": min_p,
        "seed": seed,
        "ignore_eos": ignore_eos,
        "min_tokens": min_tokens,
    }
    for name, value in optional.items():
        if value is not None:
            setattr(request, name, value)
    return request


def collect(
    responses: Iterator[pb.GenerateResponse] | GenerateStream,
    on_chunk: Callable[[pb.Chunk], None] | None = None,
) -> Reply:
    """Read a Generate stream to its end, calling `on_chunk` as each chunk arrives.

    Raises ServiceError if the stream ends without a completion (grpc.RpcError propagates).
    """
    chunks: list[pb.Chunk] = []
    for response in responses:
        if response.HasField("chunk"):
            chunks.append(response.chunk)
            if on_chunk is not None:
                on_chunk(response.chunk)
        elif response.HasField("completion"):
            return Reply(
                token_ids=[t for c in chunks for t in c.token_ids],
                text="".join(c.text for c in chunks),
                completion=response.completion,
                chunks=chunks,
            )
    raise ServiceError("the Generate stream ended without a completion message")


class Client:
    """A connection to one gateway. Every call has a deadline; grpc.RpcError propagates."""

    def __init__(
        self,
        target: str,
        *,
        timeout_s: float = 120.0,
        unary_timeout_s: float = 10.0,
        api_key: str | None = None,
    ) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self.unary_timeout_s = unary_timeout_s
        # sent with every call when the gateway has API keys (`warmfleet gateway --keys`)
        self._auth: Metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._channel = grpc.insecure_channel(target)
        self._stub = inference_pb2_grpc.InferenceStub(self._channel)

    def connect(self, timeout_s: float = 30.0) -> None:
        """Open the connection now (a channel connects on its first call otherwise); raises
        grpc.FutureTimeoutError when the gateway cannot be reached in time."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout_s)

    def stream(
        self,
        session_id: str,
        *,
        timeout_s: float | None = None,
        metadata: Metadata = (),
        **fields: Any,
    ) -> GenerateStream:
        """Start a Generate call; it yields chunks, then one completion (or raises RpcError).

        `fields` are the keyword arguments of build_request (input, sampling, priority)."""
        request = build_request(session_id, **fields)
        call = self._stub.Generate(
            request,
            timeout=self.timeout_s if timeout_s is None else timeout_s,
            metadata=(*self._auth, *metadata) or None,
        )
        return cast(GenerateStream, call)

    def complete(self, session_id: str, **options: Any) -> Reply:
        """Generate to the end and return the whole reply; `options` are those of stream()."""
        call = self.stream(session_id, **options)
        try:
            return collect(call)
        finally:
            call.cancel()  # a no-op once the call has ended

    def get_session(self, session_id: str) -> pb.Session:
        """Where a session's KV lives; RpcError NOT_FOUND if there is no such session."""
        request = pb.GetSessionRequest(session_id=session_id)
        return cast(pb.Session, self._stub.GetSession(request, **self._unary()))

    def list_sessions(self, page_size: int = 100) -> list[pb.Session]:
        """Every session of the caller's tenant, following the page tokens to the end."""
        sessions: list[pb.Session] = []
        page_token = ""
        for _ in range(_MAX_PAGES):
            request = pb.ListSessionsRequest(page_size=page_size, page_token=page_token)
            page = cast(
                pb.ListSessionsResponse,
                self._stub.ListSessions(request, **self._unary()),
            )
            sessions.extend(page.sessions)
            if not page.next_page_token or page.next_page_token == page_token:
                break
            page_token = page.next_page_token
        return sessions

    def delete_session(self, session_id: str) -> bool:
        """Forget a session and drop its KV; False if there was no such session."""
        request = pb.DeleteSessionRequest(session_id=session_id)
        response = cast(
            pb.DeleteSessionResponse,
            self._stub.DeleteSession(request, **self._unary()),
        )
        return response.deleted

    def fork_session(self, session_id: str, new_session_id: str) -> pb.Session:
        """A new session starting from a copy of `session_id`'s KV; RpcError NOT_FOUND or
        ALREADY_EXISTS otherwise."""
        request = pb.ForkSessionRequest(session_id=session_id, new_session_id=new_session_id)
        return cast(pb.Session, self._stub.ForkSession(request, **self._unary()))

    def _unary(self) -> dict[str, Any]:
        return {"timeout": self.unary_timeout_s, "metadata": self._auth or None}

    def close(self) -> None:
        """Close the channel; calls still running end with CANCELLED."""
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class KVStoreClient:
    """A connection to the kvstore's operator service. Every call has a deadline."""

    def __init__(self, target: str, *, timeout_s: float = 10.0) -> None:
        self.target = target
        self.timeout_s = timeout_s
        self._channel = grpc.insecure_channel(target)
        self._stub = kvstore_pb2_grpc.KVStoreStub(self._channel)

    def usage(self) -> kvpb.KVUsage:
        """Pool and disk usage, counts per tier, counters."""
        return cast(
            kvpb.KVUsage, self._stub.GetUsage(kvpb.GetUsageRequest(), timeout=self.timeout_s)
        )

    def evict(self, session_id: str, tenant: str = "") -> int:
        """Order an idle session to disk; the tier it is in now (TIER_SPILLING when ordered)."""
        request = kvpb.EvictRequest(session_id=session_id, tenant=tenant)
        response = cast(kvpb.EvictResponse, self._stub.Evict(request, timeout=self.timeout_s))
        return int(response.tier)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> KVStoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
