"""The operator's face on the gateway's HTTP port: `/metrics` for Prometheus, and the live
dashboard (`/dashboard`: the page and its assets, served from the package so it works
without internet; `/dashboard/events`: an update a second as server-sent events; evict a
session, drain a worker). The dashboard's data and actions need an admin key when the
gateway has a key file (docs/dashboard.md)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response

from broker.messages import AnswerStatus
from common.enums import Tier
from common.errors import (
    FailedPreconditionError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
)
from common.ids import TENANT_NAME, require_session_id
from gateway.auth import KeyRing
from gateway.core import GatewayCore
from gateway.fleet_sampler import END, FleetSampler
from gateway.http_request import Body, get, read_json
from gateway.sse import EventStream, event

STATIC = Path(__file__).parent / "static"
KEEPALIVE_S = 15.0  # an idle stream still sends a comment this often (proxies close quiet ones)
MAX_ACTION_BYTES = 4096


@dataclass(frozen=True, slots=True)
class Operator:
    """What the operator's endpoints share."""

    core: GatewayCore
    keys: KeyRing
    sampler: FleetSampler

    def check_admin(self, request: Request) -> None:
        """UnauthenticatedError / PermissionDeniedError unless an admin key is given."""
        h = request.headers
        self.keys.admin_of(h.get("authorization"), h.get("x-api-key"))


async def metrics(op: Operator, request: Request) -> Response:
    return Response(op.core.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


async def page(op: Operator, request: Request) -> Response:
    return FileResponse(STATIC / "dashboard.html", headers={"cache-control": "no-cache"})


async def access(op: Operator, request: Request) -> Response:
    """Whether the caller's key opens the dashboard, always with 200 (the page asks this
    first, so that the browser logs no refused request before the key is given)."""
    try:
        op.check_admin(request)
    except (UnauthenticatedError, PermissionDeniedError) as e:
        return JSONResponse({"key_required": True, "admin": False, "message": str(e)})
    return JSONResponse({"key_required": op.keys.enabled, "admin": True, "message": ""})


async def events(op: Operator, request: Request) -> Response:
    op.check_admin(request)
    return EventStream(_updates(op.sampler))  # type: ignore[return-value]


async def _updates(sampler: FleetSampler) -> AsyncGenerator[bytes, None]:
    with sampler.subscription() as queue:
        yield event(sampler.first_update(), "fleet")
        while True:
            try:
                update = await asyncio.wait_for(queue.get(), timeout=KEEPALIVE_S)
            except TimeoutError:
                yield b": keep-alive\n\n"
                continue
            if update is END:
                return
            yield event(update, "fleet")


async def evict(op: Operator, request: Request) -> Response:
    op.check_admin(request)
    body = await read_json(request, MAX_ACTION_BYTES)
    tenant = _required(body, "tenant")
    if not TENANT_NAME.match(tenant):
        raise InvalidRequestError("tenant", "1-64 of A-Z a-z 0-9 _ . -")
    session_id = require_session_id(_required(body, "session_id"))
    answer = await op.core.evict_session(tenant, session_id)
    if answer.status == AnswerStatus.NOT_FOUND:
        raise NotFoundError(f"no session {session_id!r} of tenant {tenant!r}")
    if answer.tier == Tier.HOT:
        raise FailedPreconditionError(
            f"session {session_id!r} is in a running request; it is not evicted"
        )
    return JSONResponse({"tier": str(answer.tier)})


async def drain(op: Operator, request: Request) -> Response:
    op.check_admin(request)
    worker_id = _required(await read_json(request, MAX_ACTION_BYTES), "worker_id")
    if not await op.core.drain_worker(worker_id):
        raise NotFoundError(f"no live worker {worker_id!r}")
    return JSONResponse({"worker_id": worker_id, "state": "draining"})


def _required(body: Body, name: str) -> str:
    value: str = get(body, name, str, "")
    if not value:
        raise InvalidRequestError(name, "is required")
    return value
