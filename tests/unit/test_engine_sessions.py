"""The engine's sessions on the tiny model: prefix reuse, eviction by bytes held, restored
caches, and the session pool itself."""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import EngineConfig
from engine.engine import Engine, StepOutput
from engine.kv.session_pool import SessionPool
from engine.model import Model
from engine.sequence import Request
from tests.tiny_gguf import VOCAB_SIZE
from tests.unit.engine_driver import GREEDY, PROMPTS, collect, drive, prompt, run_alone


def test_session_extension_reuses_the_prefix(tiny_model: Model) -> None:
    engine = Engine(tiny_model)
    first = drive(engine, {0: [Request("1", PROMPTS["c"], GREEDY, cache_key="s")]})["1"]
    assert first.completion.cached_tokens == 0
    assert engine.sessions.keys() == ["s"]
    # the last sampled token was never run, so the session holds prompt + ids[:-1]
    held = PROMPTS["c"] + first.ids[:-1]
    second_prompt = PROMPTS["c"] + first.ids + prompt(5, 6)
    second = drive(engine, {0: [Request("2", second_prompt, GREEDY, cache_key="s")]})["2"]
    assert second.completion.cached_tokens == len(held)
    assert second.ids == run_alone(tiny_model, Request("cold", second_prompt, GREEDY)).ids


def test_session_with_identical_prompt_recomputes_the_last_token(tiny_model: Model) -> None:
    engine = Engine(tiny_model)
    drive(engine, {0: [Request("1", PROMPTS["b"], GREEDY, cache_key="s")]})
    again = drive(engine, {0: [Request("2", PROMPTS["b"][:7], GREEDY, cache_key="s")]})["2"]
    assert again.completion.cached_tokens == 6
    assert again.ids == run_alone(tiny_model, Request("cold", PROMPTS["b"][:7], GREEDY)).ids


def test_session_diverging_midway_reuses_only_the_common_prefix(tiny_model: Model) -> None:
    engine = Engine(tiny_model)
    drive(engine, {0: [Request("1", PROMPTS["c"], GREEDY, cache_key="s")]})
    diverged = [*PROMPTS["c"][:7], (PROMPTS["c"][7] + 1) % VOCAB_SIZE, *PROMPTS["c"][8:]]
    result = drive(engine, {0: [Request("2", diverged, GREEDY, cache_key="s")]})["2"]
    assert result.completion.cached_tokens == 7
    assert result.ids == run_alone(tiny_model, Request("cold", diverged, GREEDY)).ids
    # the session now holds the diverged prompt and its output, not the first request's
    assert engine.sessions.take("s").token_ids == diverged + result.ids[:-1]  # type: ignore[union-attr]


def test_sessions_are_evicted_by_the_blocks_they_hold(tiny_model: Model) -> None:
    block = 16 * tiny_model.bytes_per_token
    # a + its 8 new tokens (all but the last fed back) hold 12 positions: one block; b's 19
    # two: 3 blocks > 2.5
    engine = Engine(tiny_model, EngineConfig(session_budget_bytes=5 * block // 2))
    drive(engine, {0: [Request("1", PROMPTS["a"], GREEDY, cache_key="s1")]})
    held = engine.sessions.peek("s1")
    assert held is not None and held.offset == len(PROMPTS["a"]) + 7
    assert len(held.blocks) == 1 and engine.sessions.nbytes == block
    drive(engine, {0: [Request("2", PROMPTS["b"], GREEDY, cache_key="s2")]})
    assert engine.sessions.keys() == ["s2"] and engine.sessions.num_evicted == 1
    assert engine.sessions.nbytes == 2 * block
    cold = drive(engine, {0: [Request("3", PROMPTS["a"], GREEDY, cache_key="s1")]})["3"]
    assert cold.completion.cached_tokens == 0


def test_a_restored_cache_is_used_by_its_request_not_the_pool(tiny_model: Model) -> None:
    engine = Engine(tiny_model, EngineConfig(session_budget_bytes=0))  # the pool keeps nothing
    first = drive(engine, {0: [Request("1", PROMPTS["c"], GREEDY, cache_key="s")]})["1"]
    assert engine.sessions.keys() == [] and len(engine.evicted_sessions) == 1
    _, kv = engine.evicted_sessions.pop()  # copied out, its blocks back in the pool
    assert engine.pool.alloc.num_held == 0
    restored = engine.load_kv("", kv)
    again = [*PROMPTS["c"], *first.ids, *PROMPTS["a"]]
    seq = engine.add(Request("2", again, GREEDY, cache_key="s"), restored)
    assert seq.cache is restored and seq.num_cached == len(PROMPTS["c"]) + 7
    outputs: list[StepOutput] = []
    while engine.has_work:
        outputs += engine.step()
    result = collect(outputs)
    assert result.ids == run_alone(tiny_model, Request("cold", again, GREEDY)).ids


@dataclass
class Stub:
    nbytes: int


def test_session_pool_lru_by_bytes() -> None:
    pool: SessionPool[Stub] = SessionPool(budget_bytes=100)
    assert pool.put("a", Stub(40)) == []
    assert pool.put("b", Stub(40)) == []
    a = pool.peek("a")
    assert pool.put("c", Stub(30)) == [("a", a)]
    assert pool.keys() == ["b", "c"] and pool.nbytes == 70 and pool.num_evicted == 1
    assert pool.put("b", Stub(40)) == []  # refresh b: now c is the oldest
    assert pool.keys() == ["c", "b"] and pool.nbytes == 70
    assert [k for k, _ in pool.put("d", Stub(50))] == ["c"]
    assert pool.keys() == ["b", "d"] and pool.nbytes == 90
    assert pool.put("b", Stub(10)) == []  # replacing an entry replaces its bytes
    assert pool.nbytes == 60 and pool.keys() == ["d", "b"]
    taken = pool.take("d")
    assert taken == Stub(50) and pool.nbytes == 10 and "d" not in pool and len(pool) == 1
    assert pool.take("d") is None and pool.nbytes == 10
    assert [k for k, _ in pool.put("huge", Stub(101))] == ["b", "huge"]
    assert len(pool) == 0 and pool.nbytes == 0 and pool.num_evicted == 4


def test_session_pool_with_zero_budget_keeps_nothing() -> None:
    pool: SessionPool[Stub] = SessionPool(budget_bytes=0)
    assert [k for k, _ in pool.put("a", Stub(1))] == ["a"]
    assert pool.put("z", Stub(0)) == []
    assert pool.keys() == ["z"] and pool.nbytes == 0
