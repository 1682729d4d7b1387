"""The HTTP face of the gateway: a Starlette app (ASGI, served by uvicorn on the gateway's
event loop) with the OpenAI and Anthropic APIs and sessions; errors in each API's shape.

Starlette rather than FastAPI: the bodies are checked by our own code (one place, messages
naming the field, as the gRPC face gives them), so FastAPI's pydantic layer would only add
a second set of rules and another error format."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from common.errors import NotFoundError, QueueFullError, WarmfleetError
from gateway import anthropic_api, dashboard, openai_api, responses_api, sessions_api
from gateway.dashboard import Operator
from gateway.http_errors import Shape, bug_response, error_response
from gateway.http_jobs import HttpContext
from gateway.metrics import GatewayMetrics

Endpoint = Callable[[Any, Request], Awaitable[Response]]
log = logging.getLogger("warmfleet.gateway")


def answering(
    endpoint: Endpoint, on: Any, shape: Shape
) -> Callable[[Request], Awaitable[Response]]:
    """`endpoint` on `on`, its named errors answered in the API's shape; any other exception
    is a bug: logged with its traceback and answered 500, so the connection serves on (were
    it raised to uvicorn, uvicorn would close the connection without saying so)."""

    async def handle(request: Request) -> Response:
        try:
            return await endpoint(on, request)
        except WarmfleetError as e:
            session = request.headers.get("x-session-id")
            return error_response(e, shape, {"X-Session-Id": session} if session else None)
        except Exception:
            log.exception("%s %s failed", request.method, request.scope["path"])
            return bug_response(shape)

    return handle


def build_app(ctx: HttpContext, op: Operator, max_open: int = 4096) -> ASGIApp:
    def route(
        path: str, endpoint: Endpoint, method: str, shape: Shape = Shape.OPENAI, on: Any = ctx
    ) -> Route:
        return Route(path, answering(endpoint, on, shape), methods=[method])

    async def unknown(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        reason = "no such route" if status == 404 else "method not allowed on this route"
        error = NotFoundError(f"{request.method} {request.url.path}: {reason}")
        response = error_response(error, Shape.OPENAI)
        response.status_code = status
        return response

    app = Starlette(
        exception_handlers={404: unknown, 405: unknown},
        routes=[
            route("/v1/models", openai_api.models, "GET"),
            route("/v1/chat/completions", openai_api.chat_completions, "POST"),
            route("/v1/completions", openai_api.completions, "POST"),
            route("/v1/responses", responses_api.responses, "POST"),
            route("/v1/messages", anthropic_api.messages, "POST", Shape.ANTHROPIC),
            route("/v1/messages/count_tokens", anthropic_api.count_tokens, "POST", Shape.ANTHROPIC),
            route("/v1/sessions", sessions_api.list_sessions, "GET"),
            route("/v1/sessions/{session_id:path}/fork", sessions_api.fork_session, "POST"),
            route("/v1/sessions/{session_id:path}", sessions_api.get_session, "GET"),
            route("/v1/sessions/{session_id:path}", sessions_api.delete_session, "DELETE"),
            route("/metrics", dashboard.metrics, "GET", on=op),
            route("/dashboard", dashboard.page, "GET", on=op),
            route("/dashboard/access", dashboard.access, "GET", on=op),
            route("/dashboard/events", dashboard.events, "GET", on=op),
            route("/dashboard/api/evict", dashboard.evict, "POST", on=op),
            route("/dashboard/api/drain", dashboard.drain, "POST", on=op),
            Mount("/dashboard/static", StaticFiles(directory=dashboard.STATIC)),
        ],
    )
    return CountResponses(app, ctx.core.metrics, max_open)


class CountResponses:
    """Bounds the API's open requests (`/v1/...`; not scrapes or the dashboard): one more
    than `max_open` gets 429 with Retry-After; counts their responses by HTTP status."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, max_open: int = 4096) -> None:
        self.app = app
        self.metrics = metrics
        self.max_open = max_open
        self.num_open = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.responded("http", str(message["status"]))
            await send(message)

        if self.num_open >= self.max_open:
            error = QueueFullError(f"the gateway has {self.max_open} requests open, its limit "
                                   "(--max-streams); retry after 1000 ms", 1000)  # fmt: skip
            shape = Shape.ANTHROPIC if scope["path"].startswith("/v1/messages") else Shape.OPENAI
            await error_response(error, shape)(scope, receive, counted)
            return
        self.num_open += 1
        try:
            await self.app(scope, receive, counted)
        finally:
            self.num_open -= 1
