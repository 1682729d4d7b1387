"""A step refused its memory is run again smaller, on the tiny model: the same tokens,
the decodes taking turns, the cap growing back, and a step of one row that does not fit
raised for the worker."""

from __future__ import annotations

import itertools

import pytest

from engine.engine import Engine
from engine.model import Model
from engine.scheduler import GROW_AFTER_STEPS
from engine.sequence import Request
from tests.unit.engine_driver import GREEDY, PROMPTS, drive, run_alone


@pytest.fixture(scope="module")
def alone(tiny_model: Model) -> dict[str, list[int]]:
    return {rid: run_alone(tiny_model, Request(rid, PROMPTS[rid], GREEDY)).ids for rid in "abcd"}


def test_steps_out_of_memory_are_run_smaller_with_the_same_tokens(
    tiny_model: Model, alone: dict[str, list[int]]
) -> None:
    """A step refused its memory is run again in halves (decodes taking turns) down to what
    fits; the cap doubles after GROW_AFTER_STEPS steps that fit; a step of one row that
    does not fit raises for the worker to end its requests."""
    engine = Engine(tiny_model)
    run, steps = engine.runner.run, []
    max_rows: list[int | None] = [None]  # steps of more rows are refused

    def run_within_limit(batch):
        steps.append(sorted((seq.request_id, n) for seq, n in batch))
        if len(batch) == 4 and all(n == 1 for _, n in batch) and max_rows[0] is None:
            max_rows[0] = 3  # from when the four are decoding together
        limit = max_rows[0]
        if limit is not None and sum(n for _, n in batch) > limit:
            raise MemoryError("scratch refused")
        return run(batch)

    engine.runner.run = run_within_limit  # type: ignore[method-assign]
    results = drive(engine, {0: [Request(rid, PROMPTS[rid], GREEDY) for rid in "abcd"]})
    assert {rid: r.ids for rid, r in results.items()} == {rid: alone[rid] for rid in "abcd"}
    first = steps.index([("a", 1), ("b", 1), ("c", 1), ("d", 1)])  # refused, then capped
    capped = steps[first + 1 :]
    assert capped and all(len(s) == 2 for s in capped[:2]) and engine.scheduler.row_cap == 2
    # four decoding sequences in steps of 2 rows: they take turns, none waits for the
    # others to finish (a sequence's decodes at most 2 steps apart)
    for rid in "abcd":
        at = [i for i, s in enumerate(capped) if (rid, 1) in s]
        assert at and max(b - a for a, b in itertools.pairwise([-1, *at])) <= 2, rid
    # the cap grows back: doubled after GROW_AFTER_STEPS steps that fit, gone past the
    # largest step the scheduler would build
    engine.scheduler.limit_rows(2)
    for _ in range(GROW_AFTER_STEPS):
        engine.scheduler.step_ran()
    assert engine.scheduler.row_cap == 4
    engine.scheduler.limit_rows(engine.config.step_prefill_tokens + engine.config.max_running)
    for _ in range(GROW_AFTER_STEPS):
        engine.scheduler.step_ran()
    assert engine.scheduler.row_cap is None
    # one row that does not fit: the engine gives up on the step and says so
    max_rows[0] = 0
    engine.add(Request("e", PROMPTS["a"][:1], GREEDY))
    with pytest.raises(MemoryError, match="scratch refused"):
        while True:
            engine.step()
