"""The engine on the tiny model: batching, aborts, limits, chunked prefill, validation,
seeded sampling, stop strings and pausing."""

from __future__ import annotations

import pytest

from common.enums import FinishReason
from common.errors import InvalidRequestError, PromptTooLongError
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine, StepOutput
from engine.model import Model
from engine.sequence import Request
from tests.tiny_gguf import VOCAB_SIZE
from tests.unit.engine_driver import (
    GREEDY,
    PROMPTS,
    collect,
    drive,
    prompt,
    record_schedule,
    run_alone,
)


@pytest.fixture(scope="module")
def alone(tiny_model: Model) -> dict[str, list[int]]:
    return {
        rid: run_alone(tiny_model, Request(rid, ids, GREEDY)).ids for rid, ids in PROMPTS.items()
    }


def test_greedy_outputs_are_not_degenerate(alone: dict[str, list[int]]) -> None:
    """The other tests compare these ids; they must differ between prompts to mean anything."""
    assert all(len(ids) == 8 for ids in alone.values())
    assert len({tuple(ids) for ids in alone.values()}) == len(alone)
    assert all(len(set(ids)) >= 3 for ids in alone.values())


def test_batch_invariance_with_staggered_arrivals(
    tiny_model: Model, alone: dict[str, list[int]]
) -> None:
    engine = Engine(tiny_model, EngineConfig(prefill_chunk_tokens=4, step_prefill_tokens=7))
    arrivals = {
        0: [Request("a", PROMPTS["a"], GREEDY), Request("c", PROMPTS["c"], GREEDY)],
        2: [Request("b", PROMPTS["b"], GREEDY)],
        5: [Request("d", PROMPTS["d"], GREEDY)],
    }
    results = drive(engine, arrivals)
    assert {rid: r.ids for rid, r in results.items()} == alone
    assert not engine.sequences and not engine.scheduler.has_work


def test_abort_running_request_leaves_others_unaffected(
    tiny_model: Model, alone: dict[str, list[int]]
) -> None:
    engine = Engine(tiny_model)
    engine.add(Request("a", PROMPTS["a"], GREEDY))
    engine.add(Request("b", PROMPTS["b"], GREEDY))
    outputs: dict[str, list[StepOutput]] = {"a": [], "b": []}
    for _ in range(3):
        for out in engine.step():
            outputs[out.request_id].append(out)
    engine.add(Request("w", PROMPTS["c"], GREEDY))  # queued, aborted before it runs

    cancelled = engine.abort("a")
    assert cancelled is not None and cancelled.token_ids == []
    assert cancelled.completion is not None
    assert cancelled.completion.finish_reason is FinishReason.CANCELLED
    assert cancelled.completion.completion_tokens == 3
    assert [t for o in outputs["a"] for t in o.token_ids] == alone["a"][:3]
    waiting = engine.abort("w")
    assert waiting is not None and waiting.completion is not None
    assert waiting.completion.finish_reason is FinishReason.CANCELLED
    assert waiting.completion.completion_tokens == 0
    assert engine.abort("a") is None and engine.abort("nope") is None
    assert set(engine.sequences) == {"b"}
    assert [s.request_id for s in engine.scheduler.running] == ["b"]
    assert not engine.scheduler.waiting

    while engine.has_work:
        for out in engine.step():
            assert out.request_id == "b"
            outputs["b"].append(out)
    assert collect(outputs["b"]).ids == alone["b"]


def test_max_tokens_gives_exactly_n_tokens(tiny_model: Model) -> None:
    for n in (1, 5, 13):
        result = run_alone(tiny_model, Request("r", PROMPTS["b"], SamplingParams(max_tokens=n)))
        assert len(result.ids) == n
        assert result.completion.finish_reason is FinishReason.LENGTH
        assert result.completion.completion_tokens == n
        assert result.completion.prompt_tokens == len(PROMPTS["b"])
        assert result.completion.cached_tokens == 0


def test_full_context_ends_with_length(tiny_model: Model) -> None:
    ctx = tiny_model.config.context_length
    request = Request("r", prompt(9, ctx - 3), SamplingParams(max_tokens=50))
    result = run_alone(tiny_model, request)
    assert len(result.ids) == 3
    assert result.completion.finish_reason is FinishReason.LENGTH


