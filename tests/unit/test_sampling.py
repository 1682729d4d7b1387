"""SamplingParams validation and the sampler's behaviour on crafted logits."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from common.errors import InvalidRequestError
from common.sampling import SEED_LIMIT, SamplingParams
from engine.sampling import make_rng, sample, top_k_ids

LOGITS = np.array([0.5, 2.0, -1.0, 1.0, 0.0, 1.5], dtype=np.float32)
ORDER = [1, 5, 3, 0, 4, 2]  # ids by decreasing logit


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", -1.0),
        ("temperature", math.nan),
        ("temperature", math.inf),
        ("temperature", -math.inf),
        ("top_k", -1),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", -0.5),
        ("top_p", math.nan),
        ("min_p", -0.1),
        ("min_p", 1.1),
        ("min_p", math.nan),
        ("max_tokens", 0),
        ("max_tokens", -1),
        ("seed", -1),
        ("seed", SEED_LIMIT),
        ("stop", ("",)),
        ("stop", ("ok", "")),
        ("stop", ("x" * 257,)),
        ("stop", tuple(str(i) for i in range(17))),
    ],
)
def test_invalid_field_is_named(field: str, value: Any) -> None:
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(**{field: value})
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"temperature": 0.0},
        {"temperature": 100.0},
        {"top_k": 0},
        {"top_p": 1.0},
        {"top_p": 1e-9},
        {"min_p": 0.0},
        {"min_p": 1.0},
        {"max_tokens": 1},
        {"seed": 0},
        {"seed": SEED_LIMIT - 1},
        {"stop": ("x" * 256,)},
        {"stop": tuple("abcdefghijklmnop")},
    ],
)
def test_boundary_values_are_accepted(kwargs: dict[str, Any]) -> None:
    params = SamplingParams(**kwargs)
    for name, value in kwargs.items():
        assert getattr(params, name) == value


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def frequencies(params: SamplingParams, logits: np.ndarray, draws: int, seed: int) -> np.ndarray:
    rng = np.random.Generator(np.random.PCG64(seed))
    counts = np.bincount([sample(logits, params, rng) for _ in range(draws)], minlength=len(logits))
    return counts.astype(np.float64)


def chi_square(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson's statistic over the tokens with nonzero expected probability; tokens with zero
    probability must not be drawn at all."""
    assert counts[probs == 0].sum() == 0
    expected = probs * counts.sum()
    keep = probs > 0
    return float((((counts - expected) ** 2)[keep] / expected[keep]).sum())


def test_greedy_is_argmax_and_draws_nothing() -> None:
    rng, _ = make_rng(1)
    state = rng.bit_generator.state
    for _ in range(5):
        assert sample(LOGITS, SamplingParams(), rng) == 1
    assert rng.bit_generator.state == state
    ties = np.array([0.0, 3.0, 1.0, 3.0], dtype=np.float32)
    assert sample(ties, SamplingParams(), rng) == 1  # lowest id among equal maxima


def test_top_k_one_is_argmax_even_when_hot() -> None:
    rng, _ = make_rng(2)
    params = SamplingParams(temperature=50.0, top_k=1)
    assert {sample(LOGITS, params, rng) for _ in range(300)} == {1}
    ties = np.array([0.0, 3.0, 1.0, 3.0], dtype=np.float32)
    assert {sample(ties, params, rng) for _ in range(100)} == {1}


def test_small_top_p_keeps_only_the_top_token() -> None:
    rng, _ = make_rng(3)
    params = SamplingParams(temperature=5.0, top_p=0.01)
    assert {sample(LOGITS, params, rng) for _ in range(300)} == {1}


def test_min_p_filters_relative_to_the_best() -> None:
    # at temperature 1, p/p_max = exp(logit - 2): ids 1 (1.0), 5 (0.61), 3 (0.37), 0 (0.22)...
    params = SamplingParams(temperature=1.0, min_p=0.3)
    counts = frequencies(params, LOGITS, 6000, seed=4)
    probs = softmax(LOGITS.astype(np.float64))
    probs[[0, 2, 4]] = 0.0
    probs /= probs.sum()
    assert chi_square(counts, probs) < 20.0  # 2 degrees of freedom
    only_best = SamplingParams(temperature=1.0, min_p=1.0)
    rng, _ = make_rng(4)
    assert {sample(LOGITS, only_best, rng) for _ in range(200)} == {1}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    probs = softmax(LOGITS.astype(np.float64))
    cumulative = np.cumsum(probs[ORDER])  # 0.42, 0.67, 0.83, 0.92, ...
    top_p = float((cumulative[2] + cumulative[3]) / 2)  # needs the 4 best tokens
    counts = frequencies(SamplingParams(temperature=1.0, top_p=top_p), LOGITS, 6000, seed=5)
    kept = np.zeros_like(probs)
    kept[ORDER[:4]] = probs[ORDER[:4]]
    assert chi_square(counts, kept / kept.sum()) < 25.0  # 3 degrees of freedom


