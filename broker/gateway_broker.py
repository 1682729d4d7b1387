"""The gateway's side of the Redis protocol, on an event loop: route and enqueue, sessions.
A job's results come through broker/results_hub.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import redis.asyncio as aioredis

from broker import codec, fair_queue, keys, kv_commands, placement, prompt_heads
from broker.fair_queue import Admission
from broker.messages import (
    CommandAnswer,
    CommandOp,
    Completion,
    ControlOrder,
    Job,
    JobError,
    OrderOp,
    TokenChunk,
)
from broker.prompt_heads import PrefixHolder
from broker.records import SessionRecord
from common.enums import Tier

CANCEL_TTL_S = 600
Result = TokenChunk | Completion | JobError


@dataclass(frozen=True, slots=True)
class Bounds:
    """What the fair queues hold a tenant to (from its key) and all tenants to."""

    weight: int
    max_queued: int  # the tenant's queued requests
    max_total: int  # everyone's queued requests
    max_running: int  # the tenant's running requests


class GatewayBroker:
    def __init__(self, r: aioredis.Redis) -> None:
        self.r = r
        self._enqueue = r.register_script(fair_queue.ENQUEUE)
        self._unqueue = r.register_script(fair_queue.UNQUEUE)
        self._live = r.register_script(placement.LIVE_WORKERS)
        self._remember_head = r.register_script(prompt_heads.REMEMBER)
        self._forget_head = r.register_script(prompt_heads.FORGET)
        self._find = r.register_script(prompt_heads.FIND)

    async def enqueue(self, job: Job, bounds: Bounds, holder: str = "") -> Admission:
        """Route and enqueue in one step (see broker/fair_queue.py): onto the pinned stream
        of the live worker that holds the session, else of the one holding session
        `holder` (the longest prefix of its prompt) while it has room, else into the
        tenant's fair queue of its class (the least loaded live worker takes it from
        there), unless no worker is alive or the tenant's queue or all queues are full."""
        sid, tenant, rid = job.session_id, job.tenant, job.request_id
        cost = len(job.prompt_ids) + job.sampling.max_tokens
        ttl_s = max(1, int(job.deadline_at - time.time()) + 1)
        kind, detail = await self._enqueue(
            keys=[
                keys.session_key(tenant, sid) if sid else keys.NO_KEY,
                keys.tenant_queued(tenant),
                keys.QUEUED,
                keys.queued_request(rid),
                keys.fair_queue(job.priority, tenant),
                keys.fair_active(job.priority),
                keys.fair_state(job.priority),
                keys.WAKE,
                keys.RUNNING,
                keys.affinity_key(tenant, sid) if sid else keys.NO_KEY,
                keys.STATS,
                keys.session_key(tenant, holder) if holder else keys.NO_KEY,
            ],
            args=[
                codec.encode(job), keys.heartbeat_key(""), keys.pinned_stream(""), keys.WORKERS,
                rid, tenant, cost, bounds.weight, bounds.max_queued, bounds.max_total, ttl_s,
                bounds.max_running, keys.draining_key(""), placement.PREFIX_SLACK,
            ],
        )  # fmt: skip
        if kind == "pinned":
            return Admission(kind, worker_id=detail)
        return Admission(kind, queued=int(detail or 0))

    async def unqueue(self, job: Job) -> bool:
        """Take a job out of its fair queue; False if a worker has it already."""
        removed = await self._unqueue(
            keys=[
                keys.fair_queue(job.priority, job.tenant),
                keys.queued_request(job.request_id),
                keys.tenant_queued(job.tenant),
                keys.QUEUED,
                keys.fair_active(job.priority),
            ],
            args=[job.request_id, job.tenant],
        )
        return bool(removed)

    async def cancel(self, request_id: str) -> None:
        await self.r.set(keys.cancel_key(request_id), "1", ex=CANCEL_TTL_S)

    async def live_workers(self) -> list[str]:
        """The workers that take requests now: registered, heartbeat fresh, not draining."""
        return sorted(await self._live(args=placement.live_workers_args()))

    async def find_by_prompt(
        self, tenant: str, hashes: list[bytes], marks: list[bytes]
    ) -> tuple[list[tuple[int, str, str]], PrefixHolder]:
        """Every session head among a prompt's whole blocks (`hashes`, the chain hash after
        each, in order), as (whole blocks, session, the head's "length:hex"); and the
        session that last sent the latest of its prefix `marks` and is in a worker's memory
        (broker/prompt_heads.py)."""
        names = [prompt_heads.head_key(tenant, h) for h in hashes]
        names += [prompt_heads.mark_key(tenant, m) for m in marks]
        if not names:
            return [], PrefixHolder()
        records = keys.session_key(tenant, "")
        holder, flat, worker, mark = await self._find(keys=names, args=[len(hashes), records])
        heads = [(int(flat[i]), str(flat[i + 1]), str(flat[i + 2])) for i in range(0, len(flat), 3)]
        return heads, PrefixHolder(str(holder), str(worker), int(mark))

    async def remember_head(self, tenant: str, session_id: str, blocks: bytes, rest: str) -> None:
        """Name the session by its head from now on, in place of its last one: the hash of
        its whole `blocks` and the `rest` ("length:hex")."""
        names = [
            prompt_heads.head_key(tenant, blocks),
            prompt_heads.head_of_key(tenant, session_id),
        ]
        args = [blocks.hex(), session_id, prompt_heads.head_prefix(tenant), rest]
        await self._remember_head(keys=names, args=[*args, prompt_heads.HEAD_TTL_S])

    async def forget_head(self, tenant: str, session_id: str) -> None:
        await self._forget_head(
            keys=[prompt_heads.head_of_key(tenant, session_id)],
            args=[session_id, prompt_heads.head_prefix(tenant)],
        )

    async def get_session(self, tenant: str, session_id: str) -> SessionRecord | None:
        fields = await self.r.hgetall(keys.session_key(tenant, session_id))
        return await self._alive(SessionRecord.from_fields(fields)) if fields else None

    async def list_sessions(
        self, tenant: str, offset: int, limit: int
    ) -> list[tuple[str, SessionRecord]]:
        """(session id, record), most recently used first."""
        ids = await self.r.zrevrange(keys.session_index(tenant), offset, offset + limit - 1)
        pipe = self.r.pipeline(transaction=False)
        for sid in ids:
            pipe.hgetall(keys.session_key(tenant, sid))
        found = await pipe.execute()
        return [
            (sid, await self._alive(SessionRecord.from_fields(f)))
            for sid, f in zip(ids, found, strict=True)
            if f
        ]

    async def delete_session(self, tenant: str, session_id: str) -> bool:
        """Forget the session everywhere (index, worker memory, spill file); False if there
        was no such session. The kvstore carries it out; raises ServiceError when it does
        not answer in time."""
        key = keys.cache_key(tenant, session_id)
        await self.forget_head(tenant, session_id)  # no prompt finds it any more
        answer = await kv_commands.call_async(self.r, CommandOp.DELETE, key)
        return answer.status != answer.status.NOT_FOUND

    async def fork_session(
        self, tenant: str, session_id: str, new_session_id: str
    ) -> CommandAnswer:
        """A new session starting from a copy of another's KV (NOT_FOUND: no such source;
        EXISTS: the new id is taken). Raises ServiceError as delete does."""
        source, new = keys.cache_key(tenant, session_id), keys.cache_key(tenant, new_session_id)
        return await kv_commands.call_async(self.r, CommandOp.FORK, source, new)

    async def evict_session(self, tenant: str, session_id: str) -> CommandAnswer:
        """Ask the kvstore to write an idle session to disk (its answer says the tier the
        session is in: SPILLING when ordered; NOT_FOUND). Raises ServiceError as delete
        does."""
        return await kv_commands.call_async(
            self.r, CommandOp.EVICT, keys.cache_key(tenant, session_id)
        )

    async def drain_worker(self, worker_id: str) -> bool:
        """Route nothing more to a live worker and have it finish its running requests and
        exit; False if no such worker is alive."""
        if not await self.r.exists(keys.heartbeat_key(worker_id)):
            return False
        pipe = self.r.pipeline(transaction=False)
        pipe.set(keys.draining_key(worker_id), "1")
        pipe.xadd(keys.pinned_stream(worker_id), codec.fields(ControlOrder(OrderOp.DRAIN)))
        await pipe.execute()
        return True

    async def _alive(self, record: SessionRecord) -> SessionRecord:
        """A record whose worker has no heartbeat is gone (its index entry lags)."""
        if record.worker and not await self.r.exists(keys.heartbeat_key(record.worker)):
            return replace(record, worker="", tier=Tier.GONE)
        return record