def test_scheduler_chunks_prefill_within_the_step_budget(tiny_model: Model) -> None:
    engine = Engine(tiny_model, EngineConfig(prefill_chunk_tokens=4, step_prefill_tokens=6))
    batches = record_schedule(engine)
    results = drive(
        engine,
        {
            0: [
                Request("c", PROMPTS["c"][:10], GREEDY),
                Request("b", PROMPTS["b"][:7], GREEDY),
                Request("a", PROMPTS["a"][:3], GREEDY),
            ]
        },
    )
    assert batches[:5] == [
        [("c", 4), ("b", 2)],
        [("c", 4), ("b", 2)],
        [("c", 2), ("b", 3), ("a", 1)],
        [("c", 1), ("b", 1), ("a", 2)],
        [("c", 1), ("b", 1), ("a", 1)],
    ]
    # afterwards only decodes; a's first token comes in step 4 and its eighth in step 11
    assert batches[5:] == [[("c", 1), ("b", 1), ("a", 1)]] * 5 + [[("a", 1)]]
    for rid, length in (("c", 10), ("b", 7), ("a", 3)):
        cold = run_alone(tiny_model, Request(rid, PROMPTS[rid][:length], GREEDY))
        assert results[rid].ids == cold.ids


def test_long_prompt_is_chunked_and_counted_in_steps(tiny_model: Model) -> None:
    engine = Engine(tiny_model, EngineConfig(prefill_chunk_tokens=16, step_prefill_tokens=16))
    batches = record_schedule(engine)
    long_prompt = prompt(11, 100)
    result = drive(engine, {0: [Request("r", long_prompt, SamplingParams(max_tokens=3))]})["r"]
    assert [n for batch in batches for _, n in batch] == [16] * 6 + [4, 1, 1]
    assert (
        result.ids
        == run_alone(tiny_model, Request("r", long_prompt, SamplingParams(max_tokens=3))).ids
    )


def assert_state_unchanged(engine: Engine, session_ids: list[int]) -> None:
    assert not engine.sequences and not engine.scheduler.has_work
    assert engine.sessions.keys() == ["s"]
    entry = engine.sessions.take("s")
    assert entry is not None and entry.token_ids == session_ids
    engine.sessions.put("s", entry)


def test_prompt_too_long_changes_nothing(tiny_model: Model) -> None:
    engine = Engine(tiny_model)
    drive(engine, {0: [Request("1", PROMPTS["a"], GREEDY, cache_key="s")]})
    held = engine.sessions.take("s")
    assert held is not None
    engine.sessions.put("s", held)
    ctx = tiny_model.config.context_length
    for length in (ctx, ctx + 50):
        with pytest.raises(PromptTooLongError) as err:
            engine.add(Request("2", PROMPTS["a"] + prompt(6, length - 5), cache_key="s"))
        assert err.value.field == "prompt"
        assert err.value.num_tokens == length and err.value.context_length == ctx
        assert_state_unchanged(engine, held.token_ids)
    engine.add(Request("ok", prompt(6, ctx - 1)))  # the longest prompt that fits
    assert set(engine.sequences) == {"ok"}


@pytest.mark.parametrize(
    ("ids", "field"),
    [
        ([], "prompt"),
        ([5, VOCAB_SIZE, 7], "token_ids"),
        ([5, -1], "token_ids"),
        ([10**12], "token_ids"),
    ],
)
def test_invalid_prompt_names_the_field_and_changes_nothing(
    tiny_model: Model, ids: list[int], field: str
) -> None:
    engine = Engine(tiny_model)
    drive(engine, {0: [Request("1", PROMPTS["a"], GREEDY, cache_key="s")]})
    held = engine.sessions.take("s")
    assert held is not None
    engine.sessions.put("s", held)
    with pytest.raises(InvalidRequestError) as err:
        engine.add(Request("2", ids, cache_key="s"))
    assert err.value.field == field
    assert_state_unchanged(engine, held.token_ids)


def test_duplicate_request_id_is_rejected(tiny_model: Model) -> None:
    engine = Engine(tiny_model)
    engine.add(Request("x", PROMPTS["a"]))
    with pytest.raises(InvalidRequestError) as err:
        engine.add(Request("x", PROMPTS["b"]))
    assert err.value.field == "request_id"
    assert len(engine.scheduler.waiting) == 1


