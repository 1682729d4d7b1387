"""The batch-first engine: add requests, step, abort. Each step is schedule, run, postprocess."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from common.enums import FinishReason
from common.errors import InvalidRequestError
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.detokenizer import StreamDecoder
from engine.kv_cache import KVCache, common_prefix_len
from engine.model import Model
from engine.runner import ModelRunner
from engine.sampling import make_rng, sample
from engine.scheduler import ScheduledBatch, Scheduler
from engine.sequence import Completion, Request, Sequence, SequenceStatus
from engine.session_pool import SessionPool
from engine.step_cost import StepCost
from engine.text_stream import TextStream


@dataclass(slots=True)
class EngineStats:
    """Counters since the engine started."""

    num_steps: int = 0
    num_prefill_tokens: int = 0  # prompt tokens computed (reused ones are not)
    num_decode_tokens: int = 0  # generated tokens fed back through the model


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
        self.runner = ModelRunner(model)
        self.sessions: SessionPool[KVCache] = SessionPool(self.config.session_budget_bytes)
        self.sequences: dict[str, Sequence] = {}
        self.paused: dict[str, Sequence] = {}  # preempted: active but not stepped
        self.stats = EngineStats()
        # sessions pushed out of the pool by its budget; the owner spills or forgets them
        self.evicted_sessions: list[tuple[str, KVCache]] = []

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add(self, request: Request, restored: KVCache | None = None) -> Sequence:
        """Queue a request; raises InvalidRequestError / PromptTooLongError, changing nothing.

        `restored`: the session's KV brought back from elsewhere (a spill file), used by
        this request instead of the pool's entry; it never sits in the pool, so nothing
        can evict it before the request runs."""
        self._check(request)
        cache, num_cached = self._attach_cache(request, restored)
        rng, seed = make_rng(request.sampling.seed)
        text = TextStream(StreamDecoder(self.model.tokenizer), request.sampling.stop)
        seq = Sequence(request, cache, num_cached, rng, seed, text)
        self.sequences[request.request_id] = seq
        self.scheduler.add(seq)
        return seq

    def step(self) -> list[StepOutput]:
        batch = self.scheduler.schedule()
        if not batch:
            return []
        prefill = sum(n for seq, n in batch if not seq.output_ids)
        t0 = time.perf_counter()
        logits, due = self.runner.run(batch)
        self.scheduler.cost.observe(prefill, time.perf_counter() - t0)
        self._count(batch)
        return [self._postprocess(seq, row) for seq, row in zip(due, logits, strict=True)]

    def _count(self, batch: ScheduledBatch) -> None:
        self.stats.num_steps += 1
        for seq, n in batch:
            # a decode step feeds back one sampled token; everything else is prompt
            if seq.output_ids:
                self.stats.num_decode_tokens += n
            else:
                self.stats.num_prefill_tokens += n

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

    def adopt_session(self, key: str, cache: KVCache) -> None:
        """Put a session's KV (restored from elsewhere) into the pool as the most recent."""
        self.evicted_sessions += self.sessions.put(key, cache)

    def _check(self, request: Request) -> None:
        if request.request_id in self.sequences:
            raise InvalidRequestError("request_id", f"{request.request_id!r} is already active")
        self.model.config.check_prompt(request.prompt_ids)

    def _attach_cache(self, request: Request, restored: KVCache | None) -> tuple[KVCache, int]:
        """The session's KV trimmed to the prompt's common prefix, or a fresh cache; room
        for the whole prompt is made at once (growing chunk by chunk copies it each time)."""
        pooled = self.sessions.take(request.cache_key) if request.cache_key else None
        cached = restored if restored is not None else pooled
        if cached is None:
            cached = self.model.new_cache()
        # at least the prompt's last token is recomputed: its logits give the first token
        reuse = min(
            common_prefix_len(cached.token_ids, request.prompt_ids), len(request.prompt_ids) - 1
        )
        cached.trim(reuse)
        cached.reserve(len(request.prompt_ids))
        return cached, reuse

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
            self.evicted_sessions += self.sessions.put(seq.request.cache_key, seq.cache)
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
