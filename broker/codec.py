"""The one codec of the messages in broker/messages.py.

A message is JSON: its fields, plus "k" (its kind) and "v" (its version), e.g.
{"k":"chunk","v":1,"index":3,"token_ids":[504],"text":" The"}. On a stream it is the single
field "m"; in a reply list, the element itself. JSON rather than protobuf because the Lua
scripts move messages as opaque strings, the clients decode replies as text, and an operator
can read a queue with redis-cli. A reader that meets a kind or version it does not know
raises ProtocolError instead of guessing; unknown fields are ignored (a newer writer may add
one), missing ones take their defaults.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import types
import typing
from typing import Any, TypeVar, overload

from broker import messages as m
from common.errors import InvalidRequestError, ProtocolError

FIELD = "m"  # the stream field that holds a message
Fields = dict[str, str]
A = TypeVar("A")
B = TypeVar("B")
C = TypeVar("C")

KINDS: dict[str, type] = {
    cls.KIND: cls
    for cls in (
        m.Job, m.TokenChunk, m.Completion, m.JobError, m.SessionEvent, m.ControlOrder,
        m.KVCommand, m.CommandAnswer,
    )
}  # fmt: skip


def encode(message: m.Message) -> str:
    body = {"k": message.KIND, "v": message.VERSION, **dataclasses.asdict(message)}
    return json.dumps(body, separators=(",", ":"))


def fields(message: m.Message) -> Fields:
    """The message as the fields of a stream entry."""
    return {FIELD: encode(message)}


@overload
def decode(raw: str, a: type[A], /) -> A: ...
@overload
def decode(raw: str, a: type[A], b: type[B], /) -> A | B: ...
@overload
def decode(raw: str, a: type[A], b: type[B], c: type[C], /) -> A | B | C: ...
def decode(raw: str, *expected: type) -> Any:
    """The message in `raw`, which must be of one of the `expected` classes."""
    try:
        data = json.loads(raw)
        kind, version = data.pop("k"), data.pop("v")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ProtocolError(f"not a message: {raw[:80]!r}") from e
    cls = KINDS.get(kind)
    if cls is None:
        raise ProtocolError(f"unknown message kind {kind!r}")
    if version != cls.VERSION:  # type: ignore[attr-defined]
        known = cls.VERSION  # type: ignore[attr-defined]
        raise ProtocolError(f"{kind} version {version}; this reader knows version {known}")
    if cls not in expected:
        wanted = " or ".join(c.KIND for c in expected)  # type: ignore[attr-defined]
        raise ProtocolError(f"a {kind} message where {wanted} was expected")
    return _build(cls, data)


@overload
def decode_fields(entry: Fields, a: type[A], /) -> A: ...
@overload
def decode_fields(entry: Fields, a: type[A], b: type[B], /) -> A | B: ...
@overload
def decode_fields(entry: Fields, a: type[A], b: type[B], c: type[C], /) -> A | B | C: ...
def decode_fields(entry: Fields, *expected: type) -> Any:
    """The message of a stream entry."""
    if FIELD not in entry:
        raise ProtocolError(f"a stream entry without a message: {sorted(entry)}")
    return decode(entry[FIELD], *expected)


def _build(cls: type, data: dict[str, Any]) -> Any:
    hints = _hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            values[f.name] = _convert(hints[f.name], data[f.name], f.name)
    try:
        return cls(**values)
    except TypeError as e:  # a required field is missing
        raise ProtocolError(f"{cls.__name__}: {e}") from e
    except InvalidRequestError as e:  # its own checks (SamplingParams) refused it
        raise ProtocolError(f"{cls.__name__}: {e}") from e


def _convert(hint: Any, value: Any, name: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):  # X | None
        if value is None:
            return None
        (hint,) = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(hint, value, name)
    if origin is tuple:
        (item, _) = typing.get_args(hint)
        if item in (int, float, str):  # token ids: no per-item work
            return tuple(value)
        return tuple(_convert(item, v, name) for v in value)
    if dataclasses.is_dataclass(hint):
        return _build(typing.cast(type, hint), value)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        try:
            return hint(value)
        except ValueError as e:
            raise ProtocolError(f"{name}: {value!r} is not a {hint.__name__}") from e
    return value


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)