def test_seeded_sampling_is_batch_invariant_and_seed_dependent(tiny_model: Model) -> None:
    def seeded(rid: str, seed: int) -> Request:
        return Request(rid, PROMPTS["b"], SamplingParams(temperature=1.0, seed=seed, max_tokens=12))

    solo = run_alone(tiny_model, seeded("s", 7))
    assert solo.completion.seed == 7
    engine = Engine(tiny_model, EngineConfig(prefill_chunk_tokens=4, step_prefill_tokens=8))
    results = drive(
        engine,
        {
            0: [Request("g", PROMPTS["c"], GREEDY), seeded("x", 99)],
            1: [seeded("s", 7)],
            3: [seeded("y", 7)],
        },
    )
    assert results["s"].ids == solo.ids
    assert results["y"].ids == solo.ids  # same seed, same prompt, different arrival step
    assert results["x"].ids != solo.ids
    assert run_alone(tiny_model, seeded("s", 8)).ids != solo.ids
    assert (
        solo.ids
        != run_alone(tiny_model, Request("g", PROMPTS["b"], SamplingParams(max_tokens=12))).ids
    )


def test_unseeded_sampling_reports_the_seed_it_used(tiny_model: Model) -> None:
    params = SamplingParams(temperature=1.0, max_tokens=6)
    first = run_alone(tiny_model, Request("r", PROMPTS["b"], params))
    replay = SamplingParams(temperature=1.0, max_tokens=6, seed=first.completion.seed)
    assert run_alone(tiny_model, Request("r", PROMPTS["b"], replay)).ids == first.ids


def test_stop_string_cuts_text_and_ends_with_stop(tiny_model: Model) -> None:
    ascii_prompt = tiny_model.tokenizer.encode("the cat sat in the hat")
    params = SamplingParams(max_tokens=40)
    full = run_alone(tiny_model, Request("r", ascii_prompt, params))
    assert full.text == tiny_model.tokenizer.decode(full.ids, skip_special=True)
    half = len(full.text) // 2
    start = next(
        i
        for i in range(half, len(full.text) - 1)
        if full.text[i : i + 2].isascii() and full.text[i : i + 2].isprintable()
    )
    stop = full.text[start : start + 2]
    cut = full.text.find(stop)
    assert cut > 0
    stopped = run_alone(
        tiny_model, Request("r", ascii_prompt, SamplingParams(max_tokens=40, stop=(stop,)))
    )
    assert stopped.text == full.text[:cut]
    assert stopped.completion.finish_reason is FinishReason.STOP
    assert stopped.ids == full.ids[: len(stopped.ids)]
    # the stop ends on the token that completes it
    assert stop in tiny_model.tokenizer.decode(stopped.ids, skip_special=True)
    assert stop not in tiny_model.tokenizer.decode(stopped.ids[:-1], skip_special=True)


def test_a_paused_request_resumes_with_exactly_its_own_tokens(
    tiny_model: Model, alone: dict[str, list[int]]
) -> None:
    config = EngineConfig(max_running=2, prefill_chunk_tokens=4, step_prefill_tokens=7)
    engine = Engine(tiny_model, config)
    outputs: dict[str, list[StepOutput]] = {rid: [] for rid in PROMPTS}

    def step(times: int = 1) -> None:
        for _ in range(times):
            for out in engine.step():
                outputs[out.request_id].append(out)

    engine.add(Request("a", PROMPTS["a"], GREEDY))
    engine.add(Request("c", PROMPTS["c"], GREEDY))  # still prefilling when paused
    step(3)
    assert engine.pause("a") and engine.pause("c") and not engine.pause("a")
    paused_at = {rid: len(outputs[rid]) for rid in ("a", "c")}
    engine.add(Request("b", PROMPTS["b"], GREEDY))  # takes the slots meanwhile
    engine.add(Request("d", PROMPTS["d"], GREEDY))
    engine.pause("d")  # paused before it ever ran
    step(4)
    assert {rid: len(outputs[rid]) for rid in ("a", "c")} == paused_at  # nothing while paused
    assert outputs["d"] == []
    assert engine.resume("a") and engine.resume("c") and engine.resume("d")
    assert not engine.resume("a")
    while engine.has_work:
        step()
    assert {rid: collect(outs).ids for rid, outs in outputs.items()} == alone
    assert not engine.paused and not engine.sequences


def test_a_paused_request_can_be_aborted(tiny_model: Model) -> None:
    engine = Engine(tiny_model)
    engine.add(Request("a", PROMPTS["a"], GREEDY))
    engine.step()
    engine.pause("a")
    stopped = engine.abort("a")
    assert stopped is not None and stopped.completion is not None
    assert stopped.completion.finish_reason is FinishReason.CANCELLED
    assert not engine.paused and not engine.sequences and not engine.has_work
