"""Session ids and tenant names: what a client may name a session, what an operator may name
a tenant (checked once, wherever one comes in)."""

from __future__ import annotations

import re
import unicodedata

from common.errors import InvalidRequestError

MAX_SESSION_ID_BYTES = 128
NOT_PRINTABLE = ("Cc", "Cf", "Cs", "Zl", "Zp")  # control, format, surrogate, line breaks
TENANT_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # never ':' or '/': they join Redis keys


def check_session_id(session_id: str, field: str = "session_id") -> str:
    """Session ids are up to 128 UTF-8 bytes of printable characters ("" means none)."""
    if len(session_id) > MAX_SESSION_ID_BYTES:  # each character is at least a byte
        raise InvalidRequestError(field, f"longer than {MAX_SESSION_ID_BYTES} bytes")
    bad = next((c for c in session_id if unicodedata.category(c) in NOT_PRINTABLE), None)
    if bad is not None and unicodedata.category(bad) == "Cs":  # UTF-8 cannot encode one
        raise InvalidRequestError(
            field, f"contains a lone UTF-16 surrogate U+{ord(bad):04X}, which is not text"
        )
    if bad is not None:
        raise InvalidRequestError(field, f"contains control character U+{ord(bad):04X}")
    if len(session_id.encode("utf-8")) > MAX_SESSION_ID_BYTES:
        raise InvalidRequestError(field, f"longer than {MAX_SESSION_ID_BYTES} bytes")
    return session_id


def require_session_id(session_id: str, field: str = "session_id") -> str:
    """A session id that must be given."""
    if not session_id:
        raise InvalidRequestError(field, "is required")
    return check_session_id(session_id, field)


def check_tenant(name: str, field: str = "tenant") -> str:
    """Tenant names are 1-64 of A-Z a-z 0-9 _ . - (they join Redis keys and cache keys)."""
    if not TENANT_NAME.match(name):
        raise InvalidRequestError(field, f"must be 1-64 of A-Z a-z 0-9 _ . - (got {name[:80]!r})")
    return name
