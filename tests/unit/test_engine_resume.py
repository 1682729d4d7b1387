"""A request resumed after the tokens an earlier run generated (a worker that died had sent
them): prefilled in chunks with its prompt, then on exactly as if it had never stopped —
the same tokens, the same text, the same sampler, the same way of ending."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from common.errors import InvalidRequestError
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Completion, Request
from tests.unit.engine_driver import PROMPTS, collect, run_alone

CHUNKED = EngineConfig(prefill_chunk_tokens=8, step_prefill_tokens=16)
LONG = 40


@pytest.mark.parametrize("cut", [1, 7, 20, LONG - 1])
@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(max_tokens=LONG, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=LONG, ignore_eos=True),
    ],
    ids=["greedy", "seeded"],
)
def test_a_resumed_run_goes_on_as_if_it_had_not_stopped(
    tiny_model: Model, sampling: SamplingParams, cut: int
) -> None:
    request = Request("r", PROMPTS["c"], sampling)
    whole = run_alone(tiny_model, request, CHUNKED)
    assert len(whole.ids) == LONG
    engine = Engine(tiny_model, CHUNKED)
    again = Request("r", PROMPTS["c"], sampling, generated=whole.ids[:cut])
    outputs = engine.generate([again])["r"]
    rest = collect(outputs)
    assert rest.ids == whole.ids[cut:]
    assert rest.completion.completion_tokens == LONG  # the earlier run's tokens count
    assert rest.completion.prompt_tokens == len(PROMPTS["c"])
    # prompt and generated tokens prefilled in chunks of 8, then one step a token
    prefill_steps = math.ceil((len(PROMPTS["c"]) + cut) / CHUNKED.prefill_chunk_tokens)
    assert engine.stats.num_steps == prefill_steps + len(whole.ids) - cut - 1
    assert engine.stats.num_prefill_tokens == len(PROMPTS["c"]) + cut


def test_a_resumed_run_writes_the_same_text_and_stops_at_the_same_string(
    tiny_model: Model,
) -> None:
    free = run_alone(tiny_model, Request("r", PROMPTS["b"], SamplingParams(max_tokens=LONG)))
    middle = len(free.text) // 2
    stop = free.text[middle : middle + 4]  # held back 3 characters at a time
    sampling = SamplingParams(max_tokens=LONG, stop=(stop,))
    whole = Engine(tiny_model).generate([Request("r", PROMPTS["b"], sampling)])["r"]
    ids = collect(whole).ids
    assert collect(whole).completion.stop_sequence == stop and len(ids) > 2
    for cut in range(1, len(ids)):
        again = Request("r", PROMPTS["b"], sampling, generated=ids[:cut])
        rest = Engine(tiny_model).generate([again])["r"]
        assert [(o.token_ids, o.text) for o in rest] == [(o.token_ids, o.text) for o in whole[cut:]]
        assert untimed(collect(rest).completion) == untimed(collect(whole).completion)


def untimed(c: Completion) -> Completion:
    """A completion without its timings, which differ run to run (nor the seed a greedy run
    drew)."""
    return replace(c, queue_s=0.0, ttft_s=0.0, total_s=0.0, decode_tok_s=0.0, seed=0)


def test_a_run_resumed_with_all_its_tokens_is_refused(tiny_model: Model) -> None:
    engine = Engine(tiny_model)
    sampling = SamplingParams(max_tokens=4)
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        engine.add(Request("r", PROMPTS["a"], sampling, generated=[5, 6, 7, 8]))
    assert not engine.has_work
