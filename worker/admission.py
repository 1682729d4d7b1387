"""Which jobs start, and when: free batch slots by class, preemption of BATCH jobs for
INTERACTIVE ones, jobs held while their session is read back, and their start in the
engine."""

from __future__ import annotations

import logging
import time

from broker import keys
from broker.fair_queue import Rooms
from broker.leases import Delivery
from broker.messages import EventKind, JobError, OrderOp
from common.enums import Priority
from common.errors import PromptTooLongError, WarmfleetError
from engine.kv.kv_pool import PagedKV
from engine.sequence import Request
from worker.residency import Ready, Residency
from worker.state import InFlight, WorkerState

log = logging.getLogger("warmfleet.worker")
ADOPTED_ORDERS = (OrderOp.DROP, OrderOp.FORK)  # carried out from a dead worker's stream too


class Admission:
    def __init__(self, state: WorkerState, residency: Residency) -> None:
        self.s = state
        self.residency = residency
        self.prefetched: list[Delivery] = []  # read with the last publish, not yet started

    def capacity(self) -> int:
        """Free batch slots: running requests count, paused (preempted) ones do not."""
        engine = self.s.engine
        active = len(self.s.inflight) - len(engine.paused) + len(self.residency.held)
        return engine.config.max_running - active - len(self.prefetched)

    def rooms(self) -> Rooms:
        """How many jobs to take by class: paused requests get free slots back before new
        NORMAL or BATCH ones; INTERACTIVE ones may also take running BATCH requests' slots
        (they preempt them)."""
        if self.s.stopping:
            return (0, 0, 0)
        free = max(0, self.capacity())
        rest = max(0, free - len(self.s.engine.paused))
        return (free + len(self._preemptible()), rest, rest)

    def start(self, d: Delivery) -> None:
        """A delivery read from Redis: an order, or a job to hold or admit."""
        out = self.s.outbox
        if d.order is not None or d.job is None:
            if d.order is None:
                log.warning("unreadable entry %s on %s dropped: %s", d.entry_id, d.stream, d.error)
            elif not self._concerns_me(d):
                log.info("order %s for %s on %s ignored: it was for the dead worker's memory",
                         d.order.op.name, d.order.key, d.stream)  # fmt: skip
            elif d.order.op == OrderOp.DRAIN:
                if not self.s.stopping:
                    log.info("draining (an operator asked): finishing %d running request(s)",
                             len(self.s.inflight))  # fmt: skip
                self.s.stopping = True
            else:
                self.residency.carry_out(d.order)
            out.acks.append(d)
            return
        job = d.job
        if job.request_id in self.s.inflight:
            return  # our own entry, claimed back: it is already running
        if d.progress.ended:  # taken over after its worker had published its end
            out.acks.append(d)
            return
        if time.time() > job.deadline_at:
            late = JobError("DEADLINE_EXCEEDED", "deadline passed in the queue")
            out.results.append((job.request_id, late))
            out.acks.append(d)
            return
        key = keys.cache_key(job.tenant, job.session_id) if job.session_id else None
        r = self.residency
        if key is None or not (r.hold_for_restore(d, key) or r.hold_for_prefix(d, key)):
            self.admit(d, key)

    def _concerns_me(self, d: Delivery) -> bool:
        """An order on a dead worker's stream, adopted with its requests, was about that
        worker's memory (SPILL, FORGET, DRAIN, REPORT): carried out here it would forget
        or drain this worker's own. DROP and FORK answer a command that waits, and are
        about the session wherever it is: they are carried out."""
        assert d.order is not None
        return d.stream == self.s.broker.pinned or d.order.op in ADOPTED_ORDERS

    def admit_ready(self, ready: list[Ready]) -> None:
        for r in ready:
            self.admit(r.delivery, r.key, r.kv_from or None, r.cache)

    def admit(
        self,
        d: Delivery,
        key: str | None,
        kv_from: str | None = None,
        restored: PagedKV | None = None,
    ) -> None:
        """Start the job in the engine, on `restored` (its session's KV, or its prompt's
        shared prefix, read back) if given, else on what the pool or a write in flight
        holds (`kv_from` None: looked for here)."""
        job = d.job
        assert job is not None
        if job.priority == Priority.INTERACTIVE:
            self._preempt_for(job.request_id)
        if kv_from is None:
            kv_from, restored = self.residency.bring_back(key) if key else ("none", None)
        # a job taken over goes on after the tokens already sent: all but the last are
        # prefilled, the last is sampled again (the gateway drops it) so that every way of
        # ending (a stop string, max_tokens, end of turn) is decided as it was
        generated = list(d.progress.sent[:-1])
        request = Request(
            job.request_id, list(job.prompt_ids), job.sampling, key, job.tenant, generated
        )
        try:
            seq = self.s.engine.add(request, restored)
        except WarmfleetError as e:  # the engine's own guards (the gateway checked first)
            if restored is not None:
                restored.release()
            code = "RESOURCE_EXHAUSTED" if isinstance(e, PromptTooLongError) else "INVALID_ARGUMENT"
            self.s.outbox.results.append((job.request_id, JobError(code, str(e))))
            self.s.outbox.acks.append(d)
            return
        f = InFlight(d, job, time.time(), len(generated), cache_key=key, kv_from=kv_from)
        self.s.inflight[job.request_id] = f
        if d.progress.sent:
            f.resumed = (len(d.progress.sent), self.s.engine.stats.num_steps)
            log.info(
                "resuming %s after the %d token(s) already sent",
                job.request_id,
                len(d.progress.sent),
            )
        if key:  # the kvstore indexes the session as the holder of its prompt's prefix marks
            marks = job.prefix_marks
            hot = self.s.event(EventKind.HOT, key, seq.cache, source=kv_from, marks=marks)
            self.s.outbox.events.append(hot)

    def resume_paused(self) -> None:
        for rid in list(self.s.engine.paused):  # oldest first
            if self.capacity() <= 0:
                break
            self.s.engine.resume(rid)
            log.info("resuming %s", rid)

    def _preemptible(self) -> list[str]:
        """Running BATCH requests, most recently admitted first."""
        running = [
            f for rid, f in self.s.inflight.items()
            if f.job.priority == Priority.BATCH and rid not in self.s.engine.paused
        ]  # fmt: skip
        return [f.job.request_id for f in sorted(running, key=lambda f: -f.admitted_at)]

    def _preempt_for(self, request_id: str) -> None:
        """An INTERACTIVE request arrives at a full worker: pause a BATCH one (its KV stays
        in memory, its client sees a pause) so that it starts in the next step."""
        if self.capacity() > 0:
            return
        victims = self._preemptible()
        if victims and self.s.engine.pause(victims[0]):
            log.info("pausing %s (batch) for %s (interactive)", victims[0], request_id)
