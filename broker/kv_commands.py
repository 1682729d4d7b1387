"""Ask the kvstore to change the residency index, and wait (bounded) for its answer; from
threads (`call`) or from an event loop (`call_async`)."""

from __future__ import annotations

import time
import uuid

import redis
import redis.asyncio as aioredis

from broker import codec, keys
from broker.messages import CommandAnswer, CommandOp, KVCommand
from common.errors import ServiceError

COMMAND_TIMEOUT_S = 4.0  # below the gateway connection's socket timeout
REPLY_TTL_S = 60  # an answer nobody read expires


def _command(op: CommandOp, key: str, new_key: str, timeout_s: float) -> KVCommand:
    reply_to = keys.reply_key(uuid.uuid4().hex)
    return KVCommand(op, key, reply_to, new_key, deadline=time.time() + timeout_s)


def _answer(reply: list[str] | None, op: CommandOp, timeout_s: float) -> CommandAnswer:
    if reply is None:
        raise ServiceError(
            f"the kvstore did not answer {str(op)!r} within {timeout_s:.0f} s (is it running?)"
        )
    return codec.decode(str(reply[1]), CommandAnswer)


def call(
    r: redis.Redis, op: CommandOp, key: str, new_key: str = "", timeout_s: float = COMMAND_TIMEOUT_S
) -> CommandAnswer:
    """Send one command on the kvstore's stream; its answer. Raises ServiceError when none
    comes within `timeout_s` (the kvstore, or the worker it asked, is down or stuck); the
    kvstore drops a command it reads after that, so a failed call changes nothing."""
    command = _command(op, key, new_key, timeout_s)
    r.xadd(keys.KV_EVENTS, codec.fields(command))
    return _answer(r.blpop([command.reply_to], timeout=timeout_s), op, timeout_s)


async def call_async(
    r: aioredis.Redis,
    op: CommandOp,
    key: str,
    new_key: str = "",
    timeout_s: float = COMMAND_TIMEOUT_S,
) -> CommandAnswer:
    """`call`, awaited."""
    command = _command(op, key, new_key, timeout_s)
    await r.xadd(keys.KV_EVENTS, codec.fields(command))
    return _answer(await r.blpop([command.reply_to], timeout=timeout_s), op, timeout_s)
