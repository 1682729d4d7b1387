"""The worker loop: each pass admits jobs, runs one engine step, and publishes its results,
session events and acks in one round trip. Admission, residency (restores, spills, orders)
and the drain's hand-over are parts of their own; the heartbeat runs on its own thread."""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import asdict
from typing import Any

import redis

from broker.messages import JobError, TokenChunk
from broker.worker_broker import LostState, Outbox, WorkerBroker, is_lost_group
from engine import sequence
from engine.engine import Engine
from engine.kv_files.kv_dtypes import kv_name
from worker import results
from worker.admission import Admission
from worker.config import WorkerConfig
from worker.handover import Handover
from worker.liveness import Liveness
from worker.metrics import WorkerMetrics
from worker.residency import Residency
from worker.spiller import Spiller
from worker.state import InFlight, WorkerState

log = logging.getLogger("warmfleet.worker")
DRAIN_POLL_S = 0.02  # a draining worker with nothing to step waits this long per pass


class Worker:
    def __init__(
        self,
        engine: Engine,
        broker: WorkerBroker,
        config: WorkerConfig,
        spiller: Spiller | None = None,
    ) -> None:
        self.state = s = WorkerState(config, engine, broker, spiller)
        self.residency = Residency(s)
        self.admission = Admission(s, self.residency)
        self.handover = Handover(s, self.residency, self.admission)
        self.metrics = WorkerMetrics(s)  # served when the command is given a port
        self.liveness = Liveness(broker, config.lease_s, config.heartbeat_interval_s,
                                 config.stall_s, config.heartbeat_ttl_s)  # fmt: skip
        self.stop_now = False  # second signal: leave at once (leases hand the work over)
        self._next_reclaim = 0.0
        self._published_running: list[str] = []

    @property
    def stopping(self) -> bool:
        """First signal: take no new jobs, hand over the waiting ones, finish the running."""
        return self.state.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.state.stopping = value

    @property
    def inflight(self) -> dict[str, InFlight]:
        return self.state.inflight

    def status(self) -> dict[str, Any]:
        s, engine = self.state, self.state.engine
        return {
            "worker_id": s.config.worker_id,
            "pid": os.getpid(),
            "running": sorted(s.inflight),
            "paused": sorted(engine.paused),
            "num_running": len(s.inflight),
            # running from a dead worker's stream: DISPATCH adds them to this one's load
            "num_adopted": sum(f.delivery.stream != s.broker.pinned for f in s.inflight.values()),
            "num_sessions": len(engine.sessions),
            "pool_bytes": engine.sessions.nbytes,  # idle sessions' blocks, each once
            "kv_dtype": kv_name(engine.model.kv_dtype),
            "kv_bytes_per_token": engine.model.bytes_per_token,  # all layers, keys and values
            "kv_blocks": self._blocks(),
            "warm_budget": s.config.warm_budget_bytes,
            "max_running": engine.config.max_running,  # batch slots
            "steps": engine.stats.num_steps,
            "generated_tokens": engine.stats.num_generated_tokens,
            "prefill_tokens": engine.stats.num_prefill_tokens,
            "step_seconds": round(engine.stats.step_seconds, 6),  # all steps together
            "at": round(time.time(), 3),  # when this status was taken
            "stopping": s.stopping,
            "kvstore_seen": self.liveness.kvstore_alive,
            "model_fingerprint": engine.model.fingerprint,
            "device": engine.model.device,
            "weights": engine.model.weights_mode,
            "weight_bytes": engine.model.weight_bytes,  # resident weights, as loaded
            "spill": asdict(s.spiller.stats) if s.spiller else None,
        }

    def _blocks(self) -> dict[str, int]:
        """The KV pool: its blocks, those held, and a block's bytes."""
        pool = self.state.engine.pool
        return {"size": pool.alloc.num_blocks, "held": pool.alloc.num_held,
                "block_bytes": pool.block_bytes}  # fmt: skip

    def run(self, max_steps: int | None = None) -> None:
        """Serve until stopped (or until `max_steps` engine steps, for tests)."""
        s = self.state
        s.broker.register(self.status(), s.config.heartbeat_ttl_s)
        self.liveness.start(json.dumps(self.status()))
        s.outbox.events.append(self.residency.inventory())  # a fresh start holds nothing
        log.info("worker %s ready", s.config.worker_id)
        backoff = 0.1
        try:
            while not self.stop_now and not (s.stopping and self._idle()):
                if max_steps is not None and s.engine.stats.num_steps >= max_steps:
                    break
                try:
                    if self.liveness.lost.is_set():
                        self._rejoin()
                    self._pass()
                    backoff = 0.1
                except LostState:
                    self.liveness.lost.set()
                except redis.RedisError as e:
                    if isinstance(e, redis.ResponseError) and is_lost_group(e):
                        self.liveness.lost.set()
                        continue
                    if s.stopping and self.liveness.lapsed:  # nothing can be handed over
                        log.warning("draining, but Redis is gone (%s): stopping now", e)
                        break
                    log.warning("redis: %s; retrying in %.1f s", e, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, s.config.max_backoff_s)
        finally:
            self.teardown()

    def teardown(self) -> None:
        self.liveness.stop()
        self.residency.close()
        try:
            self.state.broker.unregister()
        except redis.RedisError as e:
            log.warning("could not unregister: %s", e)

    def _idle(self) -> bool:
        """Nothing started, held or waiting to be handed over."""
        return not (
            self.state.inflight or self.admission.prefetched or self.residency.held
            or self.handover.waiting
        )  # fmt: skip

    def _rejoin(self) -> None:
        """Redis lost this worker's registration and consumer groups (it restarted without
        persistence), or took the worker for dead: the entries it held are gone or another
        worker's, and their clients were told so. Stop them (their KV stays with their
        sessions), register again, and tell the kvstore what is held."""
        s = self.state
        dropped = sorted(s.inflight)
        for rid in dropped:
            s.engine.abort(rid)
        s.inflight.clear()
        self.residency.drop_held()
        self.admission.prefetched.clear()
        self.handover.waiting.clear()
        s.outbox = Outbox()
        self._published_running = []
        self.liveness.lost.clear()
        s.broker.register(self.status(), s.config.heartbeat_ttl_s)
        if s.stopping:
            s.broker.set_draining()
        s.outbox.events.append(self.residency.inventory())
        log.warning(
            "Redis no longer knew this worker (restarted, or took it for dead): registered "
            "again; %d request(s) in flight dropped", len(dropped)
        )  # fmt: skip

    def _pass(self) -> None:
        s = self.state
        self._housekeeping()
        if s.stopping:
            self.handover.drain_pass()
        self.admission.admit_ready(self.residency.finish_restores())
        deliveries, self.admission.prefetched = self.admission.prefetched, []
        if not deliveries and not s.stopping and not s.engine.has_work:
            self.residency.wait_a_little()  # a read may finish and admit a job
            self.admission.admit_ready(self.residency.finish_restores())
            if not s.engine.has_work:
                pending = s.outbox.results or s.outbox.acks or self.residency.reading
                block = None if pending else s.config.idle_block_ms
                deliveries = s.broker.read(self.admission.rooms(), block)
        for d in deliveries:
            self.admission.start(d)
        self.admission.resume_paused()
        if s.engine.has_work:
            self._step()
        elif s.stopping and not self.residency.reading:
            time.sleep(DRAIN_POLL_S)  # draining, nothing to step: do not spin
        self._flush()
        running = [f.delivery for f in s.inflight.values()]
        self.liveness.update(json.dumps(self.status()), [*running, *self.residency.held])

    def _housekeeping(self) -> None:
        """Keep the pool's own limit; take over jobs whose worker died (checked every
        takeover_check_s: a dead worker is noticed as soon as its heartbeat lapses)."""
        s, pool = self.state, self.state.engine.sessions
        # while the kvstore runs it alone decides spills; the pool only guards memory
        c = s.config
        budget = c.pool_ceiling_bytes if self.liveness.kvstore_alive else c.warm_budget_bytes
        if pool.budget_bytes != budget:
            s.engine.set_session_budget(budget)
        now = time.monotonic()
        if now >= self._next_reclaim and not s.stopping:
            for d in s.broker.reclaim(max(0, self.admission.capacity())):
                log.info("taking over %s from %s", d.entry_id, d.stream)
                self.admission.start(d)
            self._next_reclaim = now + c.takeover_check_s

    def _step(self) -> None:
        s = self.state
        steps = s.engine.stats.num_steps
        try:
            outputs = s.engine.step()
        except MemoryError as e:
            self._out_of_memory(e)
            return
        if s.engine.stats.num_steps > steps:
            self.metrics.step_time.observe(s.engine.stats.last_step_s)
        for out in outputs:
            f = s.inflight.get(out.request_id)
            if f is None:
                continue
            if out.token_ids or out.text:
                chunk = TokenChunk(f.next_index, tuple(out.token_ids), out.text)
                s.outbox.results.append((out.request_id, chunk))
                f.next_index += len(out.token_ids)
                if f.resumed is not None and f.next_index > f.resumed[0]:
                    self._resumed(f, f.resumed)
            if out.completion is not None:
                self._finish(f, out.completion)

    def _resumed(self, f: InFlight, resumed: tuple[int, int]) -> None:
        """A job taken over published its first token past those already sent."""
        num_sent, at_step = resumed
        f.resumed = None
        steps = self.state.engine.stats.num_steps - at_step
        log.info(
            "resumed %s: its first new token after %d engine step(s) (a prompt of %d "
            "tokens, %d sent)",
            f.job.request_id,
            steps,
            len(f.job.prompt_ids),
            num_sent,
        )

    def _out_of_memory(self, e: MemoryError) -> None:
        """A step of one row could not get the memory it needed (its kernels' scratch, its
        arrays; larger steps the engine runs again in halves): nothing of it was kept. Its
        requests, every running one, end with RESOURCE_EXHAUSTED, their sessions keeping
        the KV they had before it; paused ones and the worker go on."""
        s = self.state
        ended = [rid for rid in s.inflight if rid not in s.engine.paused]
        log.error("a step ran out of memory (%s): %d running request(s) ended", e, len(ended))
        message = f"the worker ran out of memory for a step: {e or 'allocation failed'}"
        for rid in ended:
            s.engine.abort(rid)
            f = s.inflight.pop(rid)
            s.outbox.results.append((rid, JobError("RESOURCE_EXHAUSTED", message)))
            s.outbox.acks.append(f.delivery)
            s.outbox.used_tokens[rid] = len(f.job.prompt_ids) + f.next_index
            if f.cache_key:
                self.residency.session_ended(f.cache_key)

    def _finish(self, f: InFlight, c: sequence.Completion) -> None:
        s = self.state
        del s.inflight[f.job.request_id]
        s.outbox.results.append((f.job.request_id, results.completion(f, c, s.config.worker_id)))
        s.outbox.acks.append(f.delivery)
        s.outbox.used_tokens[f.job.request_id] = len(f.job.prompt_ids) + c.completion_tokens
        if f.cache_key:
            self.residency.session_ended(f.cache_key)

    def _flush(self) -> None:
        """Publish the pass's outbox; stop the jobs whose clients cancelled."""
        s = self.state
        self.residency.flush(self.liveness.kvstore_alive)
        out, s.outbox = s.outbox, Outbox()
        status = None
        if sorted(s.inflight) != self._published_running:  # keep the status exact
            status = (self.status(), s.config.heartbeat_ttl_s)
            self._published_running = sorted(s.inflight)
        rooms = self.admission.rooms() if s.engine.has_work else (0, 0, 0)
        cancelled, prefetched = s.broker.publish(out, list(s.inflight), status, rooms)
        self.admission.prefetched += prefetched
        for rid in cancelled:
            stopped = s.engine.abort(rid)
            f = s.inflight.get(rid)
            if f is not None and stopped is not None and stopped.completion is not None:
                self._finish(f, stopped.completion)
        if cancelled:
            self._flush()
