"""A new session's prompt prefix that another worker of this host holds in memory, or that
only sessions on disk hold, read from the spill directory's block files instead of
prefilled again.

The gateway names in each job the worker holding the session that last sent the longest
marked prefix of its prompt, and that prefix's length (Job.prefix_from, prefix_tokens;
gateway/session_find.py). Placement sends the request there while that worker has room
(broker/placement.py); when it lands here instead, this worker's pool holds fewer of those
blocks, and the holder shares this worker's spill directory (each worker leaves its name in
the directory's workers/ folder while it runs), this worker holds the request and asks the
holder to write the blocks: a SHARE order on the holder's pinned stream, naming the
prompt's whole blocks (past the marked prefix too: the holder writes all of them it holds)
and the request, which the holder carries out between two steps (the blocks copied out of
its pool, the files not on disk yet written on its I/O thread, then an answer file named by
the request in the directory's shared/ folder). Once the answer is there, the run of the
prompt's blocks on disk is read back into this worker's pool, as a restore is, and the
request starts on it (kv_source DISK). When the marked prefix's blocks are on disk already
(a spilled session's), they are read without asking; so is a prefix whose sessions are all
on disk (the job then names no holder, only the prefix's length), where this host's spill
directory has its blocks.

It waits at most what prefilling the prefix would take here (the per-token prefill cost the
engine measured: engine/step_cost.py), SHARE_WAIT_S before any was measured, never more than
MAX_WAIT_S; then it prefills. Workers of different KV dtypes never share: the blocks' hashes
include the dtype, so none is found. Block files that no spill file lists are swept after a
grace (engine/kv_files/block_file.py), which outlasts the read.
"""

from __future__ import annotations

import hashlib
import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker.leases import Delivery
from broker.messages import ControlOrder, OrderOp
from engine.kv.kv_pool import PagedKV, detach
from engine.kv.pool_read import PoolRead
from engine.kv_files.spill_file import ANSWERS_DIR, SpilledKV, SpillStore
from worker.spiller import Spiller
from worker.state import WorkerState

log = logging.getLogger("warmfleet.worker")
SHARE_WAIT_S = 1.0  # the longest wait before the prefill cost is known
MAX_WAIT_S = 5.0
WORKERS_DIR = "workers"


def _named(store: SpillStore, folder: str, name: str) -> Path:
    return store.directory / folder / hashlib.sha256(name.encode()).hexdigest()[:32]


def worker_mark(store: SpillStore, worker_id: str) -> Path:
    """The file naming a worker that uses this spill directory."""
    return _named(store, WORKERS_DIR, worker_id)


def answer_path(store: SpillStore, request_id: str) -> Path:
    """The file a holder writes once it has written the blocks a request asked for."""
    return _named(store, ANSWERS_DIR, request_id)


@dataclass(slots=True)
class Waiting:
    """A request held until its prompt's blocks are on disk and read."""

    delivery: Delivery
    key: str
    tenant: str
    ids: list[int]  # the prompt's whole blocks but the last token
    answer: Path | None  # the holder's answer to wait for; None: read at once
    until: float  # monotonic seconds: then prefill instead
    started: float
    read: Future[Any] | None = None  # a SpilledKV; or, read into the pool, its tokens
    into: PoolRead | None = None  # where (a host pool's blocks)


