"""The batch-first engine on the real default model: batching, session reuse and seeded
sampling give the tokens a single cold run gives."""

from __future__ import annotations

import json

import pytest

from common.sampling import SamplingParams
from engine.engine import Engine, StepOutput
from engine.model import Model
from engine.ops.kernels import SMALL_ROWS
from engine.sequence import Request
from tests.batch_invariance import check, compositions
from tests.cluster_helpers import prompt_ids
from tests.cold_runs import cold_ids, cold_outputs
from tests.conftest import FIXTURES

pytestmark = pytest.mark.slow
NEW_TOKENS = 24


def conversations() -> list[list[dict[str, str]]]:
    """8 conversations of different lengths: the reference chats, plus longer variants."""
    chats = [
        c["messages"] for c in json.loads((FIXTURES / "greedy_chats.json").read_text())["chats"]
    ]
    extra = [
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name three prime numbers."},
        ],
        [
            {
                "role": "user",
                "content": "Explain what a hash map is, in two sentences, "
                "and give one use of it in a compiler. " * 3,
            }
        ],
    ]
    return (chats + extra)[:8]


def ids_of(outputs: list[StepOutput]) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


def run_alone(model: Model, request: Request) -> list[int]:
    return cold_ids(model, request)


def test_batch_of_8_joining_at_different_steps_equals_each_alone(model: Model) -> None:
    prompts = [prompt_ids(model, m) for m in conversations()]
    assert len(prompts) == 8 and len({len(p) for p in prompts}) >= 6
    sampling = SamplingParams(max_tokens=NEW_TOKENS)
    requests = [Request(f"r{i}", p, sampling) for i, p in enumerate(prompts)]
    alone = {r.request_id: run_alone(model, r) for r in requests}

    engine = Engine(model)
    got: dict[str, list[int]] = {r.request_id: [] for r in requests}
    join_at = {0: [0, 1], 1: [2], 3: [3, 4], 6: [5], 9: [6, 7]}  # step -> requests joining
    max_batch, step = 0, 0
    while step < 10 or engine.has_work:
        for i in join_at.get(step, []):
            engine.add(requests[i])
        for out in engine.step():
            got[out.request_id] += out.token_ids
        max_batch = max(max_batch, len(engine.scheduler.running))
        step += 1
    assert max_batch >= 6  # they really decoded together
    assert got == alone


def test_second_turn_prefills_only_new_tokens_and_matches_cold(model: Model) -> None:
    messages = [{"role": "user", "content": "Give me a name for a pet turtle."}]
    first = Request(
        "t1", prompt_ids(model, messages), SamplingParams(max_tokens=16), cache_key="session-a"
    )
    engine = Engine(model)
    out1 = engine.generate([first])["t1"]
    reply = "".join(o.text for o in out1)
    turn2 = [
        *messages,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": "Why that name?"},
    ]
    ids2 = prompt_ids(model, turn2)
    held = engine.sessions.keys()
    assert held == ["session-a"]

    second = Request("t2", ids2, SamplingParams(max_tokens=NEW_TOKENS), cache_key="session-a")
    before = engine.stats.num_prefill_tokens
    seq = engine.add(second)
    # the KV held covers the first prompt and every reply token but the last (never fed back)
    held_ids = (first.prompt_ids + ids_of(out1))[:-1]
    common = 0
    while common < min(len(held_ids), len(ids2)) and held_ids[common] == ids2[common]:
        common += 1
    assert common >= len(first.prompt_ids)  # the whole first prompt, and some of the reply
    assert seq.num_cached == common
    assert seq.num_computed == common  # the cache really holds them, trimmed to the prefix
    out2: list[StepOutput] = []
    while engine.has_work:
        out2 += engine.step()
    assert engine.stats.num_prefill_tokens - before == len(ids2) - common
    assert out2[-1].completion is not None
    assert out2[-1].completion.cached_tokens == common
    cold = run_alone(model, Request("cold", ids2, SamplingParams(max_tokens=NEW_TOKENS)))
    assert ids_of(out2) == cold


def test_seeded_sampling_is_reproducible_and_batch_independent(model: Model) -> None:
    prompts = [prompt_ids(model, m) for m in conversations()[:4]]
    sampling = SamplingParams(
        temperature=0.9, top_p=0.95, top_k=50, seed=1234, max_tokens=NEW_TOKENS
    )
    target = Request("seeded", prompts[0], sampling)
    alone = run_alone(model, target)
    assert alone == run_alone(model, target)
    others = [
        Request(f"o{i}", p, SamplingParams(temperature=1.0, seed=i, max_tokens=8))
        for i, p in enumerate(prompts[1:])
    ]
    outputs = cold_outputs(model, [*others, target])
    assert ids_of(outputs["seeded"]) == alone
    other_seed = Request(
        "seeded",
        prompts[0],
        SamplingParams(temperature=0.9, top_p=0.95, top_k=50, seed=99, max_tokens=NEW_TOKENS),
    )
    assert run_alone(model, other_seed) != alone


@pytest.mark.parametrize(
    "kv", ["model", "model_kv_float32", "model_kv_q8"], ids=["float16", "float32", "q8_0"]
)
def test_logits_are_bitwise_batch_invariant(request: pytest.FixtureRequest, kv: str) -> None:
    """Every decode row of the real model gives the same bits alone and in batches of 1 to
    32 rows, in any position, beside a short prefill chunk (kernel) or a long one (BLAS),
    with its KV in float16 (the default), float32 and q8_0."""
    model: Model = request.getfixturevalue(kv)
    prompts = [prompt_ids(model, c)[: 12 + 9 * i] for i, c in enumerate(conversations())] * 4
    sizes = [1, 2, 3, 4, 5, 8, 9, 16, 17, 31, 32]
    cases = compositions(len(prompts), sizes, [0, 7, SMALL_ROWS + 9])
    assert check(model, prompts, cases) == sum(len(c.order) + (c.prefill > 0) for c in cases)
