"""A sequence's logits are bit for bit the same whatever else runs in the step: alone, with
up to 31 other decode rows, in any row position, beside a short prefill chunk (the kernel's
rows) or a long one (BLAS), on the tiny models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from engine.model import Model
from engine.ops.kernels import SMALL_ROWS, plan_rows
from tests.batch_invariance import check, compositions
from tests.tiny_gguf import VOCAB_SIZE, write_tiny_llama

VARIANTS: dict[str, dict[str, Any]] = {
    "f32-untied": {},
    "q8-tied": {"matrix_type": gguf.GGMLQuantizationType.Q8_0, "tie_embeddings": True},
    "f32-mha-3layers": {"num_layers": 3, "num_kv_heads": 4, "rope_base": 500.0, "seed": 3},
    # widths that are not multiples of 8: the kernel's one-row tail tasks
    "f32-odd-widths": {"dim": 40, "num_heads": 4, "num_kv_heads": 2, "ffn_dim": 50, "seed": 5},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_every_row_equals_its_run_alone(variant: str, tmp_path: Path) -> None:
    model = Model.load(write_tiny_llama(tmp_path / "m.gguf", **VARIANTS[variant]), device="cpu")
    rng = np.random.default_rng(11)
    prompts = [
        [int(t) for t in rng.integers(3, VOCAB_SIZE, size=int(rng.integers(2, 40)))]
        for _ in range(32)
    ]
    cases = compositions(32, list(range(1, 33)), [0, 5, SMALL_ROWS + 8])
    assert check(model, prompts, cases) == sum(len(c.order) + (c.prefill > 0) for c in cases)


def test_plan_rows_sends_only_long_chunks_to_blas() -> None:
    assert plan_rows([1, 1, 1]) == ((0, 3, True),)
    assert plan_rows([1, 1, SMALL_ROWS]) == ((0, SMALL_ROWS + 2, True),)
    assert plan_rows([1, 40, 1, 33, 2]) == (
        (0, 1, True), (1, 41, False), (41, 42, True), (42, 75, False), (75, 77, True),
    )  # fmt: skip
    assert plan_rows([]) == ()
