"""The worker loop: admit requests between engine steps, step, publish, keep leases."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from broker import keys
from broker.wire import Fields, WireRequest, chunk_event, done_event, error_event
from broker.worker_broker import Delivery, WorkerBroker
from engine.engine import Engine
from engine.kv_cache import KVCache
from engine.sampling import SamplingParams
from engine.sequence import Completion, Request
from warmfleet.errors import InvalidRequestError, PromptTooLongError, WarmfleetError
from worker.spiller import Spiller

log = logging.getLogger("warmfleet.worker")
SessionUpdate = tuple[str, str, dict[str, str] | None]


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    worker_id: str
    lease_s: float = 5.0  # an entry whose worker stops renewing is taken over after this
    idle_block_ms: int = 500  # longest wait for new requests while idle
    heartbeat_interval_s: float = 0.5
    max_backoff_s: float = 5.0  # cap of the reconnect back-off

    def __post_init__(self) -> None:
        if (
            not self.worker_id
            or any(c in self.worker_id for c in ":/ ")
            or len(self.worker_id) > 64
        ):
            raise InvalidRequestError("worker_id", "1-64 characters, no ':', '/' or spaces")
        if self.lease_s < 1.0:
            raise InvalidRequestError("lease_s", f"must be >= 1 s, got {self.lease_s}")


@dataclass(slots=True)
class InFlight:
    delivery: Delivery
    request: WireRequest
    admitted_at: float  # unix seconds
    next_index: int = 0  # index of the next generated token to publish
    cache_key: str | None = None
    from_disk: bool = False  # the session's KV was restored from its spill file


@dataclass(slots=True)
class Outbox:
    """Everything one pass publishes, sent in one round trip."""

    events: list[tuple[str, Fields]] = field(default_factory=list)
    acks: list[Delivery] = field(default_factory=list)
    sessions: list[SessionUpdate] = field(default_factory=list)


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

    def status(self) -> dict[str, Any]:
        return {
            "worker_id": self.config.worker_id,
            "pid": os.getpid(),
            "running": sorted(self.inflight),
            "num_running": len(self.inflight),
            "num_sessions": len(self.engine.sessions),
            "pool_bytes": self.engine.sessions.nbytes,
            "steps": self.engine.stats.num_steps,
            "stopping": self.stopping,
            "model_fingerprint": self.engine.model.fingerprint,
            "spill": asdict(self.spiller.stats) if self.spiller else None,
        }

    def run(self, max_steps: int | None = None) -> None:
        """Serve until stopped (or until `max_steps` engine steps, for tests)."""
        backoff = 0.1
        self.broker.register(self.status(), self.config.lease_s)
        log.info("worker %s ready", self.config.worker_id)
        try:
            while not self.stop_now and not (
                self.stopping and not self.inflight and not self._prefetched
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
        deliveries, self._prefetched = self._prefetched, []
        if not deliveries and not self.stopping and not self.engine.has_work:
            pending = self._outbox.events or self._outbox.acks
            block = None if pending else self.config.idle_block_ms
            deliveries = self.broker.read(self._capacity(), block)
        for d in deliveries:
            self._start(d)
        if self.engine.has_work:
            self._step()
        self._flush()

    def _capacity(self) -> int:
        return self.engine.config.max_running - len(self.inflight) - len(self._prefetched)

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now >= self._next_beat:
            self.broker.heartbeat(self.status(), self.config.lease_s)
            self._next_beat = now + self.config.heartbeat_interval_s
        if now >= self._next_renew and self.inflight:
            self.broker.renew(f.delivery for f in self.inflight.values())
            self._next_renew = now + self.config.lease_s / 4
        if now >= self._next_reclaim and not self.stopping:
            for d in self.broker.reclaim(self._capacity()):
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
        from_disk = False
        if cache_key and self.spiller and cache_key not in self.engine.sessions:
            cache, from_disk = self.spiller.take_back(cache_key)
            if cache is not None:
                self.engine.adopt_session(cache_key, cache)
        try:
            sampling = SamplingParams(**{**req.sampling, "stop": tuple(req.sampling["stop"])})
            seq = self.engine.add(Request(req.request_id, req.prompt_ids, sampling, cache_key))
        except (WarmfleetError, TypeError) as e:
            code = "RESOURCE_EXHAUSTED" if isinstance(e, PromptTooLongError) else "INVALID_ARGUMENT"
            out.events.append((req.request_id, error_event(code, str(e))))
            out.acks.append(d)
            return
        self.inflight[req.request_id] = InFlight(
            d, req, time.time(), cache_key=cache_key, from_disk=from_disk
        )
        if req.session_id:
            out.sessions.append((req.tenant, req.session_id, self._record("hot", seq.cache)))

    def _control(self, op: str, args: dict[str, str]) -> None:
        tenant = args["tenant"]
        key = keys.cache_key(tenant, args["session_id"])
        if op == "drop_session":
            self.engine.sessions.take(key)
            if self.spiller is not None:
                self.spiller.drop(key)
        elif op == "fork_session":
            self._fork(tenant, key, args["new_session_id"])
        else:
            log.warning("unknown control order %r ignored", op)

    def _fork(self, tenant: str, key: str, new_session_id: str) -> None:
        """Copy a session's KV (from the pool, or back from disk) under a new session id."""
        cache = self.engine.sessions.peek(key)
        if cache is None and self.spiller is not None:
            cache, _ = self.spiller.take_back(key)
            if cache is not None:
                self.engine.adopt_session(key, cache)
                self._outbox.sessions.append((*_split(key), self._record("warm", cache)))
        new_key = keys.cache_key(tenant, new_session_id)
        if cache is None:  # running or gone: the new session recomputes what it needs
            self._outbox.sessions.append((tenant, new_session_id, {"worker": "", "tier": "gone"}))
            return
        m = self.engine.model
        copy = KVCache.from_state(m.config, m.xp, *cache.state())
        self.engine.adopt_session(new_key, copy)
        self._outbox.sessions.append((tenant, new_session_id, self._record("warm", copy)))

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
        if req.session_id and f.cache_key:
            held = self.engine.sessions.peek(f.cache_key)
            self._outbox.sessions.append((req.tenant, req.session_id, self._record("warm", held)))

    def _flush(self) -> None:
        for key, cache in self.engine.evicted_sessions:
            if self.spiller is not None:
                self.spiller.spill(key, cache)  # its record changes when the write is done
            else:
                self._outbox.sessions.append((*_split(key), {"worker": "", "tier": "gone"}))
        self.engine.evicted_sessions.clear()
        if self.spiller is not None:
            for key, record in self.spiller.completed():
                self._outbox.sessions.append((*_split(key), record))
        out, self._outbox = self._outbox, Outbox()
        status = None
        if sorted(self.inflight) != self._published_running:  # keep the status exact
            status = (self.status(), self.config.lease_s)
            self._published_running = sorted(self.inflight)
            self._next_beat = time.monotonic() + self.config.heartbeat_interval_s
        read = self._capacity() if self.engine.has_work and not self.stopping else 0
        cancelled, prefetched = self.broker.publish(
            out.events, out.acks, out.sessions, list(self.inflight), status, read
        )
        self._prefetched += prefetched
        for rid in cancelled:
            stopped = self.engine.abort(rid)
            f = self.inflight.get(rid)
            if f is not None and stopped is not None and stopped.completion is not None:
                self._finish(f, stopped.completion)
        if cancelled:
            self._flush()

    def _record(self, tier: str, cache: KVCache | None) -> dict[str, str]:
        """The session record for a session whose KV is `cache` on this worker."""
        num_tokens, nbytes = (cache.offset, cache.nbytes) if cache is not None else (0, 0)
        return {
            "worker": self.config.worker_id,
            "tier": tier,
            "num_tokens": str(num_tokens),
            "kv_bytes": str(nbytes),
            "last_used": f"{time.time():.3f}",
        }

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
            "kv_source": "cold" if c.cached_tokens == 0 else "disk" if f.from_disk else "warm",
            "seed": c.seed,
        }


def _split(cache_key: str) -> tuple[str, str]:
    tenant, session_id = cache_key.split("/", 1)
    return tenant, session_id
