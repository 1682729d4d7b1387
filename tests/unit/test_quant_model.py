"""A model loaded with --weights quantized against the same file expanded to float32:
the same logits up to summation order, fewer bytes, and clear answers where a type has
no kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from common.errors import InvalidRequestError, UnsupportedModelError
from engine.model import Model
from engine.ops.kernels import SMALL_ROWS
from engine.ops.quant.matrix import QuantMatrix
from tests.paged import new_kv, run_segments
from tests.tiny_gguf import write_tiny_llama

T = gguf.GGMLQuantizationType
REPO = Path(__file__).resolve().parents[2]
PROMPT = [(37 * i + 5) % 250 for i in range(40)]  # 40 > SMALL_ROWS: one chunk goes to BLAS


def logits(model: Model, chunk: int) -> np.ndarray:
    """Logits after each chunk of PROMPT (so both kernel rows and BLAS rows are used)."""
    kv = new_kv(model)
    rows = [run_segments(model, [(kv, PROMPT[i : i + chunk])])[0]
            for i in range(0, len(PROMPT), chunk)]  # fmt: skip
    return np.stack(rows)


@pytest.mark.parametrize(
    "qtype", [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F16, T.BF16], ids=lambda t: t.name
)
def test_quantized_model_equals_its_float32_expansion(tmp_path: Path, qtype: T) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", matrix_type=qtype, dim=64, ffn_dim=128)
    # float32 KV: float16's rounding of two slightly different values can differ by a step
    quantized = Model.load(path, device="cpu", weights="quantized", kv_dtype="float32")
    expanded = Model.load(path, device="cpu", weights="float32", kv_dtype="float32")
    assert quantized.weights_mode == "quantized" and expanded.weights_mode == "float32"
    layer = quantized.weights.layers[0]
    assert all(isinstance(m, QuantMatrix) for m in (layer.wqkv, layer.wo, layer.w_down))
    assert layer.wqkv.source == qtype.name
    assert quantized.weight_bytes < expanded.weight_bytes
    assert len(PROMPT) > SMALL_ROWS
    for chunk in (1, 4, len(PROMPT)):
        np.testing.assert_allclose(logits(quantized, chunk), logits(expanded, chunk),
                                   rtol=1e-4, atol=1e-4)  # fmt: skip


def test_auto_picks_quantized_on_the_cpu(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", matrix_type=T.Q4_1)
    assert Model.load(path, device="cpu").weights_mode == "quantized"
    assert Model.load(path, device="cpu", dtype="float16").weights_mode == "float16"


def test_a_type_without_kernel_is_named_or_expanded(tmp_path: Path) -> None:
    # ternary weights: no kernel here (rows of 256 weights: TQ2_0's block)
    path = write_tiny_llama(tmp_path / "m.gguf", matrix_type=T.TQ2_0, dim=256, ffn_dim=256)
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.attn_q\.weight \(TQ2_0\)"):
        Model.load(path, device="cpu", weights="quantized")
    fallback = Model.load(path, device="cpu", weights="auto")
    assert fallback.weights_mode == "float32"
    assert not isinstance(fallback.weights.layers[0].wqkv, QuantMatrix)


def test_quantized_with_float16_compute_is_refused(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", matrix_type=T.Q8_0)
    with pytest.raises(UnsupportedModelError, match="float32"):
        Model.load(path, device="cpu", dtype="float16", weights="quantized")
    with pytest.raises(InvalidRequestError, match="weights"):
        Model.load(path, device="cpu", weights="int4")


def test_f32_matrices_stay_float32_arrays(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf")  # every tensor F32
    model = Model.load(path, device="cpu", weights="quantized")
    assert model.weights_mode == "quantized"
    assert isinstance(model.weights.layers[0].wqkv, np.ndarray)
    assert model.weight_bytes == Model.load(path, device="cpu", weights="float32").weight_bytes


def generate_json(path: Path, kernels: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WARMFLEET_KERNELS": kernels}
    argv = [sys.executable, "-m", "warmfleet.cli", "generate", "--model", str(path), "--device",
            "cpu", "--prompt", "the cat", "--max-tokens", "12", "--json"]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_the_numba_fallback_generates_what_the_c_kernels_do(tmp_path: Path) -> None:
    """The whole engine without the C kernels (WARMFLEET_KERNELS=numba, as where no
    compiler is found): the same greedy tokens and the same weights in memory."""
    path = write_tiny_llama(tmp_path / "m.gguf", matrix_type=T.Q4_1)
    fallback, compiled = generate_json(path, "numba"), generate_json(path, "")
    assert fallback["weights"] == compiled["weights"] == "quantized"
    assert fallback["weight_bytes"] == compiled["weight_bytes"]
    assert fallback["token_ids"] == compiled["token_ids"] and len(compiled["token_ids"]) == 12  # type: ignore[arg-type]
