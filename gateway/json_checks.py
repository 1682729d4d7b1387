"""JSON that came from outside (a client's body, arguments sent as JSON text, the model's tool
calls), checked without recursion before any code walks it: at most MAX_DEPTH levels of arrays
and objects, and no lone UTF-16 surrogate in a string or a key."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

# No real request nests this deep (a tool's JSON schema ten levels down is still under 30);
# what the parser takes (up to ~1,000 levels) would reach recursive code later, deeper in the
# stack (jinja's tojson, json.dumps of a reply), and fail there as a 500.
MAX_DEPTH = 64
DEEP = f"nested deeper than {MAX_DEPTH} levels of arrays and objects"
KINDS = frozenset((str, dict, list))  # what json.loads gives that holds text or more JSON
SURROGATE = re.compile("[\ud800-\udfff]")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# (the parent's trail, a key or index): made into a path only when there is an error to name
Trail = tuple[Any, str | int] | None


def problem(value: Any) -> tuple[str, str] | None:
    """The path (as `messages[0].content`; "" for `value` itself) and the reason of the first
    thing found that no code should walk: a container MAX_DEPTH levels down, a string or key
    with a lone surrogate. None when there is none."""
    if isinstance(value, str):
        return ("", surrogate_reason(value)) if lone_surrogate(value) else None
    if not isinstance(value, dict | list):
        return None
    stack: list[tuple[Any, int, Trail]] = [(value, 0, None)]
    while stack:
        item, depth, trail = stack.pop()
        if depth >= MAX_DEPTH:
            return path(trail), DEEP
        if isinstance(item, dict):
            pairs: Iterable[tuple[str | int, Any]] = item.items()
        elif KINDS.isdisjoint(map(type, item)):  # numbers only (token ids): nothing to walk
            continue
        else:
            pairs = enumerate(item)
        for key, child in pairs:
            if isinstance(key, str) and lone_surrogate(key):
                return path((trail, key)), f"the key {surrogate_reason(key)}"
            if isinstance(child, str):
                if lone_surrogate(child):
                    return path((trail, key)), surrogate_reason(child)
            elif isinstance(child, dict | list):
                stack.append((child, depth + 1, (trail, key)))
    return None


def lone_surrogate(text: str) -> bool:
    """JSON's \\uD800-\\uDFFF escapes not in a high-low pair: no UTF-8 text holds one."""
    return not text.isascii() and SURROGATE.search(text) is not None


def surrogate_reason(text: str) -> str:
    found = SURROGATE.search(text)
    assert found is not None
    return f"holds a lone UTF-16 surrogate (U+{ord(found.group()):04X}), which is not text"


def path(trail: Trail) -> str:
    """`a.b[0]["odd key"]` from a trail; keys shown escaped (never a surrogate in a message)."""
    parts: list[str] = []
    while trail is not None:
        trail, key = trail
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif IDENTIFIER.fullmatch(key):
            parts.append(f".{key}")
        else:
            parts.append(f"[{json.dumps(key[:40])}]")
    return "".join(reversed(parts)).removeprefix(".")
