"""One object per request's state: its ids, counters, KV handle and timings."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import numpy as np

from common.enums import FinishReason
from common.sampling import SamplingParams
from engine.kv.kv_pool import PagedKV
from engine.text.text_stream import TextStream


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True)
class Request:
    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    cache_key: str | None = None  # the session whose KV this request may reuse and extend
    scope: str = ""  # who may share KV blocks with it (the tenant); never across scopes
    # tokens an earlier run of this request generated (a worker that died had sent them):
    # prefilled after the prompt, and the run goes on from there as if it had not stopped
    generated: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Completion:
    """What a finished request reports besides its tokens."""

    finish_reason: FinishReason
    prompt_tokens: int
    cached_tokens: int  # prompt tokens whose KV was reused
    prefix_tokens: int  # of which taken from blocks shared with other sequences
    completion_tokens: int
    seed: int
    queue_s: float  # added -> first scheduled
    ttft_s: float  # added -> first token
    total_s: float
    decode_tok_s: float  # tokens after the first, per second
    stop_sequence: str = ""  # the stop string that ended it ("" for anything else)


class Sequence:
    __slots__ = (
        "cache",
        "finish_reason",
        "num_cached",
        "num_prefix",
        "num_resumed",
        "output_ids",
        "request",
        "rng",
        "seed",
        "status",
        "t_added",
        "t_finished",
        "t_first_token",
        "t_scheduled",
        "text",
    )

    def __init__(
        self,
        request: Request,
        cache: PagedKV,
        num_cached: int,
        rng: np.random.Generator,
        seed: int,
        text: TextStream,
    ) -> None:
        self.request = request
        self.status = SequenceStatus.WAITING
        self.cache = cache
        self.num_cached = num_cached
        self.num_prefix = 0  # of num_cached: tokens taken from shared blocks
        self.output_ids: list[int] = list(request.generated)
        self.num_resumed = len(request.generated)  # of output_ids: computed as a prefill
        self.rng = rng
        self.seed = seed
        self.text = text
        self.finish_reason: FinishReason | None = None
        self.t_added = time.perf_counter()
        self.t_scheduled: float | None = None
        self.t_first_token: float | None = None
        self.t_finished: float | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def num_prompt(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt + len(self.output_ids)

    @property
    def num_computed(self) -> int:
        """Tokens whose keys and values are in the cache."""
        return self.cache.offset

    @property
    def num_prefill(self) -> int:
        """Tokens computed as a prefill: the prompt, and the tokens of an earlier run."""
        return self.num_prompt + self.num_resumed

    @property
    def prefill_ids(self) -> list[int]:
        if not self.num_resumed:
            return self.request.prompt_ids
        return self.request.prompt_ids + self.output_ids[: self.num_resumed]

    @property
    def prefilling(self) -> bool:
        return self.num_computed < self.num_prefill

    def take_shared_prefix(self) -> None:
        """Before its next prefill chunk: take the blocks the pool already holds for the
        next part of the prompt (another sequence of its scope computed them)."""
        gained = self.cache.extend_prefix(self.prefill_ids, self.num_prefill - 1)
        self.num_cached += gained
        self.num_prefix += gained

    def token_slice(self, start: int, stop: int) -> list[int]:
        prompt = self.request.prompt_ids
        head = prompt[start:stop]
        if stop <= len(prompt):
            return head
        return head + self.output_ids[max(0, start - len(prompt)) : stop - len(prompt)]

    def completion(self) -> Completion:
        assert self.finish_reason is not None and self.t_finished is not None
        first = self.t_first_token or self.t_finished
        n_out = len(self.output_ids)
        decode_s = self.t_finished - first
        return Completion(
            finish_reason=self.finish_reason,
            prompt_tokens=self.num_prompt,
            cached_tokens=min(self.num_cached, self.num_prompt),
            prefix_tokens=min(self.num_prefix, self.num_prompt),
            completion_tokens=n_out,
            seed=self.seed,
            queue_s=(self.t_scheduled or self.t_finished) - self.t_added,
            ttft_s=first - self.t_added,
            total_s=self.t_finished - self.t_added,
            decode_tok_s=(n_out - 1) / decode_s if n_out > 1 and decode_s > 0 else 0.0,
            stop_sequence=self.text.matched,
        )
