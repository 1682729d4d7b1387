"""bench.resume_bound's count of a turn's work: the keys its rows attend to and the
floating-point operations of its products and attention, against sums done by hand."""

from __future__ import annotations

from bench.resume_bound import Work
from engine.text.model_config import ModelConfig

# SmolLM2-135M's shape (the default model)
SMOL = ModelConfig("llama", 30, 576, 1536, 9, 3, 64, 1e-5, 100000.0, 8192, 49152)


def test_keys_count_each_row_at_its_own_position() -> None:
    assert Work(3, 10).keys == 10 + 11 + 12
    assert Work(1, 1).keys == 1
    assert Work(1955, 1).keys == sum(range(1, 1956))  # a prompt from nothing


def test_the_default_models_work_per_row() -> None:
    w = Work(17, 1959)
    weights_per_layer = 576 * 576 + 2 * 576 * 192 + 576 * 576 + 3 * 576 * 1536
    assert weights_per_layer == 3_538_944
    head = 2 * 49152 * 576  # the output head, for the turn's one sampled row
    assert w.products(SMOL) == 2 * 17 * 30 * weights_per_layer + head
    keys = sum(range(1959, 1959 + 17))
    assert w.attention(SMOL) == 4 * keys * 30 * 9 * 64
    # the ratio the benchmark reports for the KV tiers conversation: about 92x
    recompute = Work(1955, 1)
    ratio = (recompute.products(SMOL) + recompute.attention(SMOL)) / (
        w.products(SMOL) + w.attention(SMOL)
    )
    assert 91 < ratio < 93
