"""What the worker's parts share: the engine, the broker, the requests it runs, and what
the current pass will publish."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from broker import keys
from broker.leases import Delivery
from broker.messages import EventKind, GoneReason, Job, SessionEvent
from broker.worker_broker import Outbox, WorkerBroker
from engine.engine import Engine
from engine.kv.kv_pool import PagedKV
from engine.kv_files.spill_file import SpilledKV
from worker.config import WorkerConfig
from worker.spiller import Spiller


@dataclass(slots=True)
class InFlight:
    """A request the engine runs (or has paused)."""

    delivery: Delivery
    job: Job
    admitted_at: float  # unix seconds
    next_index: int = 0  # index of the next generated token to publish
    cache_key: str | None = None
    # where the session's KV was found: none, pool, pending, disk; shared: its prompt's
    # prefix, from the block files another worker of the host wrote
    kv_from: str = "none"
    # taken over with tokens an earlier worker sent: (how many, the engine's step count at
    # admission), until the first token past them is published
    resumed: tuple[int, int] | None = None


@dataclass(slots=True)
class WorkerState:
    config: WorkerConfig
    engine: Engine
    broker: WorkerBroker
    spiller: Spiller | None  # None: evicted sessions are forgotten
    inflight: dict[str, InFlight] = field(default_factory=dict)
    outbox: Outbox = field(default_factory=Outbox)
    stopping: bool = False  # first signal: take no new requests, finish the running ones

    def event(
        self,
        kind: EventKind,
        key: str,
        cache: PagedKV | None,
        *,
        source: str = "",
        reason: GoneReason | None = None,
        reply_to: str = "",
        marks: tuple[str, ...] = (),
    ) -> SessionEvent:
        """An event about the session `key` whose KV on this worker is `cache`."""
        num_tokens, nbytes = (cache.offset, cache.nbytes) if cache is not None else (0, 0)
        return SessionEvent(
            kind, self.config.worker_id, key, num_tokens, nbytes, time.time(), source=source,
            reason=reason, reply_to=reply_to, warm_bytes=self.engine.sessions.nbytes,
            marks=marks,
        )  # fmt: skip

    def load(self, key: str, kv: SpilledKV) -> PagedKV:
        """A session's KV read back, put into the engine's pool (within its tenant)."""
        tenant, _ = keys.split_cache_key(key)
        return self.engine.load_kv(tenant, kv)

    def running(self, key: str) -> bool:
        """Whether a request of session `key` runs here."""
        return any(f.cache_key == key for f in self.inflight.values())


def cache_key(d: Delivery) -> str | None:
    """The session key of a delivered job (None without a session)."""
    job = d.job
    return keys.cache_key(job.tenant, job.session_id) if job and job.session_id else None
