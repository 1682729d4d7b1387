"""Ask the kvstore to change the residency index, and wait (bounded) for its answer."""

from __future__ import annotations

import time
import uuid

import redis

from broker import codec, keys
from broker.messages import CommandAnswer, CommandOp, KVCommand
from common.errors import ServiceError

COMMAND_TIMEOUT_S = 4.0  # below the gateway connection's socket timeout
REPLY_TTL_S = 60  # an answer nobody read expires


def call(
    r: redis.Redis, op: CommandOp, key: str, new_key: str = "", timeout_s: float = COMMAND_TIMEOUT_S
) -> CommandAnswer:
    """Send one command on the kvstore's stream; its answer. Raises ServiceError when none
    comes within `timeout_s` (the kvstore, or the worker it asked, is down or stuck); the
    kvstore drops a command it reads after that, so a failed call changes nothing."""
    reply_to = keys.reply_key(uuid.uuid4().hex)
    command = KVCommand(op, key, reply_to, new_key, deadline=time.time() + timeout_s)
    r.xadd(keys.KV_EVENTS, codec.fields(command))
    answer = r.blpop([reply_to], timeout=timeout_s)
    if answer is None:
        raise ServiceError(
            f"the kvstore did not answer {str(op)!r} within {timeout_s:.0f} s (is it running?)"
        )
    return codec.decode(str(answer[1]), CommandAnswer)
