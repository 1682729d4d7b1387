"""Sessions over HTTP, with the meaning of the gRPC calls: GET /v1/sessions, GET and DELETE
/v1/sessions/{id}, POST /v1/sessions/{id}/fork (body: {"new_session_id": "..."})."""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from broker.records import SessionRecord
from common.errors import InvalidRequestError
from common.ids import require_session_id
from gateway.http_jobs import HttpContext
from gateway.http_request import get, tenant_of


def session_json(session_id: str, r: SessionRecord) -> dict[str, Any]:
    return {
        "id": session_id,
        "object": "session",
        "tier": str(r.tier),
        "worker_id": r.worker,
        "num_tokens": r.num_tokens,
        "kv_bytes": r.nbytes,
        "last_used": r.last_used,
    }


async def list_sessions(ctx: HttpContext, request: Request) -> Response:
    tenant = tenant_of(request, ctx.keys).name
    size = request.query_params.get("page_size", "100")
    if not re.fullmatch(r"[0-9]{1,9}", size):
        raise InvalidRequestError("page_size", f"not a number: {size!r}")
    token = request.query_params.get("page_token", "")
    page, next_token = await ctx.core.list_sessions(tenant, token, int(size))
    data = [session_json(sid, r) for sid, r in page]
    return JSONResponse({"object": "list", "data": data, "next_page_token": next_token or None})


async def get_session(ctx: HttpContext, request: Request) -> Response:
    tenant = tenant_of(request, ctx.keys).name
    sid = require_session_id(request.path_params["session_id"])
    return JSONResponse(session_json(sid, await ctx.core.get_session(tenant, sid)))


async def delete_session(ctx: HttpContext, request: Request) -> Response:
    tenant = tenant_of(request, ctx.keys).name
    sid = require_session_id(request.path_params["session_id"])
    deleted = await ctx.core.delete_session(tenant, sid)
    return JSONResponse({"id": sid, "object": "session.deleted", "deleted": deleted})


async def fork_session(ctx: HttpContext, request: Request) -> Response:
    tenant = tenant_of(request, ctx.keys).name
    source = require_session_id(request.path_params["session_id"])
    body = await ctx.body(request)
    new = require_session_id(get(body, "new_session_id", str, ""), "new_session_id")
    return JSONResponse(session_json(new, await ctx.core.fork_session(tenant, source, new)))
