"""A draining worker's hand-over: from its first stop signal no job is routed to it, and the
jobs waiting on its stream go to another live worker, once their session's KV is on disk
(if that is quick)."""

from __future__ import annotations

import logging
import time

from broker.leases import Delivery
from worker.admission import Admission
from worker.residency import Residency
from worker.state import WorkerState, cache_key

log = logging.getLogger("warmfleet.worker")
HANDOVER_SPILL_S = 2.0  # a draining worker waits this long for a session's spill at most


class Handover:
    def __init__(self, state: WorkerState, residency: Residency, admission: Admission) -> None:
        self.s = state
        self.residency = residency
        self.admission = admission
        self.waiting: dict[str, tuple[list[Delivery], float]] = {}  # key -> (jobs, deadline)
        self._started = False

    def drain_pass(self) -> None:
        """Once per pass while stopping: mark the worker draining (once), read what reached
        its stream, carry out orders, hand jobs over."""
        if not self._started:
            self.s.broker.set_draining()
            self._started = True
            log.info("draining: handing over what has not started")
        pending, self.admission.prefetched = self.admission.prefetched, []
        for d in pending + self.s.broker.read_pinned(64):
            if d.job is None:
                self.admission.start(d)
            else:
                self._hand_over(d)
        self._release()

    def _hand_over(self, d: Delivery) -> None:
        key = cache_key(d)
        if key and key in self.waiting:
            self.waiting[key][0].append(d)
            return
        spiller = self.s.spiller
        if key and spiller is not None:
            cache = self.s.engine.sessions.take(key)
            if cache is not None:
                self.residency.evict(key, cache)  # the taker reads it back from disk
            if spiller.is_writing(key):
                self.waiting[key] = ([d], time.monotonic() + HANDOVER_SPILL_S)
                return
        self._move(d)

    def _release(self) -> None:
        now = time.monotonic()
        spiller = self.s.spiller
        for key, (waiting, deadline) in list(self.waiting.items()):
            if spiller is not None and spiller.is_writing(key) and now < deadline:
                continue
            del self.waiting[key]
            for d in waiting:
                self._move(d)

    def _move(self, d: Delivery) -> None:
        taker = self.s.broker.hand_over(d)
        assert d.job is not None
        if taker:
            log.info("handed %s over to %s", d.job.request_id, taker)
        else:
            log.info("no other worker is live: serving %s before stopping", d.job.request_id)
            self.admission.start(d)
