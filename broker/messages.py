"""Every message that crosses Redis between the gateway, the workers and the kvstore, one
typed class each. `broker/codec.py` encodes and decodes them, and nothing else does.

    gateway --Job--> worker --TokenChunk, Completion, JobError--> gateway
    worker --SessionEvent--> kvstore --ControlOrder--> worker
    gateway, operators --KVCommand--> kvstore --CommandAnswer--> caller
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from common.enums import FinishReason, KVSource, Priority
from common.sampling import SamplingParams


@dataclass(frozen=True, slots=True)
class Job:
    """A validated, tokenized request: what the gateway enqueues and a worker runs."""

    KIND = "job"
    VERSION = 1
    request_id: str
    tenant: str
    session_id: str  # "" when the client named no session
    prompt_ids: tuple[int, ...]
    sampling: SamplingParams  # its seed is always set: a retry draws the same tokens
    priority: Priority
    accepted_at: float  # unix seconds, when the gateway accepted it
    deadline_at: float  # unix seconds; past it the request is dropped
    # the live worker holding, in memory, the session a worker last started on the longest
    # marked prefix of the prompt (gateway/session_find.py), and that prefix's length in
    # tokens: a worker of the same host placed the request may read those blocks from disk
    # ("" with a length: only a session on disk holds it, its blocks in its host's spill
    # directory)
    prefix_from: str = ""
    prefix_tokens: int = 0
    # the chain hashes (hex) of the prompt's prefix marks up to its head: the worker that
    # starts the request passes them on in the session's HOT event, and the kvstore indexes
    # them under the session (broker/prompt_heads.py)
    prefix_marks: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class TokenChunk:
    """New tokens of a request, from the index of the first one."""

    KIND = "chunk"
    VERSION = 1
    index: int
    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV was reused
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class Timings:
    queue_wait_s: float
    time_to_first_token_s: float
    decode_tokens_per_s: float
    total_s: float


@dataclass(frozen=True, slots=True)
class Completion:
    """How a request ended: its last message on the out stream."""

    KIND = "done"
    VERSION = 1
    request_id: str
    finish_reason: FinishReason
    usage: Usage
    timings: Timings
    worker_id: str
    kv_source: KVSource
    seed: int
    stop_sequence: str = ""  # the stop string that ended it ("" for anything else)


@dataclass(frozen=True, slots=True)
class JobError:
    """A request that failed: its last message on the out stream."""

    KIND = "error"
    VERSION = 1
    code: str  # a gRPC status name, e.g. INVALID_ARGUMENT
    message: str


class EventKind(enum.StrEnum):
    HOT = "hot"  # a request started on the session
    WARM = "warm"  # idle in the worker's pool
    DISK = "disk"  # written to its spill file
    GONE = "gone"  # the worker no longer holds it and wrote no file
    INVENTORY = "inventory"  # everything the worker holds


class GoneReason(enum.StrEnum):
    REJECTED = "rejected"  # its spill file failed a check on restore
    WRITE_FAILED = "write_failed"  # the spill write failed (e.g. disk full)
    DROPPED = "dropped"  # DeleteSession, or evicted by a worker with no spill directory


@dataclass(frozen=True, slots=True)
class Held:
    """One session in a worker's inventory."""

    key: str
    tier: str  # hot or warm
    num_tokens: int
    nbytes: int
    last_used: float


@dataclass(frozen=True, slots=True)
class SessionEvent:
    """Where one session's KV now is, as its worker sees it. Applying one twice gives the
    same index, so a kvstore that restarts may replay what it had not acknowledged."""

    KIND = "event"
    VERSION = 1
    kind: EventKind
    worker: str
    key: str = ""  # the session's cache key (tenant/session id); "" for INVENTORY
    num_tokens: int = 0
    nbytes: int = 0  # KV bytes in memory, or the file's size for DISK
    last_used: float = 0.0  # unix seconds
    source: str = ""  # HOT: where its KV came from (pool, pending, disk, none)
    file_mtime_ns: int = 0  # DISK: the file written
    reason: GoneReason | None = None  # GONE
    held: tuple[Held, ...] = ()  # INVENTORY
    reply_to: str = ""  # the command this event completes: answered once it is applied
    # the worker's idle sessions' bytes once this change is made, each shared block once
    # (-1: not said); the kvstore keeps the worker's warm budget on this figure
    warm_bytes: int = -1
    marks: tuple[str, ...] = ()  # HOT: its request's prefix marks (Job.prefix_marks)


class OrderOp(enum.StrEnum):
    SPILL = "spill_session"  # write an idle session to disk
    DROP = "drop_session"  # DeleteSession: forget its KV and its file
    FORK = "fork_session"  # copy its KV under new_key
    FORGET = "forget_session"  # another worker holds a newer copy: drop this one
    REPORT = "report"  # send an inventory
    DRAIN = "drain"  # an operator's: take no new requests, finish the running ones, exit
    SHARE = "share_prefix"  # another worker's: write the blocks of token_ids held to disk


@dataclass(frozen=True, slots=True)
class ControlOrder:
    """An order to one worker, on its pinned stream (from the kvstore; DRAIN from an
    operator, through the gateway; SHARE from another worker of its host)."""

    KIND = "order"
    VERSION = 1
    op: OrderOp
    key: str = ""
    new_key: str = ""  # FORK
    reply_to: str = ""  # DROP, FORK: the command the worker's event completes
    tenant: str = ""  # SHARE: whose blocks
    token_ids: tuple[int, ...] = ()  # SHARE: the prompt prefix (whole blocks)


class CommandOp(enum.StrEnum):
    DELETE = "delete"
    FORK = "fork"
    EVICT = "evict"


@dataclass(frozen=True, slots=True)
class KVCommand:
    """A change to the residency index asked of the kvstore; exactly one answer goes to
    `reply_to`."""

    KIND = "command"
    VERSION = 1
    op: CommandOp
    key: str
    reply_to: str  # a keys.reply_key
    new_key: str = ""  # FORK: the new session's cache key
    # unix seconds; past it the caller has given up and was told so: the command is dropped
    deadline: float = 0.0


class AnswerStatus(enum.StrEnum):
    OK = "ok"
    NOT_FOUND = "not_found"
    EXISTS = "exists"  # FORK: the new id is taken
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class CommandAnswer:
    KIND = "answer"
    VERSION = 1
    status: AnswerStatus
    tier: str = ""  # EVICT: the session's tier now (spilling when it was ordered out)
    message: str = field(default="")  # ERROR: why


Message = (
    Job
    | TokenChunk
    | Completion
    | JobError
    | SessionEvent
    | ControlOrder
    | KVCommand
    | CommandAnswer
)
