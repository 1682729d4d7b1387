"""The families' tiny models with quantized layers (tests/tiny_families.py) on the CPU's
fastest path: all layers of a step in one C call (engine/ops/native_layers.py, layers.c) give
the bits of the family's layer op by op, and a batch of 16 gives each prompt its bits alone.
Qwen 3's shape is the one here the C call had not seen: a q wider than the embedding and
each head's q and k normed before rope; and Qwen 3's mixture of experts, whose FFN is the
experts' kernel (engine/ops/csrc/moe.c) inside the same call; and gpt-oss (its output bias,
sinks, sliding windows and biased experts)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from engine.model import Model
from engine.ops import native
from engine.ops.kernels import SMALL_ROWS
from engine.ops.quant.experts import ExpertMatrix, InPlaceRows
from tests.batch_invariance import check, compositions
from tests.native_checks import assert_one_call_equals_per_op, long_chunks_in_one_call, recorded
from tests.tiny_families import write_tiny
from tests.tiny_gpt_oss import write_tiny_gpt_oss

pytestmark = pytest.mark.skipif(native.library() is None, reason="needs the C kernels")


@pytest.fixture(scope="module", params=["qwen3", "qwen3moe", "gpt-oss"])
def model(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Model:
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "gpt-oss":  # MXFP4 experts, F32 attention: all read in place
        gpt_oss = Model.load(write_tiny_gpt_oss(folder / "gpt-oss.gguf"), device="cpu")
        layer = gpt_oss.weights.layers[0]
        assert layer.moe is not None and layer.moe.native is not None and layer.window > 0
        assert layer.bo is not None and layer.sinks is not None
        assert gpt_oss.weights.layers[1].window == 0
        return gpt_oss
    q8 = gguf.GGMLQuantizationType.Q8_0
    path = write_tiny(folder / "q8.gguf", request.param, matrix_type=q8)
    loaded = Model.load(path, device="cpu", weights="quantized")
    c, layer = loaded.config, loaded.weights.layers[0]
    assert c.q_dim == 2 * c.dim and layer.q_norm is not None and layer.k_norm is not None
    if request.param == "qwen3moe":  # the experts in the file's Q8_0 blocks, in the kernels
        assert layer.moe is not None and layer.moe.native is not None
        assert layer.moe.gate.qtype == q8 and layer.w_gate_up is None
        # and its attention matrices, read in place by the same kernels
        assert isinstance(layer.wqkv, InPlaceRows) and isinstance(layer.wo, ExpertMatrix)
    return loaded


def test_one_call_equals_the_per_op_loop(model: Model, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_one_call_equals_per_op(model, monkeypatch)


def test_sixteen_prompts_in_one_batch_equal_each_alone(
    model: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(11)
    sizes, vocab = rng.integers(2, 40, size=16), model.config.vocab_size
    prompts = [[int(t) for t in rng.integers(0, vocab, size=int(n))] for n in sizes]
    taken = recorded(monkeypatch)
    cases = compositions(16, [16, 7, 16], [0, 5, SMALL_ROWS + 8])
    assert check(model, prompts, cases) == sum(len(c.order) + (c.prefill > 0) for c in cases)
    # the steps with a chunk past SMALL_ROWS go op by op where the call does not take them
    assert taken and (all(taken) if long_chunks_in_one_call(model) else any(taken))
