"""The layers in one C call (engine/ops/native_layers.py) give the bits of the family's layer
run op by op: the same logits and the same keys and values in the pool, for decode rows, a short
chunk and a long one in one step, on tiny quantized models whose shapes it takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from engine.model import Model
from engine.ops import native
from engine.ops.native_layers import native_layers
from tests.native_checks import assert_one_call_equals_per_op
from tests.paged import new_kv, step
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.skipif(native.library() is None, reason="needs the C kernels")
Q = gguf.GGMLQuantizationType
# head_dim 32: the smallest whose rope halves fill a 16-lane vector
SHAPE: dict[str, Any] = {"dim": 256, "num_heads": 8, "num_kv_heads": 2, "ffn_dim": 256}


def qwen_biases(layers: int = 2) -> dict[str, str | float | np.ndarray]:
    """q, k and v biases for SHAPE's layers, as a qwen2 file holds them."""
    rng, q, kv = np.random.default_rng(5), SHAPE["dim"], 2 * 32
    return {f"blk.{i}.attn_{x}.bias": rng.standard_normal(n).astype(np.float32)
            for i in range(layers) for x, n in (("q", q), ("k", kv), ("v", kv))}  # fmt: skip


@pytest.mark.parametrize(
    ("matrix_type", "arch"),
    [(Q.Q8_0, "llama"), (Q.Q4_0, "llama"), (Q.Q4_1, "llama"), (Q.Q8_0, "qwen2")],
    ids=["Q8_0", "Q4_0", "Q4_1", "Q8_0-qwen2-biases"],
)
def test_one_call_equals_the_per_op_loop(
    matrix_type: Q, arch: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    extras = qwen_biases() if arch == "qwen2" else None
    path = write_tiny_llama(tmp_path / "m.gguf", matrix_type=matrix_type, seed=4, arch=arch,
                            extras=extras, **SHAPE)  # fmt: skip
    model = Model.load(path, device="cpu", weights="quantized")
    assert (model.weights.layers[0].bqkv is not None) == (arch == "qwen2")
    assert_one_call_equals_per_op(model, monkeypatch, lowest_id=3)


def test_shapes_it_cannot_take_stay_on_the_per_op_loop(tmp_path: Path) -> None:
    head16 = write_tiny_llama(tmp_path / "h16.gguf", matrix_type=Q.Q8_0)  # head_dim 16
    f32 = write_tiny_llama(tmp_path / "f32.gguf", **SHAPE)
    for path, weights in ((head16, "quantized"), (f32, "float32")):
        model = Model.load(path, device="cpu", weights=weights)
        assert native_layers(model.weights, model.config) is None
        logits = step(model, [(new_kv(model), [3, 4, 5])])
        assert logits.shape == (1, model.config.vocab_size) and np.isfinite(logits).all()
        assert model.weights.native is False
