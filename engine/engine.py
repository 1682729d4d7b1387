"""The batch-first engine: add requests, step, abort. Each step is schedule, run, postprocess."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from common.enums import FinishReason
from common.errors import InvalidRequestError
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine_stats import EngineStats
from engine.kv.blocks import PoolExhaustedError, common_prefix_len
from engine.kv.kv_pool import PagedKV, detach
from engine.kv.session_pool import SessionPool
from engine.kv_files.spill_file import SpilledKV
from engine.model import Model
from engine.runner import ModelRunner
from engine.sampling import make_rng, sample
from engine.scheduler import ScheduledBatch, Scheduler
from engine.sequence import Completion, Request, Sequence, SequenceStatus
from engine.step_cost import StepCost
from engine.text.detokenizer import StreamDecoder
from engine.text.text_stream import TextStream

T = TypeVar("T")
log = logging.getLogger("warmfleet.engine")


@dataclass(slots=True)
class StepOutput:
    """What one step produced for one request: at most one new token, its text, and the
    completion summary when the request ended."""

    request_id: str
    token_ids: list[int]
    text: str
    completion: Completion | None = None

    @property
    def finished(self) -> bool:
        return self.completion is not None


class Engine:
    def __init__(self, model: Model, config: EngineConfig | None = None) -> None:
        self.model = model
        self.config = config or EngineConfig()
        self.scheduler = Scheduler(self.config)
        c = model.config
        self.pool = model.new_pool(self.config.pool_bytes(model.bytes_per_token, c.context_length))
        self.runner = ModelRunner(model, self.pool)
        sizes = self.pool.group_block_bytes  # a block's bytes in each of the pool's groups
        self.sessions: SessionPool[PagedKV] = SessionPool(
            self.config.session_budget_bytes, PagedKV.held, lambda part: sizes[part[0]]
        )
        self.sequences: dict[str, Sequence] = {}
        self.paused: dict[str, Sequence] = {}  # preempted: active but not stepped
        self.stats = EngineStats()
        # sessions pushed out of the pool (its budget, or room for running sequences),
        # copied out of it: the owner spills or forgets them
        self.evicted_sessions: list[tuple[str, SpilledKV]] = []

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add(self, request: Request, restored: PagedKV | None = None) -> Sequence:
        """Queue a request; raises InvalidRequestError / PromptTooLongError, changing nothing.

        `restored`: the session's KV brought back from elsewhere (a spill file, see
        load_kv), used by this request instead of the pool's entry; it never sits in the
        session pool, so nothing can evict it before the request runs."""
        self._check(request)
        cache, num_cached = self._attach_cache(request, restored)
        rng, seed = make_rng(request.sampling.seed)
        text = TextStream(StreamDecoder(self.model.tokenizer), request.sampling.stop)
        if request.generated:  # where the earlier run left its sampler and its text
            if not request.sampling.greedy:
                rng.random(len(request.generated))  # sample() draws one number a token
            for token in request.generated:
                text.push(token)
        seq = Sequence(request, cache, num_cached, rng, seed, text)
        self.sequences[request.request_id] = seq
        self.scheduler.add(seq)
        return seq

    def step(self) -> list[StepOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        batch, ended = self._make_room(batch)
        if not batch:
            return ended
        prefills = [seq.prefilling for seq, _ in batch]
        prefill = sum(n for (_, n), p in zip(batch, prefills, strict=True) if p)
        t0 = time.perf_counter()
        try:
            logits, due = self.runner.run(batch)
        except MemoryError as e:
            # nothing of the step was kept: retried in smaller steps, down to one row
            rows = sum(n for _, n in batch)
            if rows <= 1:
                raise
            self.scheduler.limit_rows(rows // 2)
            log.warning("a step of %d rows ran out of memory (%s): at most %d rows a step "
                        "for a while", rows, e, rows // 2)  # fmt: skip
            return ended
        self.scheduler.step_ran()
        took = time.perf_counter() - t0
        self.scheduler.cost.observe(prefill, took)
        self.stats.count(batch, prefills, len(due), took)
        return ended + [self._postprocess(seq, row) for seq, row in zip(due, logits, strict=True)]

    def _make_room(self, batch: ScheduledBatch) -> tuple[ScheduledBatch, list[StepOutput]]:
        """Make each scheduled sequence's blocks its own for the positions it writes
        (with_room); a sequence that still finds no room ends (LENGTH), with a warning."""
        kept: ScheduledBatch = []
        ended: list[StepOutput] = []
        for seq, n in batch:
            if self.with_room(functools.partial(_room_to_write, seq, n)):
                kept.append((seq, n))
                continue
            blocks = self.pool.alloc.num_blocks
            log.warning("KV pool full (%d blocks): ending %s", blocks, seq.request_id)
            ended.append(self._finish(seq, FinishReason.LENGTH, ""))
        return kept, ended

    def with_room(self, take: Callable[[], T]) -> T | None:
        """take() (something that takes blocks of the pool and gives them back if it
        raises PoolExhaustedError), evicting idle sessions, least recently used first,
        while the pool is full; None when it stays full with none left."""
        while True:
            try:
                return take()
            except PoolExhaustedError:
                oldest = self.sessions.pop_oldest()
                if oldest is None:
                    return None
                self._evict([oldest])

    def set_session_budget(self, budget_bytes: int) -> None:
        """Idle sessions may hold this much now; the oldest beyond it are evicted."""
        self.sessions.budget_bytes = budget_bytes
        self._evict(self.sessions.shrink())

    def _evict(self, entries: list[tuple[str, PagedKV]]) -> None:
        for key, kv in entries:
            self.evicted_sessions.append((key, detach(kv)))

    def load_kv(self, scope: str, kv: SpilledKV) -> PagedKV:
        """A session's keys and values (e.g. read from disk) put into the pool in `scope`,
        sharing the blocks it holds already."""
        return self.pool.load(scope, kv.k, kv.v, kv.token_ids, kv.held_from)

    def abort(self, request_id: str) -> StepOutput | None:
        """End a queued or running request now; its KV so far stays with its session."""
        seq = self.sequences.get(request_id)
        if seq is None:
            return None
        return self._finish(seq, FinishReason.CANCELLED, "")

    def pause(self, request_id: str) -> bool:
        """Take a queued or running request out of the steps (preemption), keeping all its
        state: its KV, its tokens so far, its sampler. False if it is not active or paused
        already."""
        seq = self.sequences.get(request_id)
        if seq is None or request_id in self.paused:
            return False
        self.scheduler.remove(seq)
        self.paused[request_id] = seq
        return True

    def resume(self, request_id: str) -> bool:
        """Put a paused request back where it was: it goes on exactly as if never paused."""
        seq = self.paused.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.put_back(seq)
        return True

    def warm_up(self) -> None:
        """Run a two-token request through a prefill and a decode step and forget it, so
        that compiling the kernels (the first call in a new process) is not paid by the
        first client, nor learned as the cost of a step."""
        if self.has_work:
            raise RuntimeError("warm_up() is for an engine that has run nothing yet")
        self.generate([Request("warm-up", [1, 2], SamplingParams(max_tokens=2))])
        self.stats = EngineStats()
        self.scheduler.cost = StepCost()

    def adopt_session(self, key: str, cache: PagedKV) -> None:
        """Put a session's KV (restored from elsewhere) into the pool as the most recent;
        an older entry of the same key is released."""
        old = self.sessions.take(key)
        if old is not None and old is not cache:
            old.release()
        self._evict(self.sessions.put(key, cache))

    def _check(self, request: Request) -> None:
        if request.request_id in self.sequences:
            raise InvalidRequestError("request_id", f"{request.request_id!r} is already active")
        self.model.config.check_prompt(request.prompt_ids + request.generated)
        if len(request.generated) >= request.sampling.max_tokens:
            raise InvalidRequestError(
                "generated", "holds max_tokens tokens already: nothing to run"
            )

    def _attach_cache(self, request: Request, restored: PagedKV | None) -> tuple[PagedKV, int]:
        """The session's KV trimmed to the prompt's common prefix, or an empty block table
        of the request's scope (it takes shared prefix blocks when it is scheduled)."""
        pooled = self.sessions.take(request.cache_key) if request.cache_key else None
        if restored is not None and pooled is not None:
            pooled.release()  # the KV brought back is the session's newest
        cached = restored if restored is not None else pooled
        if cached is None:
            return self.pool.new_kv(request.scope), 0
        # at least the prompt's last token is recomputed: its logits give the first token
        ids = request.prompt_ids + request.generated
        reuse = min(common_prefix_len(cached.token_ids, ids), len(ids) - 1)
        return cached, cached.trim(reuse)  # less where windowed layers cannot resume there

    def _postprocess(self, seq: Sequence, logits: np.ndarray) -> StepOutput:
        params = seq.request.sampling
        if params.ignore_eos or len(seq.output_ids) < params.min_tokens:
            logits = logits.copy()
            logits[list(self.model.tokenizer.eot_ids)] = -np.inf
        token = sample(logits, params, seq.rng)
        seq.output_ids.append(token)
        if seq.t_first_token is None:
            seq.t_first_token = time.perf_counter()
        if token in self.model.tokenizer.eot_ids:
            return self._finish(seq, FinishReason.STOP, "", [token])
        text, stopped = seq.text.push(token)
        if stopped:
            return self._finish(seq, FinishReason.STOP, text, [token], flush=False)
        if (
            len(seq.output_ids) >= seq.request.sampling.max_tokens
            or seq.num_tokens >= self.model.config.context_length
        ):
            return self._finish(seq, FinishReason.LENGTH, text, [token])
        return StepOutput(seq.request_id, [token], text)

    def _finish(
        self,
        seq: Sequence,
        reason: FinishReason,
        text: str,
        token_ids: list[int] | None = None,
        *,
        flush: bool = True,
    ) -> StepOutput:
        if flush:
            text += seq.text.finish()[0]
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        seq.t_finished = time.perf_counter()
        self.scheduler.remove(seq)
        self.paused.pop(seq.request_id, None)
        del self.sequences[seq.request_id]
        if seq.request.cache_key:
            seq.cache.compact()  # idle: it holds, and is counted as, its tokens only
            self.adopt_session(seq.request.cache_key, seq.cache)
        else:
            seq.cache.release()  # its full blocks stay known for prompts that start alike
        return StepOutput(seq.request_id, token_ids or [], text, seq.completion())

    def generate(self, requests: list[Request]) -> dict[str, list[StepOutput]]:
        """Run the given requests to completion; every step's outputs, by request id."""
        outputs: dict[str, list[StepOutput]] = {r.request_id: [] for r in requests}
        for r in requests:
            self.add(r)
        while any(r.request_id in self.sequences for r in requests):
            for out in self.step():
                outputs.setdefault(out.request_id, []).append(out)
        return outputs


def _room_to_write(seq: Sequence, n: int) -> bool:
    """Make the sequence's blocks its own for its next n positions (PoolExhaustedError
    when the pool has no room): True."""
    seq.cache.prepare_write(seq.num_computed, n)
    return True
