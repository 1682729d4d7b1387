"""Shared helpers of the engine tests on the tiny model: prompts, driving an engine step by
step with arrivals, collecting each request's outputs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine, StepOutput
from engine.model import Model
from engine.scheduler import ScheduledBatch
from engine.sequence import Completion, Request
from tests.tiny_gguf import VOCAB_SIZE

GREEDY = SamplingParams(max_tokens=8)


def prompt(seed: int, length: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(3, VOCAB_SIZE, size=length)]


PROMPTS = {"a": prompt(1, 5), "b": prompt(2, 12), "c": prompt(3, 20), "d": prompt(4, 9)}


@dataclass
class Result:
    ids: list[int]
    text: str
    completion: Completion


def collect(outputs: list[StepOutput]) -> Result:
    assert all(len(o.token_ids) <= 1 for o in outputs)
    assert [o.finished for o in outputs] == [False] * (len(outputs) - 1) + [True]
    completion = outputs[-1].completion
    assert completion is not None
    return Result(
        [t for o in outputs for t in o.token_ids], "".join(o.text for o in outputs), completion
    )


def run_alone(model: Model, request: Request, config: EngineConfig | None = None) -> Result:
    return collect(Engine(model, config).generate([request])[request.request_id])


def drive(engine: Engine, arrivals: dict[int, list[Request]]) -> dict[str, Result]:
    """Step the engine, adding each request at its step number, until everything ends."""
    outputs: dict[str, list[StepOutput]] = {}
    step = 0
    while step <= max(arrivals) or engine.has_work:
        for r in arrivals.get(step, []):
            engine.add(r)
            outputs[r.request_id] = []
        for out in engine.step():
            outputs[out.request_id].append(out)
        step += 1
    return {rid: collect(outs) for rid, outs in outputs.items()}


def record_schedule(engine: Engine) -> list[list[tuple[str, int]]]:
    """Wrap the scheduler so every batch it hands out is recorded as (request id, tokens)."""
    batches: list[list[tuple[str, int]]] = []
    schedule: Callable[[], ScheduledBatch] = engine.scheduler.schedule

    def recording() -> ScheduledBatch:
        batch = schedule()
        batches.append([(seq.request_id, n) for seq, n in batch])
        return batch

    engine.scheduler.schedule = recording  # type: ignore[method-assign]
    return batches
