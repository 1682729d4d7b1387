"""The worker loop: admit requests between engine steps, step, publish, keep leases."""

from __future__ import annotations

import json
import logging
import os
import time
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import redis

from broker import keys
from broker import kv_events as ev
from broker.fair_queue import Rooms
from broker.kv_events import Held, KVEvent, inventory_event
from broker.wire import Fields, WireRequest, chunk_event, done_event, error_event
from broker.worker_broker import Delivery, LostState, WorkerBroker, is_lost_group
from engine.engine import Engine
from engine.kv_cache import KVCache
from engine.sampling import SamplingParams
from engine.sequence import Completion, Request
from warmfleet.errors import InvalidRequestError, PromptTooLongError, WarmfleetError
from worker.liveness import Liveness
from worker.spiller import Spiller

log = logging.getLogger("warmfleet.worker")
RESTORE_POLL_S = 0.02  # an idle worker's wait for a restore before it looks at Redis again
HANDOVER_SPILL_S = 2.0  # a draining worker waits this long for a session's spill at most


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    worker_id: str
    lease_s: float = 5.0  # an entry whose worker stops renewing is taken over after this
    idle_block_ms: int = 500  # longest wait for new requests while idle
    heartbeat_interval_s: float = 0.5
    max_backoff_s: float = 2.0  # cap of the reconnect back-off
    # idle sessions' KV that the kvstore keeps in this worker's memory (it orders the least
    # recently used to disk beyond it); while no kvstore runs, the worker keeps to it itself
    warm_budget_bytes: int = 2 << 30
    stall_s: float = 60.0  # a loop with no pass for this long stops its heartbeat

    @property
    def pool_ceiling_bytes(self) -> int:
        """While the kvstore runs, the pool evicts by itself only past this: a memory guard
        for when its orders do not keep up, far enough above the budget that they do."""
        return max(2 * self.warm_budget_bytes, self.warm_budget_bytes + (1 << 30))

    def __post_init__(self) -> None:
        if (
            not self.worker_id
            or any(c in self.worker_id for c in ":/ ")
            or len(self.worker_id) > 64
        ):
            raise InvalidRequestError("worker_id", "1-64 characters, no ':', '/' or spaces")
        if self.lease_s < 1.0:
            raise InvalidRequestError("lease_s", f"must be >= 1 s, got {self.lease_s}")
        if self.warm_budget_bytes < 0:
            raise InvalidRequestError("warm_budget_bytes", "must be >= 0")
        if self.stall_s < self.lease_s:
            raise InvalidRequestError("stall_s", f"must be >= lease_s ({self.lease_s} s)")


@dataclass(slots=True)
class InFlight:
    delivery: Delivery
    request: WireRequest
    admitted_at: float  # unix seconds
    next_index: int = 0  # index of the next generated token to publish
    cache_key: str | None = None
    kv_from: str = "none"  # where the session's KV was found: none, pool, pending, disk


@dataclass(frozen=True, slots=True)
class Restore:
    """A session's KV being read back from disk on the spiller's I/O thread."""

    future: Future[tuple[KVCache | None, str]]
    started: float  # monotonic seconds


@dataclass(slots=True)
class Outbox:
    """Everything one pass publishes, sent in one round trip."""

    events: list[tuple[str, Fields]] = field(default_factory=list)
    acks: list[Delivery] = field(default_factory=list)
    kv: list[KVEvent] = field(default_factory=list)  # for the kvstore


