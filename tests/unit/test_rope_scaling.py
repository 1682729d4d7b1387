"""RoPE frequency adjustments a GGUF file asks for (engine/loader/rope.py): Llama 3.1's
per-frequency factors, linear position scaling and YaRN, on the CPU and MLX paths; other
scalings refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.errors import UnsupportedModelError
from common.sampling import SamplingParams
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from tests.tiny_gguf import write_tiny_llama

HEAD_DIM = 16  # the tiny model: dim 64, 4 heads
BASE = 10000.0
FACTORS = np.array([1, 1, 1, 2, 4, 8, 8, 8], dtype=np.float32)  # Llama 3.1's shape of ramp


def angles(positions: np.ndarray, divisors: np.ndarray) -> np.ndarray:
    """llama.cpp's rule: position * base^(-2i / head_dim) / divisor[i]."""
    i = np.arange(HEAD_DIM // 2, dtype=np.float64)
    return positions[:, None] * BASE ** (-2 * i / HEAD_DIM) / divisors[None, :]


def greedy(model: Model) -> list[int]:
    request = Request("r", list(range(40, 90)), SamplingParams(max_tokens=8))
    return [t for out in Engine(model).generate([request])["r"] for t in out.token_ids]


def test_frequency_factors_divide_each_frequency(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "f.gguf", extras={"rope_freqs.weight": FACTORS})
    model = Model.load(path, device="cpu")
    p = np.arange(model.config.context_length, dtype=np.float64)
    want = angles(p, FACTORS.astype(np.float64))
    np.testing.assert_allclose(model.rope.cos, np.cos(want), atol=1e-6)
    np.testing.assert_allclose(model.rope.sin, np.sin(want), atol=1e-6)
    plain = Model.load(write_tiny_llama(tmp_path / "p.gguf"), device="cpu")
    assert not np.allclose(model.rope.cos, plain.rope.cos)  # the factors reached the tables
    mlx = Model.load(path, device="mlx")  # the MLX path builds the same tables
    np.testing.assert_array_equal(np.array(mlx.rope.cos), model.rope.cos)


def test_factors_of_one_change_nothing(tmp_path: Path) -> None:
    ones = np.ones(HEAD_DIM // 2, dtype=np.float32)
    with_ones = Model.load(
        write_tiny_llama(tmp_path / "o.gguf", extras={"rope_freqs.weight": ones})
    )
    plain = Model.load(write_tiny_llama(tmp_path / "p.gguf"))
    np.testing.assert_array_equal(with_ones.rope.cos, plain.rope.cos)
    assert greedy(with_ones) == greedy(plain)


def test_linear_scaling_divides_positions(tmp_path: Path) -> None:
    extras: dict[str, str | float | np.ndarray] = {
        "llama.rope.scaling.type": "linear",
        "llama.rope.scaling.factor": 4.0,
    }
    model = Model.load(write_tiny_llama(tmp_path / "l.gguf", extras=extras), device="cpu")
    plain = Model.load(write_tiny_llama(tmp_path / "p.gguf"), device="cpu")
    # position 4k scaled is position k unscaled
    np.testing.assert_allclose(model.rope.cos[8::4][:10], plain.rope.cos[2:12], atol=1e-6)


def test_yarn_blends_extrapolated_and_interpolated_frequencies(tmp_path: Path) -> None:
    """gpt-oss's YaRN (factor 32 over 4,096 positions; here over 64 so that the tiny head's
    8 frequencies span the blend): llama.cpp's correction range, the fast frequencies kept,
    the slow ones divided by the factor, a linear blend between, and cos and sin scaled by
    1 + 0.1 ln factor."""
    extras: dict[str, str | float | np.ndarray] = {
        "llama.rope.scaling.type": "yarn",
        "llama.rope.scaling.factor": 32.0,
        "llama.rope.scaling.original_context_length": 64.0,
    }
    model = Model.load(write_tiny_llama(tmp_path / "y.gguf", extras=extras), device="cpu")
    # corr dims: 16 ln(64 / (2 pi beta)) / (2 ln 10000) for beta 32 and 1: 0 (floored), 2.02
    # (ceiled to 3): ramp 1, 2/3, 1/3, then 0
    mix = np.array([1, 2 / 3, 1 / 3, 0, 0, 0, 0, 0], dtype=np.float64)
    divisors = 1 / (mix + (1 - mix) / 32)
    magnitude = 1 + 0.1 * np.log(32)
    want = angles(np.arange(model.config.context_length, dtype=np.float64), divisors)
    np.testing.assert_allclose(model.rope.cos, magnitude * np.cos(want), atol=2e-6)
    np.testing.assert_allclose(model.rope.sin, magnitude * np.sin(want), atol=2e-6)
    mlx = Model.load(write_tiny_llama(tmp_path / "y.gguf", extras=extras), device="mlx")
    np.testing.assert_array_equal(np.array(mlx.rope.sin), model.rope.sin)


@pytest.mark.parametrize(
    ("extras", "message"),
    [
        ({"llama.rope.scaling.type": "longrope"}, r"type='longrope' is not supported"),
        (
            {
                "llama.rope.scaling.type": "yarn",
                "llama.rope.scaling.factor": 4.0,
                "llama.rope.scaling.yarn_log_multiplier": 0.1,
            },
            r"yarn_log_multiplier is not supported",
        ),
        ({"rope_freqs.weight": np.ones(5, dtype=np.float32)}, r"must hold 8 positive factors"),
        ({"rope_freqs.weight": np.zeros(8, dtype=np.float32)}, r"must hold 8 positive factors"),
    ],
)
def test_scalings_it_cannot_do_are_refused_by_name(
    tmp_path: Path, extras: dict[str, str | float | np.ndarray], message: str
) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        Model.load(write_tiny_llama(tmp_path / "x.gguf", extras=extras), device="cpu")
