"""The families' tiny models with quantized layers (tests/tiny_families.py) on the CPU's
fastest path: all layers of a step in one C call (engine/ops/native_layers.py, layers.c) give
the bits of the family's layer op by op, and a batch of 16 gives each prompt its bits alone.
Qwen 3's shape is the one here the C call had not seen: a q wider than the embedding and
each head's q and k normed before rope."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gguf
import numpy as np
import pytest

from engine.model import Model
from engine.ops import native
from engine.ops.kernels import SMALL_ROWS
from engine.ops.native_layers import NativeLayers, native_layers
from tests.batch_invariance import check, compositions
from tests.paged import new_kv, pool_of, run_segments, step
from tests.tiny_families import write_tiny

pytestmark = pytest.mark.skipif(native.library() is None, reason="needs the C kernels")


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Model:
    folder = tmp_path_factory.mktemp("qwen3")
    path = write_tiny(folder / "q8.gguf", "qwen3", matrix_type=gguf.GGMLQuantizationType.Q8_0)
    loaded = Model.load(path, device="cpu", weights="quantized")
    c, layer = loaded.config, loaded.weights.layers[0]
    assert c.q_dim == 2 * c.dim and layer.q_norm is not None and layer.k_norm is not None
    return loaded


def recorded(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Whether each step from now takes the one-call path."""
    taken: list[bool] = []
    run: Callable[..., bool] = NativeLayers.run

    def spy(*args: Any) -> bool:
        taken.append(run(*args))
        return taken[-1]

    monkeypatch.setattr(NativeLayers, "run", spy)
    return taken


def test_one_call_equals_the_per_op_loop(model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(native_layers(model.weights, model.config), NativeLayers)
    rng = np.random.default_rng(2)
    vocab = model.config.vocab_size
    kvs = [new_kv(model) for _ in range(3)]
    for kv in kvs:  # sequences with 20-50 positions already held
        run_segments(model, [(kv, [int(t) for t in rng.integers(0, vocab, size=20)])])
    run_segments(model, [(kvs[0], [int(t) for t in rng.integers(0, vocab, size=30)])])
    long_chunk = [int(t) for t in rng.integers(0, vocab, size=45)]
    parts = [(kvs[0], [7]), (new_kv(model), long_chunk), (kvs[1], [9, 11, 13]), (kvs[2], [5])]
    pool = pool_of(model)
    before = pool.k.copy(), pool.v.copy()

    model.weights.native = False  # the per-op loop
    per_op = step(model, parts)
    written = pool.k.copy(), pool.v.copy()
    pool.k[...], pool.v[...] = before
    model.weights.native = None  # one call, built again
    taken = recorded(monkeypatch)
    one_call = step(model, parts)

    assert taken == [True], "the step did not take the one-call path"
    assert np.array_equal(per_op, one_call), np.abs(per_op - one_call).max()
    assert np.array_equal(written[0], pool.k) and np.array_equal(written[1], pool.v)
    assert not np.array_equal(before[0], pool.k)  # the step did write its keys


def test_sixteen_prompts_in_one_batch_equal_each_alone(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(11)
    sizes, vocab = rng.integers(2, 40, size=16), model.config.vocab_size
    prompts = [[int(t) for t in rng.integers(0, vocab, size=int(n))] for n in sizes]
    taken = recorded(monkeypatch)
    cases = compositions(16, [16, 7, 16], [0, 5, SMALL_ROWS + 8])
    assert check(model, prompts, cases) == sum(len(c.order) + (c.prefill > 0) for c in cases)
    assert taken and all(taken)