class Worker:
    def __init__(
        self,
        engine: Engine,
        broker: WorkerBroker,
        config: WorkerConfig,
        spiller: Spiller | None = None,
    ) -> None:
        self.engine = engine
        self.spiller = spiller  # None: evicted sessions are forgotten
        self.broker = broker
        self.config = config
        self.inflight: dict[str, InFlight] = {}
        self.stopping = False  # first signal: take no new requests, finish the running ones
        self.stop_now = False  # second signal: leave at once (leases hand the work over)
        self._next_reclaim = 0.0
        self._outbox = Outbox()
        self._published_running: list[str] = []
        self._prefetched: list[Delivery] = []  # read with the last publish, not yet started
        self._drop_at_finish: set[str] = set()  # sessions deleted while a request used them
        self._last_used: dict[str, float] = {}  # when each pooled session's last request ended
        # sessions read back from disk on the I/O thread, and the requests waiting for them
        self._restoring: dict[str, Restore] = {}
        self._held: list[Delivery] = []
        # draining: requests waiting for their session's spill before they are handed over
        self._handing: dict[str, tuple[list[Delivery], float]] = {}
        self._draining = False
        self.liveness = Liveness(
            broker, config.lease_s, config.heartbeat_interval_s, config.stall_s
        )

    def status(self) -> dict[str, Any]:
        return {
            "worker_id": self.config.worker_id,
            "pid": os.getpid(),
            "running": sorted(self.inflight),
            "paused": sorted(self.engine.paused),
            "num_running": len(self.inflight),
            "num_sessions": len(self.engine.sessions),
            "pool_bytes": self.engine.sessions.nbytes,
            "warm_budget": self.config.warm_budget_bytes,
            "steps": self.engine.stats.num_steps,
            "stopping": self.stopping,
            "kvstore_seen": self.liveness.kvstore_alive,
            "model_fingerprint": self.engine.model.fingerprint,
            "spill": asdict(self.spiller.stats) if self.spiller else None,
        }

    def run(self, max_steps: int | None = None) -> None:
        """Serve until stopped (or until `max_steps` engine steps, for tests)."""
        backoff = 0.1
        self.broker.register(self.status(), self.config.lease_s)
        self.liveness.start(json.dumps(self.status()))
        self._outbox.kv.append(self._inventory())  # a fresh start holds nothing
        log.info("worker %s ready", self.config.worker_id)
        try:
            while not self.stop_now and not (self.stopping and self._idle()):
                if max_steps is not None and self.engine.stats.num_steps >= max_steps:
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
                    log.warning("redis: %s; retrying in %.1f s", e, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, self.config.max_backoff_s)
        finally:
            self.teardown()

    def _idle(self) -> bool:
        """Nothing started, held or waiting to be handed over."""
        return not (self.inflight or self._prefetched or self._held or self._handing)

    def teardown(self) -> None:
        self.liveness.stop()
        if self.spiller is not None:
            self.spiller.close()
        try:
            self.broker.unregister()
        except redis.RedisError as e:
            log.warning("could not unregister: %s", e)

    def _rejoin(self) -> None:
        """Redis lost this worker's registration and consumer groups (it restarted without
        persistence), or took the worker for dead: the entries it held are gone or another
        worker's, and their clients were told so. Stop them (their KV stays with their
        sessions), register again, and tell the kvstore what is held."""
        dropped = sorted(self.inflight)
        for rid in dropped:
            self.engine.abort(rid)
        self.inflight.clear()
        self._held.clear()
        self._prefetched.clear()
        self._handing.clear()
        self._outbox = Outbox()
        self._published_running = []
        self.liveness.lost.clear()
        self.broker.register(self.status(), self.config.lease_s)
        if self.stopping:
            self.broker.set_draining()
        self._outbox.kv.append(self._inventory())
        log.warning(
            "Redis no longer knew this worker (restarted, or took it for dead): registered "
            "again; %d request(s) in flight dropped", len(dropped)
        )  # fmt: skip

    def _pass(self) -> None:
        self._housekeeping()
        if self.stopping:
            self._drain_pass()
        # busy: admit what the last publish read; idle: wait (bounded) for new requests
        self._finish_restores()
        deliveries, self._prefetched = self._prefetched, []
        if not deliveries and not self.stopping and not self.engine.has_work:
            if self._restoring:  # nothing to step: wait a little for a restore instead
                futures = [r.future for r in self._restoring.values()]
                wait(futures, RESTORE_POLL_S, FIRST_COMPLETED)
                self._finish_restores()
            if not self.engine.has_work:  # (a restore may have admitted a request)
                pending = self._outbox.events or self._outbox.acks or self._restoring
                block = None if pending else self.config.idle_block_ms
                deliveries = self.broker.read(self._rooms(), block)
        for d in deliveries:
            self._start(d)
        self._resume_paused()
        if self.engine.has_work:
            self._step()
        elif self.stopping and not self._restoring:
            time.sleep(RESTORE_POLL_S)  # draining, nothing to step: do not spin
        self._flush()
        self.liveness.update(
            json.dumps(self.status()), [*(f.delivery for f in self.inflight.values()), *self._held]
        )

    def _capacity(self) -> int:
        """Free batch slots: running requests count, paused (preempted) ones do not."""
        active = len(self.inflight) - len(self.engine.paused) + len(self._held)
        return self.engine.config.max_running - active - len(self._prefetched)

    def _rooms(self) -> Rooms:
        """How many requests to take by class: paused requests get free slots back before
        new NORMAL or BATCH ones; INTERACTIVE ones may also take running BATCH requests'
        slots (they preempt them)."""
        if self.stopping:
            return (0, 0, 0)
        free = max(0, self._capacity())
        rest = max(0, free - len(self.engine.paused))
        return (free + len(self._preemptible()), rest, rest)

    def _preemptible(self) -> list[str]:
        """Running BATCH requests, most recently admitted first."""
        running = [
            f for rid, f in self.inflight.items()
            if f.request.priority == "batch" and rid not in self.engine.paused
        ]  # fmt: skip
        return [f.request.request_id for f in sorted(running, key=lambda f: -f.admitted_at)]

    def _preempt_for(self, request_id: str) -> None:
        """An INTERACTIVE request arrives at a full worker: pause a BATCH one (its KV stays
        in memory, its client sees a pause) so that it starts in the next step."""
        if self._capacity() > 0:
            return
        victims = self._preemptible()
        if victims and self.engine.pause(victims[0]):
            log.info("pausing %s (batch) for %s (interactive)", victims[0], request_id)

    def _resume_paused(self) -> None:
        for rid in list(self.engine.paused):  # oldest first
            if self._capacity() <= 0:
                break
            self.engine.resume(rid)
            log.info("resuming %s", rid)

    def _housekeeping(self) -> None:
        self._keep_pool_budget()
        now = time.monotonic()
        if now >= self._next_reclaim and not self.stopping:
            for d in self.broker.reclaim(max(0, self._capacity())):
                log.info("taking over %s from %s", d.entry_id, d.stream)
                self._start(d)
            self._next_reclaim = now + self.config.lease_s / 2

    def _keep_pool_budget(self) -> None:
        """While the kvstore runs it alone decides spills, and the pool only guards memory
        (its ceiling); without it the worker keeps its idle sessions within the budget."""
        pool, c = self.engine.sessions, self.config
        budget = c.pool_ceiling_bytes if self.liveness.kvstore_alive else c.warm_budget_bytes
        if pool.budget_bytes != budget:
            pool.budget_bytes = budget
            self.engine.evicted_sessions += pool.shrink()

    def _drain_pass(self) -> None:
        """From the first stop signal: no request is routed here any more; requests on the
        pinned stream not started yet go to another live worker, once their session's KV
        is on disk (if that is quick); the kvstore's orders are still carried out."""
        if not self._draining:
            self.broker.set_draining()
            self._draining = True
            log.info("draining: handing over what has not started")
        pending, self._prefetched = self._prefetched, []
        for d in pending + self.broker.read_pinned(64):
            if d.control is not None:
                self._start(d)
            else:
                self._hand_over(d)
        self._release_handovers()

    def _hand_over(self, d: Delivery) -> None:
        key = _cache_key(d)
        if key and key in self._handing:
            self._handing[key][0].append(d)
            return
        if key and self.spiller is not None:
            cache = self.engine.sessions.take(key)
            if cache is not None:
                self._evict(key, cache)  # the taker reads it back from disk
            if self.spiller.is_writing(key):
                self._handing[key] = ([d], time.monotonic() + HANDOVER_SPILL_S)
                return
        self._move(d)

    def _release_handovers(self) -> None:
        now = time.monotonic()
        for key, (waiting, deadline) in list(self._handing.items()):
            assert self.spiller is not None
            if self.spiller.is_writing(key) and now < deadline:
                continue
            del self._handing[key]
            for d in waiting:
                self._move(d)

    def _move(self, d: Delivery) -> None:
        taker = self.broker.hand_over(d)
        assert d.request is not None
        if taker:
            log.info("handed %s over to %s", d.request.request_id, taker)
        else:
            log.info("no other worker is live: serving %s before stopping", d.request.request_id)
            self._start(d)

    def _start(self, d: Delivery) -> None:
        out = self._outbox
        if d.control is not None:
            self._control(d.control.op, d.control.args)
            out.acks.append(d)
            return
        req = d.request
        assert req is not None
        if req.request_id in self.inflight:
            return  # our own entry, claimed back: it is already running
        if time.time() > req.deadline_at:
            out.events.append(
                (req.request_id, error_event("DEADLINE_EXCEEDED", "deadline passed in the queue"))
            )
            out.acks.append(d)
            return
        cache_key = keys.cache_key(req.tenant, req.session_id) if req.session_id else None
        if cache_key and self._restore_in_background(cache_key):
            self._held.append(d)  # admitted once its KV is back in memory
            return
        self._admit(d, cache_key)

    def _restore_in_background(self, key: str) -> bool:
        """True while the session's KV is read back from disk on the I/O thread."""
        if key in self._restoring:
            return True
        if key in self.engine.sessions or self.spiller is None or not self.spiller.has_file(key):
            return False
        self._restoring[key] = Restore(self.spiller.restore_async(key), time.monotonic())
        return True

    def _finish_restores(self, only: str | None = None) -> None:
        """Adopt the sessions read back (waiting for `only`'s read if given) and admit the
        requests held for them."""
        for key, restore in list(self._restoring.items()):
            if (only is not None and key != only) or (only is None and not restore.future.done()):
                continue
            del self._restoring[key]
            try:
                cache, found = restore.future.result()
            except OSError as e:  # unreadable for another reason: recompute
                log.warning("could not read back %s (%s); recomputing", key, e)
                cache, found = None, "none"
            if found == "rejected":
                self._outbox.kv.append(self._event(ev.GONE, key, None, detail=ev.REJECTED))
            if cache is not None:
                took = time.monotonic() - restore.started
                log.info("read %s back from disk in %.0f ms (%d tokens)", key, took * 1e3,
                         cache.offset)  # fmt: skip
            held = [d for d in self._held if _cache_key(d) == key]
            self._held = [d for d in self._held if _cache_key(d) != key]
            if not held and cache is not None:  # its requests were dropped meanwhile
                self.engine.adopt_session(key, cache)
            for i, d in enumerate(held):  # the first one runs on the KV read back
                self._admit(d, key, found if i == 0 else "pool", cache if i == 0 else None)

    def _admit(
        self,
        d: Delivery,
        cache_key: str | None,
        kv_from: str | None = None,
        restored: KVCache | None = None,
    ) -> None:
        """Start the request in the engine, on `restored` (its session's KV read back) if
        given, else on what the pool or a write in flight holds."""
        out = self._outbox
        req = d.request
        assert req is not None
        if req.priority == "interactive":
            self._preempt_for(req.request_id)
        if kv_from is None:
            kv_from, restored = self._bring_back(cache_key) if cache_key else ("none", None)
        try:
            sampling = SamplingParams(**{**req.sampling, "stop": tuple(req.sampling["stop"])})
            request = Request(req.request_id, req.prompt_ids, sampling, cache_key)
            seq = self.engine.add(request, restored)
        except (WarmfleetError, TypeError) as e:
            code = "RESOURCE_EXHAUSTED" if isinstance(e, PromptTooLongError) else "INVALID_ARGUMENT"
            out.events.append((req.request_id, error_event(code, str(e))))
            out.acks.append(d)
            return
        self.inflight[req.request_id] = InFlight(
            d, req, time.time(), cache_key=cache_key, kv_from=kv_from
        )
        if cache_key:
            out.kv.append(self._event(ev.HOT, cache_key, seq.cache, detail=kv_from))

    def _bring_back(self, key: str) -> tuple[str, KVCache | None]:
        """Where this worker finds the session's KV: ("pool", None) when it is in the pool,
        else the KV taken back from a write in flight or from its file, and where it was."""
        if key in self.engine.sessions:
            return "pool", None
        if self.spiller is None:
            return "none", None
        cache, found = self.spiller.take_back(key)
        if found == "rejected":
            self._outbox.kv.append(self._event(ev.GONE, key, None, detail=ev.REJECTED))
        return found, cache

    def _control(self, op: str, args: dict[str, str]) -> None:
        key = args.get("key", "")
        if key in self._restoring:  # let the read finish first: one copy at a time
            self._finish_restores(only=key)
        if op == "spill_session":
            self._spill(key)
        elif op == "drop_session":
            self._drop(key, args.get("r", ""))
        elif op == "fork_session":
            self._fork(key, args["new_key"], args.get("r", ""))
        elif op == "forget_session":  # another worker holds a newer copy: drop ours only
            self._forget(key)
        elif op == "report":
            self._outbox.kv.append(self._inventory())
        else:
            log.warning("unknown control order %r ignored", op)

    def _spill(self, key: str) -> None:
        """The kvstore's order: write an idle session to disk (a running one stays)."""
        cache = self.engine.sessions.take(key)
        if cache is not None:
            self._evict(key, cache)
        elif not (
            any(f.cache_key == key for f in self.inflight.values())
            or (self.spiller is not None and self.spiller.is_writing(key))
        ):  # not here at all (its write, if any, was reported or will be)
            self._outbox.kv.append(self._event(ev.GONE, key, None, detail=ev.DROPPED))

    def _evict(self, key: str, cache: KVCache) -> None:
        self._last_used.pop(key, None)
        if self.spiller is not None:
            self.spiller.spill(key, cache)  # reported when the write is done
        else:
            self._outbox.kv.append(self._event(ev.GONE, key, None, detail=ev.DROPPED))

    def _drop(self, key: str, reply_to: str) -> None:
        """DeleteSession: forget the KV here and on disk; the event answers the command."""
        self._forget(key)
        if self.spiller is not None:
            self.spiller.drop(key)
        gone = self._event(ev.GONE, key, None, detail=ev.DROPPED)
        self._outbox.kv.append(replace(gone, reply_to=reply_to))

    def _forget(self, key: str) -> None:
        """Drop the session's KV from memory (a running request keeps using it and drops it
        when it ends)."""
        self.engine.sessions.take(key)
        self._last_used.pop(key, None)
        if any(f.cache_key == key for f in self.inflight.values()):
            self._drop_at_finish.add(key)

    def _fork(self, key: str, new_key: str, reply_to: str) -> None:
        """Copy a session's KV (from the pool, or back from disk) under a new key; the new
        session's event answers the command."""
        found, back = self._bring_back(key)
        if back is not None:
            self.engine.adopt_session(key, back)
        if found == "disk":
            self._outbox.kv.append(self._event(ev.WARM, key, self.engine.sessions.peek(key)))
        cache = self.engine.sessions.peek(key)
        if cache is None:  # running or gone: the new session recomputes what it needs
            event = self._event(ev.GONE, new_key, None, detail=ev.DROPPED)
        else:
            m = self.engine.model
            copy = KVCache.from_state(m.config, m.xp, *cache.state())
            self.engine.adopt_session(new_key, copy)
            self._last_used[new_key] = time.time()
            event = self._event(ev.WARM, new_key, copy)
        self._outbox.kv.append(replace(event, reply_to=reply_to))

    def _inventory(self) -> KVEvent:
        now = time.time()
        pooled = self.engine.sessions.items()
        self._last_used = {k: self._last_used.get(k, now) for k, _ in pooled}
        held = [Held(k, "warm", c.offset, c.nbytes, self._last_used[k]) for k, c in pooled]
        held += [Held(f.cache_key, "hot", 0, 0, now) for f in self.inflight.values() if f.cache_key]
        return inventory_event(self.config.worker_id, held, now)

    def _step(self) -> None:
        for out in self.engine.step():
            f = self.inflight.get(out.request_id)
            if f is None:
                continue
            if out.token_ids or out.text:
                event = chunk_event(f.next_index, out.token_ids, out.text)
                self._outbox.events.append((out.request_id, event))
                f.next_index += len(out.token_ids)
            if out.completion is not None:
                self._finish(f, out.completion)

    def _finish(self, f: InFlight, completion: Completion) -> None:
        req = f.request
        del self.inflight[req.request_id]
        self._outbox.events.append((req.request_id, done_event(self._completion(f, completion))))
        self._outbox.acks.append(f.delivery)
        key = f.cache_key
        if key and key in self._drop_at_finish:
            self._drop_at_finish.discard(key)
            self.engine.sessions.take(key)
        elif key:
            self._last_used[key] = time.time()
            self._outbox.kv.append(self._event(ev.WARM, key, self.engine.sessions.peek(key)))

    def _flush(self) -> None:
        if self.engine.evicted_sessions:
            pool = self.engine.sessions
            why = (
                "past its ceiling though the kvstore runs (its spill orders fell behind)"
                if self.liveness.kvstore_alive
                else "over the warm budget and no kvstore is running to order spills"
            )
            log.warning(
                "evicting %d session(s) by the worker's own LRU: the pool (%d bytes with "
                "them) was %s; limit %d bytes", len(self.engine.evicted_sessions),
                pool.nbytes + sum(c.nbytes for _, c in self.engine.evicted_sessions), why,
                pool.budget_bytes,
            )  # fmt: skip
        for key, cache in self.engine.evicted_sessions:
            self._evict(key, cache)
        self.engine.evicted_sessions.clear()
        if self.spiller is not None:
            for done in self.spiller.completed():
                if done.file is None:
                    event = self._event(ev.GONE, done.key, None, detail=ev.WRITE_FAILED)
                else:
                    file = done.file
                    event = KVEvent(
                        ev.DISK, self.config.worker_id, done.key, file.num_tokens, file.size,
                        time.time(), str(file.mtime_ns),
                    )  # fmt: skip
                self._outbox.kv.append(event)
        out, self._outbox = self._outbox, Outbox()
        status = None
        if sorted(self.inflight) != self._published_running:  # keep the status exact
            status = (self.status(), self.config.lease_s)
            self._published_running = sorted(self.inflight)
        rooms = self._rooms() if self.engine.has_work else (0, 0, 0)
        cancelled, prefetched = self.broker.publish(
            out.events, out.acks, out.kv, list(self.inflight), status, rooms
        )
        self._prefetched += prefetched
        for rid in cancelled:
            stopped = self.engine.abort(rid)
            f = self.inflight.get(rid)
            if f is not None and stopped is not None and stopped.completion is not None:
                self._finish(f, stopped.completion)
        if cancelled:
            self._flush()

    def _event(self, kind: str, key: str, cache: KVCache | None, *, detail: str = "") -> KVEvent:
        """An event about the session `key` whose KV on this worker is `cache`."""
        num_tokens, nbytes = (cache.offset, cache.nbytes) if cache is not None else (0, 0)
        return KVEvent(kind, self.config.worker_id, key, num_tokens, nbytes, time.time(), detail)

    def _completion(self, f: InFlight, c: Completion) -> dict[str, Any]:
        waited = f.admitted_at - f.request.accepted_at
        return {
            "request_id": f.request.request_id,
            "finish_reason": str(c.finish_reason),
            "usage": {
                "prompt_tokens": c.prompt_tokens,
                "cached_tokens": c.cached_tokens,
                "completion_tokens": c.completion_tokens,
            },
            "timings": {
                "queue_wait_s": waited + c.queue_s,
                "time_to_first_token_s": waited + c.ttft_s,
                "decode_tokens_per_s": c.decode_tok_s,
                "total_s": time.time() - f.request.accepted_at,
            },
            "worker_id": self.config.worker_id,
            "kv_source": (
                "cold" if c.cached_tokens == 0 else "disk" if f.kv_from == "disk" else "warm"
            ),
            "seed": c.seed,
        }


def _cache_key(d: Delivery) -> str | None:
    req = d.request
    return keys.cache_key(req.tenant, req.session_id) if req and req.session_id else None
