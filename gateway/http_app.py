"""The HTTP face of the gateway: a Starlette app (ASGI, served by uvicorn on the gateway's
event loop) with the OpenAI and Anthropic APIs and sessions; errors in each API's shape.

Starlette rather than FastAPI: the bodies are checked by our own code (one place, messages
naming the field, as the gRPC face gives them), so FastAPI's pydantic layer would only add
a second set of rules and another error format."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from common.errors import NotFoundError, WarmfleetError
from gateway import anthropic_api, openai_api, sessions_api
from gateway.http_errors import Shape, error_response
from gateway.http_jobs import HttpContext

Endpoint = Callable[[HttpContext, Request], Awaitable[Response]]


def build_app(ctx: HttpContext) -> Starlette:
    def route(path: str, endpoint: Endpoint, method: str, shape: Shape = Shape.OPENAI) -> Route:
        async def handle(request: Request) -> Response:
            try:
                return await endpoint(ctx, request)
            except WarmfleetError as e:
                session = request.headers.get("x-session-id")
                return error_response(e, shape, {"X-Session-Id": session} if session else None)

        return Route(path, handle, methods=[method])

    async def unknown(request: Request, exc: Exception) -> Response:
        status = getattr(exc, "status_code", 404)
        reason = "no such route" if status == 404 else "method not allowed on this route"
        error = NotFoundError(f"{request.method} {request.url.path}: {reason}")
        response = error_response(error, Shape.OPENAI)
        response.status_code = status
        return response

    return Starlette(
        exception_handlers={404: unknown, 405: unknown},
        routes=[
            route("/v1/models", openai_api.models, "GET"),
            route("/v1/chat/completions", openai_api.chat_completions, "POST"),
            route("/v1/completions", openai_api.completions, "POST"),
            route("/v1/messages", anthropic_api.messages, "POST", Shape.ANTHROPIC),
            route("/v1/messages/count_tokens", anthropic_api.count_tokens, "POST", Shape.ANTHROPIC),
            route("/v1/sessions", sessions_api.list_sessions, "GET"),
            route("/v1/sessions/{session_id:path}/fork", sessions_api.fork_session, "POST"),
            route("/v1/sessions/{session_id:path}", sessions_api.get_session, "GET"),
            route("/v1/sessions/{session_id:path}", sessions_api.delete_session, "DELETE"),
        ],
    )
