"""Every message that crosses Redis survives the codec unchanged, and what a reader cannot
understand is a ProtocolError naming why, never a guess."""

from __future__ import annotations

import json

import pytest

from broker import codec
from broker import messages as m
from common.enums import FinishReason, KVSource, Priority, Tier
from common.errors import ProtocolError
from common.sampling import SamplingParams

MESSAGES: list[m.Message] = [
    m.Job(
        "r1",
        "acme",
        "s1",
        (1, 2, 3),
        SamplingParams(temperature=0.5, seed=9, stop=("x",)),
        Priority.BATCH,
        10.0,
        20.0,
    ),
    m.Job("r2", "acme", "s2", (4, 5), SamplingParams(seed=1), Priority.NORMAL, 1.0, 2.0, "w1", 32),
    m.TokenChunk(3, (504, 17), " The"),
    m.Completion(
        "r1",
        FinishReason.LENGTH,
        m.Usage(30, 12, 8),
        m.Timings(0.1, 0.2, 40.0, 0.5),
        "w0",
        KVSource.DISK,
        9,
    ),
    m.JobError("INVALID_ARGUMENT", "prompt: is empty"),
    m.SessionEvent(m.EventKind.HOT, "w0", "acme/s1", 40, 1840, 5.0, source="disk"),
    m.SessionEvent(m.EventKind.GONE, "w1", "acme/s2", reason=m.GoneReason.WRITE_FAILED),
    m.SessionEvent(
        m.EventKind.INVENTORY, "w0", last_used=6.0, held=(m.Held("acme/s1", "warm", 40, 1840, 5.0),)
    ),
    m.ControlOrder(m.OrderOp.FORK, "acme/s1", "acme/s3", "wf:reply:1"),
    m.ControlOrder(m.OrderOp.SHARE, tenant="acme", token_ids=tuple(range(32))),
    m.KVCommand(m.CommandOp.EVICT, "acme/s1", "wf:reply:2", deadline=99.5),
    m.CommandAnswer(m.AnswerStatus.OK, Tier.SPILLING),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda x: type(x).__name__)
def test_every_message_round_trips(message: m.Message) -> None:
    back = codec.decode_fields(codec.fields(message), type(message))
    assert back == message and type(back) is type(message)


def test_a_reader_refuses_what_it_does_not_understand() -> None:
    chunk = json.loads(codec.encode(m.TokenChunk(0, (1,), "a")))
    cases = {
        json.dumps({**chunk, "v": 2}): "version 2",
        json.dumps({**chunk, "k": "shrug"}): "unknown message kind",
        json.dumps({k: v for k, v in chunk.items() if k != "index"}): "index",
        "not json": "not a message",
    }
    for raw, reason in cases.items():
        with pytest.raises(ProtocolError, match=reason):
            codec.decode(raw, m.TokenChunk)
    with pytest.raises(ProtocolError, match="where job was expected"):
        codec.decode(codec.encode(m.TokenChunk(0, (1,), "a")), m.Job)
    job = json.loads(codec.encode(MESSAGES[0]))
    job["sampling"]["top_p"] = 2.0  # the message's own checks still hold on the way in
    with pytest.raises(ProtocolError, match="top_p"):
        codec.decode(json.dumps(job), m.Job)
    job["sampling"]["top_p"] = 1.0
    job["priority"] = "urgent"
    with pytest.raises(ProtocolError, match="priority"):
        codec.decode(json.dumps(job), m.Job)


def test_unknown_fields_are_ignored_for_newer_writers() -> None:
    chunk = {**json.loads(codec.encode(m.TokenChunk(0, (1,), "a"))), "logprobs": [0.1]}
    assert codec.decode(json.dumps(chunk), m.TokenChunk) == m.TokenChunk(0, (1,), "a")
