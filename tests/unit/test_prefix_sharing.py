"""Shared prefixes in the paged KV pool, on the tiny model: whole blocks of a prompt that
another sequence of the same scope computed are taken, not computed; tokens are the same
as computing them; scopes never share."""

from __future__ import annotations

from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from tests.unit.engine_driver import GREEDY, drive, prompt, run_alone

SYSTEM = prompt(7, 40)  # two whole blocks of 16 and 8 tokens more


def ask(rid: str, tail_seed: int, scope: str = "t", key: str | None = None) -> Request:
    return Request(rid, SYSTEM + prompt(tail_seed, 5), GREEDY, cache_key=key, scope=scope)


def test_a_second_prompt_takes_the_first_ones_whole_blocks(tiny_model: Model) -> None:
    engine = Engine(tiny_model)
    first = drive(engine, {0: [ask("1", 1)]})["1"]
    assert (first.completion.cached_tokens, first.completion.prefix_tokens) == (0, 0)
    before = engine.stats.num_prefill_tokens
    second = drive(engine, {0: [ask("2", 2)]})["2"]
    assert second.completion.cached_tokens == second.completion.prefix_tokens == 32
    assert engine.stats.num_prefill_tokens - before == len(SYSTEM) + 5 - 32
    assert second.ids == run_alone(tiny_model, ask("cold", 2)).ids
    engine.pool.alloc.check()


def test_scopes_never_share(tiny_model: Model) -> None:
    engine = Engine(tiny_model)
    drive(engine, {0: [ask("1", 1, scope="alice")]})
    other = drive(engine, {0: [ask("2", 2, scope="bob")]})["2"]
    assert other.completion.cached_tokens == 0
    same = drive(engine, {0: [ask("3", 3, scope="alice")]})["3"]
    assert same.completion.prefix_tokens == 32


def test_sessions_of_one_prompt_hold_its_blocks_once(tiny_model: Model) -> None:
    """Eight sessions started together compute the prompt side by side; as their blocks
    fill up they are found to be the same and each is kept once."""
    engine = Engine(tiny_model)
    drive(engine, {0: [ask(str(i), i, key=f"s{i}") for i in range(8)]})
    tables = [kv for _, kv in engine.sessions.items()]
    assert len(tables) == 8
    assert {tuple(kv.blocks[:2]) for kv in tables} == {tuple(tables[0].blocks[:2])}
    # 2 shared blocks, and each session's own third and fourth (40 + 5 + 7 = 52 tokens)
    assert engine.sessions.nbytes == (2 + 8 * 2) * engine.pool.block_bytes
    assert engine.pool.alloc.num_held == 2 + 8 * 2
    later = drive(engine, {0: [ask("9", 9, key="s9")]})["9"]
    assert later.completion.prefix_tokens == 32
    engine.pool.alloc.check()


def test_a_session_own_kv_comes_first_then_the_pool(tiny_model: Model) -> None:
    engine = Engine(tiny_model)
    first = drive(engine, {0: [ask("1", 1, key="s")]})["1"]
    follow = Request("2", [*ask("x", 1).prompt_ids, *first.ids, 5, 6], GREEDY, "s", "t")
    second = drive(engine, {0: [follow]})["2"]
    assert second.completion.cached_tokens == len(SYSTEM) + 5 + 7
    assert second.completion.prefix_tokens == 0
    assert second.ids == run_alone(tiny_model, follow).ids
