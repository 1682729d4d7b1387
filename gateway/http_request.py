"""Reading an HTTP request: the body (bounded, its JSON checked by gateway/json_checks.py),
its fields with their types checked, the caller's tenant, the session and the deadline from
the headers."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from common.errors import InvalidRequestError, PayloadTooLargeError
from common.ids import MAX_SESSION_ID_BYTES, check_session_id
from gateway.auth import KeyRing, Tenant
from gateway.json_checks import DEEP, problem

SESSION_HEADER = "x-session-id"
TIMEOUT_HEADER = "x-request-timeout"  # seconds: the request's deadline (like gRPC's)
Body = dict[str, Any]


async def read_json(request: Request, max_bytes: int) -> Body:
    """The body as a JSON object; PayloadTooLargeError past `max_bytes` (read no further),
    InvalidRequestError when it is not a JSON object, nests too deep or holds a lone
    surrogate (the error names the field)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLargeError(f"the body has {declared} bytes; the limit is {max_bytes}")
    data = bytearray()
    try:
        async for piece in request.stream():
            data += piece
            if len(data) > max_bytes:
                raise PayloadTooLargeError(f"the body is over the limit of {max_bytes} bytes")
    except ClientDisconnect:  # nobody reads the answer: a client's leaving is no failure here
        raise InvalidRequestError("body", "the client left before the body's end") from None
    try:
        body = json.loads(data)
    except RecursionError:
        raise InvalidRequestError("body", DEEP) from None
    except ValueError as e:
        raise InvalidRequestError("body", f"not valid JSON: {e}") from e
    if not isinstance(body, dict):
        raise InvalidRequestError("body", "must be a JSON object")
    found = problem(body)
    if found is not None:
        raise InvalidRequestError(found[0] or "body", found[1])
    return body


def get(body: Body, name: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
    """body[name] if present and not null, checked to be of `kind` (bool is not a number)."""
    value = body.get(name)
    if value is None:
        return default
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise InvalidRequestError(name, f"must be {_names(kinds)}, not a boolean")
    if not isinstance(value, kinds):
        raise InvalidRequestError(name, f"must be {_names(kinds)}, not {_json_type(value)}")
    return value


def number(body: Body, name: str) -> float | None:
    value = get(body, name, (int, float))
    return None if value is None else float(value)


def string_list(body: Body, name: str) -> tuple[str, ...]:
    """A string or a list of strings, as a tuple."""
    value = get(body, name, (str, list), ())
    if isinstance(value, str):
        return (value,)
    if not all(isinstance(v, str) for v in value):
        raise InvalidRequestError(name, "must be a string or a list of strings")
    return tuple(value)


def joined_text(content: Any, kinds: tuple[str, ...] = ("text",)) -> str | None:
    """A string, or a list of text parts (each {"type": one of `kinds`, "text": str}) as one
    string; None for anything else (each API says so in its own words)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in kinds and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return None


def json_arguments(text: str, field: str, where: str) -> Any:
    """A tool call's arguments sent as JSON text, parsed ("" is no arguments) and checked as
    a body is."""
    try:
        value = json.loads(text) if text.strip() else {}
    except RecursionError:
        raise InvalidRequestError(field, f"{where}: {DEEP}") from None
    except ValueError as e:
        raise InvalidRequestError(field, f"{where}: not JSON: {e}") from e
    found = problem(value)
    if found is not None:
        inside = f" (in its JSON text at {found[0]})" if found[0] else ""
        raise InvalidRequestError(field, f"{where}{inside}: {found[1]}")
    return value


def tenant_of(request: Request, keys: KeyRing) -> Tenant:
    h = request.headers
    return keys.tenant_of(h.get("authorization"), h.get("x-api-key"))


def session_of(request: Request, named: Any = None, field: str = "") -> str:
    """The X-Session-Id header's session; else the one `named` names (a body's `field` an
    agent fills once per conversation: Codex's prompt_cache_key, Claude Code's
    metadata.user_id); else "", none (the prompt may yet find one: gateway/session_find.py).

    A name is used as it is where it can be a session id that the X-Session-Id header
    echoing it can carry: printable ASCII of up to 128 bytes. A longer one of printable
    ASCII is named by its digest ("n-" and 40 hex digits of its SHA-256: Claude Code's
    user ids with an account run to ~160). Any other names none."""
    given = request.headers.get(SESSION_HEADER)
    if given:
        return check_session_id(given, "X-Session-Id")
    if not isinstance(named, str) or not named.isascii() or not named.isprintable():
        return ""
    if len(named) > MAX_SESSION_ID_BYTES:
        return f"n-{hashlib.sha256(named.encode()).hexdigest()[:40]}"
    return check_session_id(named, field)


def time_left_of(request: Request) -> float | None:
    raw = request.headers.get(TIMEOUT_HEADER)
    if raw is None:
        return None
    try:
        seconds = float(raw)
    except ValueError as e:
        raise InvalidRequestError("X-Request-Timeout", f"not a number of seconds: {raw!r}") from e
    if not seconds > 0:
        raise InvalidRequestError("X-Request-Timeout", "must be > 0")
    return seconds


def _names(kinds: tuple[type, ...]) -> str:
    words = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
             list: "a list", dict: "an object"}  # fmt: skip
    return " or ".join(dict.fromkeys(words.get(k, k.__name__) for k in kinds))


def _json_type(value: object) -> str:
    names: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}
    return names.get(type(value), type(value).__name__)
