"""How far a job got before its worker died: what its out stream already holds. A worker that
takes the job over continues from there (prefilling the tokens sent so far) instead of
decoding them again one step each."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import redis

from broker import codec, keys
from broker.messages import Completion, JobError, TokenChunk
from common.errors import ProtocolError


@dataclass(frozen=True, slots=True)
class Progress:
    """The tokens a job's out stream holds, contiguous from index 0, and whether it ended
    (a completion or an error was published: its client has its answer)."""

    sent: tuple[int, ...] = ()
    ended: bool = False


def read_progress(r: redis.Redis, request_ids: Iterable[str]) -> dict[str, Progress]:
    """Each job's progress, in one round trip."""
    ids = list(dict.fromkeys(request_ids))
    if not ids:
        return {}
    pipe = r.pipeline(transaction=False)
    for rid in ids:
        pipe.xrange(keys.out_stream(rid))
    return {rid: progress_of(entries) for rid, entries in zip(ids, pipe.execute(), strict=True)}


def progress_of(entries: list[tuple[str, dict[str, str]]]) -> Progress:
    """The progress an out stream's entries show. Two workers may both have published the
    same indexes (the dead one was only slow): each index counts once; an unreadable entry
    ends what can be trusted."""
    by_index: dict[int, int] = {}
    ended = False
    for _, entry in entries:
        try:
            message = codec.decode_fields(entry, TokenChunk, Completion, JobError)
        except ProtocolError:
            break
        if not isinstance(message, TokenChunk):
            ended = True
            continue
        for i, token in enumerate(message.token_ids):
            by_index.setdefault(message.index + i, token)
    sent: list[int] = []
    while len(sent) in by_index:
        sent.append(by_index[len(sent)])
    return Progress(tuple(sent), ended)
