"""Steps of a mixture-of-experts model with its matrices quantized (the vocabulary matrix
then read in place by the expert kernels): a prompt prefilled in chunks, whose first chunks
want no logits, gives the logits of the prompt in one step."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.model import Model
from engine.ops.quant.experts import ExpertMatrix
from engine.ops.quant.experts_native import load
from tests.paged import new_kv, run_segments, run_step
from tests.tiny_families import write_tiny

pytestmark = pytest.mark.skipif(load() is None, reason="needs the C kernels")


def test_chunks_wanting_no_logits_then_the_last_give_the_whole_prompts_logits(
    tmp_path: Path,
) -> None:
    path = write_tiny(tmp_path / "moe.gguf", "qwen3moe", matrix_type=gguf.GGMLQuantizationType.Q8_0)
    model = Model.load(path, device="cpu")
    assert isinstance(model.weights.output, ExpertMatrix)
    ids = [int(t) for t in np.random.default_rng(5).integers(0, model.config.vocab_size, 40)]
    whole = new_kv(model)
    expected = run_segments(model, [(whole, ids)])[0]
    kv = new_kv(model)
    for start in (0, 16):  # two chunks of 16 that want no logits: zero rows to the output
        none = run_step(model, [(kv, ids[start : start + 16], False)])
        assert none.shape == (0, model.config.vocab_size)
    last = run_segments(model, [(kv, ids[32:])])[0]
    np.testing.assert_array_equal(last, expected)
