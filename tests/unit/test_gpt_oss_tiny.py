"""gpt-oss end to end against llama.cpp: the tiny random model of tests/tiny_gpt_oss.py
(sliding windows and full layers alternating, sinks, biases, YaRN, MXFP4 experts, GPT-4o's
pre-split) and the float32 logits llama.cpp computed for it
(tests/reference/make_family_fixtures.py), on the CPU, MLX and CUDA (where a GPU is); its
tokenizer against llama.cpp's; a batch of 16 prompts giving each its bits alone."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from common.sampling import SamplingParams
from engine.engine import Engine
from engine.model import Model
from engine.ops.kernels import SMALL_ROWS
from engine.ops.quant.experts_native import PRODUCTS_ENV, expert_products
from engine.sequence import Request
from tests import cuda_emu
from tests.batch_invariance import check, compositions
from tests.conftest import FIXTURES
from tests.paged import new_kv, run_segments
from tests.tiny_gpt_oss import TEXTS, TOKENIZER_TEXTS, WINDOW, write_tiny_gpt_oss
from tests.unit.engine_driver import drive, run_alone

LOGIT_TOL = 2e-3  # as for the other families (measured: 6e-06)
# The default products multiply MXFP4 experts in integers, each activation row quantized
# to 8 bits (as llama.cpp's MXFP4 products do): measured within 0.08 of the float32
# reference (logits up to 6.4), where llama.cpp's own MXFP4 path lands within 0.067
INTEGER_TOL = 0.15
Reference = dict[str, np.ndarray]


@pytest.fixture(scope="module")
def reference() -> Reference:
    z = np.load(FIXTURES / "tiny_gpt_oss_llamacpp.npz")
    return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory, reference: Reference) -> Path:
    path = write_tiny_gpt_oss(tmp_path_factory.mktemp("gpt-oss") / "tiny-gpt-oss.gguf")
    # the same bytes llama.cpp's twin was made from (a change of NumPy's random streams
    # would show here)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(reference["model_sha256"])
    return path


@pytest.fixture
def float_products(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The expert products in float32 on the exactly decoded MXFP4 weights."""
    monkeypatch.setenv(PRODUCTS_ENV, "float")
    expert_products.cache_clear()
    yield
    monkeypatch.undo()
    expert_products.cache_clear()


def logits_one_by_one(model: Model, ids: list[int]) -> np.ndarray:
    kv = new_kv(model)
    rows = [run_segments(model, [(kv, ids[i : i + 1])])[0] for i in range(len(ids))]
    kv.release()
    return np.stack(rows)


def compare(model: Model, reference: Reference, tol: float, texts: int = len(TEXTS)) -> None:
    for n in range(texts):
        ids, cols = reference[f"ids_{n}"].tolist(), reference[f"cols_{n}"]
        assert len(ids) > WINDOW  # past the windowed layers' reach
        expected = reference[f"logits_{n}"]
        np.testing.assert_allclose(
            logits_one_by_one(model, ids)[:, cols], expected, atol=tol, rtol=0
        )
        kv = new_kv(model)  # the whole prompt in one prefill: its last position
        last = run_segments(model, [(kv, ids)])[0]
        kv.release()
        np.testing.assert_allclose(last[cols], expected[-1], atol=tol, rtol=0)


def test_tokens_and_the_gpt4o_split_match_llama_cpp(model_file: Path, reference: Reference) -> None:
    model = Model.load(model_file, device="cpu")
    assert model.config.architecture == "gpt-oss"
    for n, text in enumerate(TEXTS):
        assert model.tokenizer.encode(text) == reference[f"ids_{n}"].tolist()
    for n, text in enumerate(TOKENIZER_TEXTS):
        assert model.tokenizer.encode(text) == reference[f"tok_{n}"].tolist(), text


@pytest.mark.parametrize("device", ["cpu", "mlx", "cuda"])  # cuda: tests/cuda_emu without a GPU
def test_float_products_match_llama_cpp_at_every_position(
    model_file: Path, reference: Reference, float_products: None, device: str
) -> None:
    """The CPU's expert products in float32 (MLX's and CUDA's always are: they dequantize
    the MXFP4 blocks, kept as 5- or 8-bit codes, exactly)."""
    with cuda_emu.for_device(device):
        model = Model.load(model_file, device=device, kv_dtype="float32")  # llama.cpp's KV
        assert [lw.window for lw in model.weights.layers] == [WINDOW, 0, WINDOW, 0]
        # the CPU stand-in for CUDA takes ~0.15 s a step: its first text only (past the window)
        stand_in = device == "cuda" and cuda_emu.emulated()
        compare(model, reference, LOGIT_TOL, texts=1 if stand_in else len(TEXTS))


def test_integer_products_stay_near_llama_cpp(model_file: Path, reference: Reference) -> None:
    compare(Model.load(model_file, device="cpu", kv_dtype="float32"), reference, INTEGER_TOL)


def test_greedy_tokens_match_llama_cpp(model_file: Path, reference: Reference) -> None:
    model = Model.load(model_file)
    requests = [
        Request(f"r{n}", reference[f"ids_{n}"].tolist(), SamplingParams(max_tokens=8))
        for n in range(len(TEXTS))
    ]
    outputs = Engine(model).generate(requests)  # all of them in one batch
    for n in range(len(TEXTS)):
        got = [t for out in outputs[f"r{n}"] for t in out.token_ids]
        assert got == reference[f"greedy_{n}"].tolist(), n


def test_sixteen_prompts_in_one_batch_equal_each_alone(model_file: Path) -> None:
    model = Model.load(model_file, device="cpu")
    rng = np.random.default_rng(11)
    sizes = rng.integers(2, 40, size=16)  # across the window
    prompts = [
        [int(t) for t in rng.integers(0, model.config.vocab_size, size=int(n))] for n in sizes
    ]
    cases = compositions(16, [16, 7, 16], [0, 5, SMALL_ROWS + 8])
    assert check(model, prompts, cases) == sum(len(c.order) + (c.prefill > 0) for c in cases)


def test_a_session_past_the_window_resumes_and_an_early_edit_recomputes(model_file: Path) -> None:
    """A session longer than the 16-position window: its next turn resumes from the cache
    with the tokens of a cold run; a prompt that edits an early token takes only the
    common prefix and gives a cold run's tokens too."""
    model = Model.load(model_file, device="cpu")
    engine, greedy = Engine(model), SamplingParams(max_tokens=6)
    rng = np.random.default_rng(5)
    first = [int(t) for t in rng.integers(0, model.config.vocab_size, 60)]
    out = drive(engine, {0: [Request("1", first, greedy, cache_key="s")]})["1"]
    second = [*first, *out.ids, *(int(t) for t in rng.integers(0, 1000, 5))]
    resumed = drive(engine, {0: [Request("2", second, greedy, cache_key="s")]})["2"]
    assert resumed.completion.cached_tokens == len(first) + len(out.ids) - 1 > 3 * WINDOW
    assert resumed.ids == run_alone(model, Request("cold", second, greedy)).ids
    edited = [*second[:3], (second[3] + 1) % 1000, *second[4:]]
    redone = drive(engine, {0: [Request("3", edited, greedy, cache_key="s")]})["3"]
    assert redone.completion.cached_tokens == 3
    assert redone.ids == run_alone(model, Request("cold", edited, greedy)).ids
