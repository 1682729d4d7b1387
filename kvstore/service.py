"""The kvstore process: consumes the workers' session events, keeps the residency index in
Redis, sends eviction orders, and keeps the spill directory within its disk budget.

Events are read with a consumer group, and an event is acknowledged in the same Redis
transaction that writes what it changed and moves the applied-events marker (writer.py),
so a kvstore killed at any point resumes where it stopped: pending events are read again
first, and no event is applied twice. When the connection to Redis fails, the kvstore
rebuilds its picture once Redis answers again (Redis may have restarted, kept or lost its
state, and the last transaction may or may not have landed); and a worker seen live again
after its heartbeat lapsed is asked for its inventory (the index took its sessions for lost).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import redis

from broker import codec, keys
from broker.messages import (
    AnswerStatus,
    CommandAnswer,
    ControlOrder,
    KVCommand,
    OrderOp,
    SessionEvent,
)
from broker.records import SessionRecord
from broker.streams import ensure_group
from common.backoff import Backoff
from common.errors import ProtocolError
from common.v1 import kvstore_pb2 as pb
from engine.kv_files.spill_file import spill_path
from kvstore import usage
from kvstore.disk_sweep import DiskSweep
from kvstore.effects import Effects, Order
from kvstore.index import ResidencyIndex
from kvstore.writer import IndexWriter

log = logging.getLogger("warmfleet.kvstore")
CONSUMER = "kvstore"
BATCH = 512  # events applied per transaction at most
REFRESH_S = 0.5  # how often worker liveness and budgets are read
HEARTBEAT_TTL_S = 3.0  # workers keep their idle sessions within budget themselves past it


class KVStore:
    def __init__(
        self,
        r: redis.Redis,
        spill_dir: str | Path,
        disk_budget: int | None,
        block_ms: int = 200,
    ) -> None:
        self.r = r
        self.spill_dir = Path(spill_dir)
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        self.disk_budget = disk_budget
        self.sweep = DiskSweep(self.spill_dir)
        self.index = ResidencyIndex(disk_budget, self._file_info, self.sweep.file_blocks)
        self.lock = threading.Lock()  # the gRPC threads read the index the loop changes
        self.statuses: dict[str, dict[str, Any]] = {}  # live workers' heartbeats
        self.stopping = threading.Event()
        self.block_ms = block_ms
        self.writer = IndexWriter(r, self.sweep, self._any_worker)
        self._backlog = True  # events delivered to us before a restart, not yet acked
        self._next_refresh = 0.0
        self._started = False  # start() asks every live worker; then each that returns
        self._stale = False  # the picture may not be Redis's: rebuild before the next step

    # ---- start --------------------------------------------------------------------

    def start(self) -> None:
        """Load the index, match it with the disk and the live workers, and ask each live
        worker for its inventory (so that what happened while no kvstore ran is known)."""
        ensure_group(self.r, keys.KV_EVENTS, keys.KV_GROUP)
        self.writer.load_marker()
        records = self._load_records()
        files = self._scan_disk()
        with self.lock:
            self.index.load(records)
            fx = self.index.reconcile_disk(files)
        fx.merge(self._refresh())
        self.writer.commit(fx, [])
        # apply what happened while no kvstore ran, then ask each worker what it holds
        # (orders that backlog caused reach a worker before its report order does)
        applied = 0
        while True:  # first the events delivered before a restart, then the new ones
            was_backlog = self._backlog
            n = self.step(block=False)
            applied += n
            if n == 0 and not was_backlog:
                break
        if applied:
            log.info("applied %d events that arrived while no kvstore ran", applied)
        report = ControlOrder(OrderOp.REPORT)
        reports = Effects(orders=[Order(w, report) for w in sorted(self.index.alive)])
        self.writer.commit(reports, [])
        self._started = True
        counts = self.index.table.tier_counts()
        log.info(
            "index: %d sessions (%s); %d live workers; spill dir %s",
            len(self.index.table.records),
            ", ".join(f"{n} {t}" for t, n in counts.items()),
            len(self.index.alive),
            self.spill_dir,
        )

    def _load_records(self) -> dict[str, SessionRecord]:
        names = list(self.r.scan_iter(match=f"{keys.session_prefix()}*", count=1000))
        pipe = self.r.pipeline(transaction=False)
        for name in names:
            pipe.hgetall(name)
        records = {}
        for name, fields in zip(names, pipe.execute(), strict=True):
            if fields:
                key = keys.cache_key(*keys.parse_session_key(name))
                records[key] = SessionRecord.from_fields(fields)
        return records

    def _scan_disk(self) -> dict[str, tuple[int, int, int]]:
        files, rejected = self.sweep.scan()
        if rejected:
            self.r.hincrby(keys.KV_STATS, "rejected_files", rejected)
        return files

    # ---- loop ---------------------------------------------------------------------

    def run(self) -> None:
        backoff = Backoff()
        while not self.stopping.is_set():
            try:
                if self._stale:
                    self.rebuild()
                self.step()
                backoff.reset()
            except redis.WatchError as e:
                log.warning("%s: rebuilding the index", e)
                self._stale = True
                self.stopping.wait(backoff.next_s())  # two kvstores at once take turns
            except redis.ResponseError as e:
                if "NOGROUP" not in str(e):
                    raise
                log.warning("Redis lost the event stream's group (it restarted without "
                            "persistence): rebuilding the index")  # fmt: skip
                self._stale = True
            except redis.RedisError as e:
                delay = backoff.next_s()
                log.warning("redis: %s; retrying in %.1f s, then rebuilding the index", e, delay)
                self._stale = True
                self.stopping.wait(delay)

    def rebuild(self) -> None:
        """Start over from what Redis, the spill directory and the workers' inventories say
        (after Redis restarted or a transaction's fate is unknown, the index in memory may
        describe a world that is gone)."""
        with self.lock:
            self.index = ResidencyIndex(self.disk_budget, self._file_info, self.sweep.file_blocks)
        self._backlog = True
        self._started = False
        self.start()
        self._stale = False

    def step(self, *, block: bool = True) -> int:
        """Apply one batch of events (waiting up to block_ms for some); how many."""
        fx = Effects()
        refreshed = time.monotonic() >= self._next_refresh
        if refreshed:
            fx.merge(self._refresh())
            self._next_refresh = time.monotonic() + REFRESH_S
        if self.sweep.due():
            self.sweep.run()
        entries = self._read(block)
        items: list[SessionEvent | KVCommand] = []
        for entry_id, fields in entries:
            if not fields:  # deleted while pending
                continue
            try:
                items.append(codec.decode_fields(fields, SessionEvent, KVCommand))
            except ProtocolError as e:
                log.warning("unreadable event %s dropped: %s", entry_id, e)
                fx.replies += _refusal(fields, str(e))
        if any(isinstance(i, SessionEvent) and i.worker not in self.index.alive for i in items):
            # a worker that started since the last look: know it before its sessions, or a
            # command would take it for dead (a delete would then never reach its memory)
            fx.merge(self._refresh())
            self._next_refresh = time.monotonic() + REFRESH_S
        with self.lock:
            for item in items:
                fx.merge(self.index.apply(item))
        self.writer.commit(fx, [entry_id for entry_id, _ in entries])
        if refreshed:  # for dashboards, which need not reach the kvstore's gRPC port
            report = usage.to_json(self.usage())
            self.r.set(keys.KV_USAGE, report, px=int(HEARTBEAT_TTL_S * 1000))
        return len(entries)

    def _read(self, block: bool) -> list[tuple[str, dict[str, str]]]:
        start = "0" if self._backlog else ">"
        reply = self.r.xreadgroup(
            keys.KV_GROUP,
            CONSUMER,
            {keys.KV_EVENTS: start},
            count=BATCH,
            block=self.block_ms if block and not self._backlog else None,
        )
        entries = [(eid, f) for _, batch in reply or [] for eid, f in batch]
        if self._backlog and not entries:
            self._backlog = False
        return entries

    def _refresh(self) -> Effects:
        """Tell the workers this kvstore runs, and read their heartbeats (status and warm
        budget)."""
        self.r.set(keys.KVSTORE_HEARTBEAT, "1", px=int(HEARTBEAT_TTL_S * 1000))
        members = sorted(self.r.smembers(keys.WORKERS))
        beats = self.r.mget([keys.heartbeat_key(w) for w in members]) if members else []
        statuses = {w: json.loads(b) for w, b in zip(members, beats, strict=True) if b}
        with self.lock:
            self.statuses = statuses
            budgets = {w: int(s.get("warm_budget", 0)) for w, s in statuses.items()}
            pool = {w: int(s.get("pool_bytes", 0)) for w, s in statuses.items()}
            pids = {w: int(s.get("pid", 0)) for w, s in statuses.items()}
            return self.index.set_workers(
                budgets, ask_returned=self._started, pool_bytes=pool, pids=pids
            )

    # ---- effects ------------------------------------------------------------------

    def _any_worker(self) -> str:
        """A live worker for an order any worker of the host can carry out ("" if none):
        the one with the fewest running requests."""
        running = {
            w: s.get("num_running", 0) for w, s in self.statuses.items() if not s.get("stopping")
        }
        return min(running, key=lambda w: (running[w], w), default="")

    def _file_info(self, key: str) -> tuple[int, int] | None:
        try:
            st = spill_path(self.spill_dir, key).stat()
        except FileNotFoundError:
            return None
        return st.st_size, st.st_mtime_ns

    # ---- reading (for the gRPC service and the metrics) -------------------------------

    def usage(self) -> pb.KVUsage:
        """The usage report now (raises redis.RedisError: the counters and backlog are read
        from Redis)."""
        counters, behind = self.counters(), self.events_behind()
        with self.lock:
            return usage.build(self.index, self.statuses, self.spill_dir, counters, behind)

    def counters(self) -> dict[str, int]:
        return {k: int(v) for k, v in self.r.hgetall(keys.KV_STATS).items()}

    def events_behind(self) -> int:
        return int(self.r.xlen(keys.KV_EVENTS))


def _refusal(fields: dict[str, str], reason: str) -> list[tuple[str, CommandAnswer]]:
    """An ERROR answer for an unreadable command that names a reply key (a newer caller's
    command, say), so that its caller hears at once instead of timing out."""
    try:
        reply_to = json.loads(fields[codec.FIELD]).get("reply_to")
    except (KeyError, ValueError, AttributeError):
        return []
    if not isinstance(reply_to, str) or not reply_to.startswith(keys.reply_key("")):
        return []
    return [(reply_to, CommandAnswer(AnswerStatus.ERROR, message=f"unreadable command: {reason}"))]
