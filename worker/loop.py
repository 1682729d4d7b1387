"""The worker loop: admit requests between engine steps, step, publish, keep leases."""

from __future__ import annotations

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
from broker.worker_broker import Delivery, WorkerBroker
from engine.engine import Engine
from engine.kv_cache import KVCache
from engine.sampling import SamplingParams
from engine.sequence import Completion, Request
from warmfleet.errors import InvalidRequestError, PromptTooLongError, WarmfleetError
from worker.spiller import Spiller

log = logging.getLogger("warmfleet.worker")
RESTORE_POLL_S = 0.02  # an idle worker's wait for a restore before it looks at Redis again


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    worker_id: str
    lease_s: float = 5.0  # an entry whose worker stops renewing is taken over after this
    idle_block_ms: int = 500  # longest wait for new requests while idle
    heartbeat_interval_s: float = 0.5
    max_backoff_s: float = 5.0  # cap of the reconnect back-off
    # idle sessions' KV that the kvstore keeps in this worker's memory; the engine's own
    # pool evicts by itself only past twice this (a kvstore that is down gives no orders)
    warm_budget_bytes: int = 2 << 30

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
        self._next_beat = self._next_renew = self._next_reclaim = 0.0
        self._outbox = Outbox()
        self._published_running: list[str] = []
        self._prefetched: list[Delivery] = []  # read with the last publish, not yet started
        self._drop_at_finish: set[str] = set()  # sessions deleted while a request used them
        self._last_used: dict[str, float] = {}  # when each pooled session's last request ended
        # sessions read back from disk on the I/O thread, and the requests waiting for them
        self._restoring: dict[str, Restore] = {}
        self._held: list[Delivery] = []

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
            "model_fingerprint": self.engine.model.fingerprint,
            "spill": asdict(self.spiller.stats) if self.spiller else None,
        }

    def run(self, max_steps: int | None = None) -> None:
        """Serve until stopped (or until `max_steps` engine steps, for tests)."""
        backoff = 0.1
        self.broker.register(self.status(), self.config.lease_s)
        self._outbox.kv.append(self._inventory())  # a fresh start holds nothing
        log.info("worker %s ready", self.config.worker_id)
        try:
            while not self.stop_now and not (
                self.stopping and not self.inflight and not self._prefetched and not self._held
            ):
                if max_steps is not None and self.engine.stats.num_steps >= max_steps:
                    break
                try:
                    self._pass()
                    backoff = 0.1
                except redis.RedisError as e:
                    log.warning("redis: %s; retrying in %.1f s", e, backoff)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, self.config.max_backoff_s)
        finally:
            self.teardown()

    def teardown(self) -> None:
        if self.spiller is not None:
            self.spiller.close()
        try:
            self.broker.unregister()
        except redis.RedisError as e:
            log.warning("could not unregister: %s", e)

    def _pass(self) -> None:
        self._housekeeping()
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
        self._flush()

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
        now = time.monotonic()
        if now >= self._next_beat:
            self.broker.heartbeat(self.status(), self.config.lease_s)
            self._next_beat = now + self.config.heartbeat_interval_s
        if now >= self._next_renew and (self.inflight or self._held):
            self.broker.renew([*(f.delivery for f in self.inflight.values()), *self._held])
            self._next_renew = now + self.config.lease_s / 4
        if now >= self._next_reclaim and not self.stopping:
            for d in self.broker.reclaim(max(0, self._capacity())):
                log.info("taking over %s from %s", d.entry_id, d.stream)
                self._start(d)
            self._next_reclaim = now + self.config.lease_s / 2

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
                self.engine.adopt_session(key, cache)
                took = time.monotonic() - restore.started
                log.info("read %s back from disk in %.0f ms (%d tokens)", key, took * 1e3,
                         cache.offset)  # fmt: skip
            held = [d for d in self._held if _cache_key(d) == key]
            self._held = [d for d in self._held if _cache_key(d) != key]
            for i, d in enumerate(held):
                self._admit(d, key, found if i == 0 else "pool")

    def _admit(self, d: Delivery, cache_key: str | None, kv_from: str | None = None) -> None:
        out = self._outbox
        req = d.request
        assert req is not None
        if req.priority == "interactive":
            self._preempt_for(req.request_id)
        if kv_from is None:
            kv_from = self._bring_back(cache_key) if cache_key else "none"
        try:
            sampling = SamplingParams(**{**req.sampling, "stop": tuple(req.sampling["stop"])})
            seq = self.engine.add(Request(req.request_id, req.prompt_ids, sampling, cache_key))
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

    def _bring_back(self, key: str) -> str:
        """Put the session's KV in the pool if this worker can find it: where it was."""
        if key in self.engine.sessions:
            return "pool"
        if self.spiller is None:
            return "none"
        cache, found = self.spiller.take_back(key)
        if found == "rejected":
            self._outbox.kv.append(self._event(ev.GONE, key, None, detail=ev.REJECTED))
        if cache is not None:
            self.engine.adopt_session(key, cache)
        return found

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
        if self._bring_back(key) == "disk":
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
            log.warning(
                "pool past twice its warm budget: evicting %d session(s) without an order "
                "(is the kvstore running?)",
                len(self.engine.evicted_sessions),
            )
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
            self._next_beat = time.monotonic() + self.config.heartbeat_interval_s
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