def test_top_k_renormalises_over_the_k_best() -> None:
    counts = frequencies(SamplingParams(temperature=1.0, top_k=3), LOGITS, 6000, seed=6)
    probs = softmax(LOGITS.astype(np.float64))
    kept = np.zeros_like(probs)
    kept[ORDER[:3]] = probs[ORDER[:3]]
    assert chi_square(counts, kept / kept.sum()) < 20.0


@pytest.mark.parametrize("temperature", [1.0, 0.5, 2.0])
def test_frequencies_follow_the_tempered_softmax(temperature: float) -> None:
    counts = frequencies(SamplingParams(temperature=temperature), LOGITS, 12000, seed=7)
    probs = softmax(LOGITS.astype(np.float64) / temperature)
    # 5 degrees of freedom: P(chi2 > 30) is about 1.5e-5, and the seed is fixed anyway
    assert chi_square(counts, probs) < 30.0
    # a wrong temperature (or none) would be far off
    wrong = softmax(LOGITS.astype(np.float64) / (temperature * 1.5))
    assert chi_square(counts, wrong) > 100.0


def test_far_tail_is_never_drawn() -> None:
    logits = np.array([10.0, 9.0, -50.0, -np.inf], dtype=np.float32)
    counts = frequencies(SamplingParams(temperature=1.0), logits, 3000, seed=8)
    assert counts[2] == 0 and counts[3] == 0
    assert chi_square(counts, softmax(np.array([10.0, 9.0, -np.inf, -np.inf]))) < 15.0


def test_same_seed_same_draws_and_one_number_per_draw() -> None:
    params = SamplingParams(temperature=1.0, top_k=4, top_p=0.95)
    rng_a, used = make_rng(123)
    assert used == 123
    rng_b, _ = make_rng(123)
    draws_a = [sample(LOGITS, params, rng_a) for _ in range(100)]
    draws_b = [sample(LOGITS, params, rng_b) for _ in range(100)]
    assert draws_a == draws_b
    assert len(set(draws_a)) >= 3
    rng_c, _ = make_rng(124)
    assert [sample(LOGITS, params, rng_c) for _ in range(100)] != draws_a
    # each call consumes exactly one uniform draw, whatever the filters keep
    rng_d, _ = make_rng(9)
    rng_e, _ = make_rng(9)
    sample(LOGITS, SamplingParams(temperature=1.0, top_k=1), rng_d)
    sample(LOGITS, SamplingParams(temperature=0.7, min_p=0.5), rng_d)
    rng_e.random(2)
    assert rng_d.random() == rng_e.random()


def test_unseeded_rng_reports_a_valid_seed() -> None:
    _, used = make_rng(None)
    assert 0 <= used < SEED_LIMIT
    rng_a, _ = make_rng(used)
    rng_b, _ = make_rng(used)
    assert rng_a.random() == rng_b.random()


@pytest.mark.parametrize(
    ("n", "k"), [(7, 1), (7, 5), (1000, 1), (1000, 20), (1000, 999), (151936, 20), (151936, 1000)]
)
@pytest.mark.parametrize("ties", [False, True])
def test_top_k_ids_are_the_k_largest_ties_to_the_lower_id(n: int, k: int, ties: bool) -> None:
    rng = np.random.default_rng(n * k)
    logits = rng.standard_normal(n).astype(np.float32)
    if ties:  # few distinct values: many ties at the k-th
        logits = np.round(logits * 2).astype(np.float32)
    want = np.sort(np.argsort(-logits, kind="stable")[:k])
    np.testing.assert_array_equal(top_k_ids(logits, k), want)


def test_top_k_ids_with_a_nan_still_gives_k_ids() -> None:
    logits = np.arange(4096, dtype=np.float32)
    logits[17] = np.nan
    ids = top_k_ids(logits, 10)
    assert len(ids) == 10 and len(set(ids.tolist())) == 10
