"""The per-step time budget: learned step costs, and the prefill chunk they allow."""

from __future__ import annotations

import pytest

from common.errors import InvalidRequestError
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from engine.step_cost import MIN_PREFILL_TOKENS, StepCost
from tests.unit.test_engine_tiny import prompt


def test_costs_are_learned_and_bound_the_prefill() -> None:
    cost = StepCost()
    assert cost.prefill_tokens(0.1, 512) == 512  # nothing known yet: no limit
    cost.observe(0, 0.020)  # decode-only steps: the base
    assert cost.prefill_tokens(0.1, 512) == 512
    cost.observe(100, 0.220)  # 100 prompt tokens took 0.2 s more: 2 ms each
    assert cost.base_s == pytest.approx(0.020) and cost.per_token_s == pytest.approx(0.002)
    assert cost.prefill_tokens(0.1, 512) == 40  # (0.1 - 0.02) / 0.002
    assert cost.prefill_tokens(0.021, 512) == MIN_PREFILL_TOKENS  # always some progress
    assert cost.prefill_tokens(10.0, 512) == 512
    cost.observe(0, 0.040)  # slower decode steps move the base
    assert 0.020 < (cost.base_s or 0) < 0.040


def test_a_long_prompt_prefills_in_budget_sized_chunks_while_others_decode(
    tiny_model: Model,
) -> None:
    config = EngineConfig(prefill_chunk_tokens=64, step_prefill_tokens=64, step_budget_s=0.05)
    engine = Engine(tiny_model, config)
    engine.scheduler.cost = StepCost(base_s=0.01, per_token_s=0.002)  # 20 tokens fit
    engine.add(Request("decoding", prompt(1, 5), SamplingParams(max_tokens=30)))
    engine.step()  # its prompt, alone: no limit
    engine.scheduler.cost = StepCost(base_s=0.01, per_token_s=0.002)  # keep it fixed
    engine.add(Request("long", prompt(2, 60), SamplingParams(max_tokens=2)))
    batch = engine.scheduler.schedule()
    assert [(seq.request_id, n) for seq, n in batch] == [("decoding", 1), ("long", 20)]


def test_the_budget_must_be_positive() -> None:
    with pytest.raises(InvalidRequestError, match="step_budget_s"):
        EngineConfig(step_budget_s=0)