class SharedPrefixes:
    def __init__(self, state: WorkerState) -> None:
        self.s = state
        self.waiting: list[Waiting] = []
        if state.spiller is not None:
            for folder in (WORKERS_DIR, ANSWERS_DIR):
                (state.spiller.store.directory / folder).mkdir(exist_ok=True)
            worker_mark(state.spiller.store, state.config.worker_id).touch()

    def hold(self, d: Delivery, key: str) -> bool:
        """Hold `d` while its prompt's prefix is read from the blocks its holder writes, or
        from those on disk already; False when there is nothing to read (no holder named,
        the holder is this worker, or of another host and the blocks not on disk here, this
        worker's pool holds the prefix, or the model has windowed layers:
        engine/kv_files/spill_file.py)."""
        job, spiller = d.job, self.s.spiller
        assert job is not None
        if spiller is None or job.prefix_from == self.s.config.worker_id or not job.prefix_tokens:
            return False
        if key in self.s.engine.sessions:  # its own KV here: nothing to hash or read
            return False
        if len(self.s.engine.pool.groups) > 1:  # a windowed model: its sessions' blocks
            return False  # are whole in the full layers only, and none goes to disk
        store, pool = spiller.store, self.s.engine.pool
        size = pool.block_size
        ids = list(job.prompt_ids[: (len(job.prompt_ids) - 1) // size * size])  # one computed
        marked = store.chain(job.tenant, ids[: job.prefix_tokens // size * size], pool.dtype)
        if not marked or pool.alloc.knows(marked[-1]):
            return False
        on_disk = store.has_block(marked[-1])
        if not on_disk and not (job.prefix_from and worker_mark(store, job.prefix_from).exists()):
            return False  # held on another host, or on disk there: never here
        now = time.monotonic()
        answer = None if on_disk else answer_path(store, job.request_id)
        if answer is not None:
            order = ControlOrder(
                OrderOp.SHARE, job.request_id, tenant=job.tenant, token_ids=tuple(ids)
            )
            self.s.outbox.orders.append((job.prefix_from, order))
        until = now + self._wait_s(len(ids))
        self.waiting.append(Waiting(d, key, job.tenant, ids, answer, until, now))
        return True

    def reads(self) -> list[Future[Any]]:
        return [w.read for w in self.waiting if w.read is not None]

    def _wait_s(self, num_tokens: int) -> float:
        per_token = self.s.engine.scheduler.cost.per_token_s
        if per_token is None:
            return SHARE_WAIT_S
        return min(MAX_WAIT_S, num_tokens * per_token)

    def ready(self) -> list[tuple[Delivery, str, PagedKV | None]]:
        """The held requests to start now: on the prefix read back, or (None) to prefill
        it, their wait over."""
        spiller, done = self.s.spiller, []
        for w in list(self.waiting):
            if w.read is None and spiller is not None and self._answered(w):
                self._read(w, spiller)
            if w.read is not None and w.read.done():
                done.append((w.delivery, w.key, self._loaded(w, w.read)))
            elif w.read is None and time.monotonic() > w.until:
                log.info("%s: no shared prefix on disk in time; prefilling it", w.key)
                if w.answer is not None:
                    w.answer.unlink(missing_ok=True)
                done.append((w.delivery, w.key, None))
            else:
                continue
            self.waiting.remove(w)
        return done

    @staticmethod
    def _answered(w: Waiting) -> bool:
        """Whether the holder has written what it holds (the answer file, then gone)."""
        if w.answer is None:
            return True
        try:
            w.answer.unlink()
        except FileNotFoundError:
            return False
        return True

    def _read(self, w: Waiting, spiller: Spiller) -> None:
        """Start reading the prefix's blocks: straight into a host pool's blocks, else into
        arrays."""
        pool = self.s.engine.pool
        if pool.host_blocks:
            w.into = PoolRead(pool, spiller.prefix_listing(w.tenant, w.ids))
            w.read = spiller.read_prefix_into_async(w.into)
        else:
            w.read = spiller.read_prefix_async(w.tenant, w.ids)

    def _loaded(self, w: Waiting, read: Future[Any]) -> PagedKV | None:
        try:
            got = read.result()  # a SpilledKV, or the tokens read into w.into
        except OSError as e:
            log.warning("%s: could not read the shared prefix (%s); prefilling it", w.key, e)
            got = None
        n = len(got.token_ids) if isinstance(got, SpilledKV) else got or 0
        if not n:
            if w.into is not None:
                w.into.abandon()
            return None
        took_ms = (time.monotonic() - w.started) * 1e3
        log.info("%s: %d tokens of a shared prefix read from disk in %.0f ms", w.key, n, took_ms)
        assert self.s.spiller is not None
        self.s.spiller.stats.num_shared_read += 1
        return w.into.finish(n) if w.into is not None else self.s.load(w.key, got)

    def write_for(self, order: ControlOrder) -> None:
        """SHARE: write the blocks of the order's prompt this pool holds (from the first, as
        far as it holds them) to the spill directory for another worker of the host, then
        the answer the order's request waits for."""
        if self.s.spiller is None:
            return
        kv = self.s.engine.pool.new_kv(order.tenant)
        kv.extend_prefix(order.token_ids, len(order.token_ids))  # held while copied out
        held = detach(kv) if kv.offset else None  # detach gives the blocks back; none held
        self.s.spiller.share(held, answer_path(self.s.spiller.store, order.key))

    def close(self) -> None:
        if self.s.spiller is not None:
            worker_mark(self.s.spiller.store, self.s.config.worker_id).unlink(missing_ok=True)
