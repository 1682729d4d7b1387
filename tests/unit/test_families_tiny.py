"""The Llama 3, Qwen 2 and Qwen 3 paths end to end against llama.cpp: tiny random models of
each family with its real vocabulary (tests/tiny_families.py) and the float32 logits
llama.cpp computed for them (tests/reference/make_family_fixtures.py); and a batch of 16
prompts giving each its bits alone."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from common.sampling import SamplingParams
from engine.engine import Engine
from engine.model import Model
from engine.ops.kernels import SMALL_ROWS
from engine.sequence import Request
from tests import cuda_emu
from tests.batch_invariance import check, compositions
from tests.conftest import FIXTURES
from tests.paged import new_kv, run_segments
from tests.tiny_families import FAMILIES, write_tiny

LOGIT_TOL = 2e-3  # as for the default model against transformers (measured here: ~3e-05)
Reference = dict[str, np.ndarray]


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def reference(family: str) -> Reference:
    z = np.load(FIXTURES / f"tiny_{family}_llamacpp.npz")
    return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory, family: str, reference: Reference) -> Path:
    path = write_tiny(tmp_path_factory.mktemp(family) / f"tiny-{family}.gguf", family)
    # the same bytes llama.cpp ran (a change of NumPy's random streams would show here)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(reference["model_sha256"])
    return path


def logits_one_by_one(model: Model, ids: list[int]) -> np.ndarray:
    """Decode `ids` one token a step: the logits at every position."""
    kv = new_kv(model)
    rows = [run_segments(model, [(kv, ids[i : i + 1])])[0] for i in range(len(ids))]
    kv.release()
    return np.stack(rows)


@pytest.mark.parametrize("device", ["cpu", "mlx", "cuda"])  # cuda: tests/cuda_emu without a GPU
def test_tokens_and_logits_at_every_position_match_llama_cpp(
    family: str, model_file: Path, reference: Reference, device: str
) -> None:
    with cuda_emu.for_device(device):
        model = Model.load(model_file, device=device, kv_dtype="float32")  # llama.cpp's KV
        assert model.config.architecture == FAMILIES[family].arch
        texts = FAMILIES[family].texts
        if device == "cuda" and cuda_emu.emulated():  # ~0.1 s a step: the first text only
            texts = texts[:1]
        for n, text in enumerate(texts):
            ids = reference[f"ids_{n}"].tolist()
            assert model.tokenizer.encode(text) == ids  # BOS where it has one, the markup whole
            cols, expected = reference[f"cols_{n}"], reference[f"logits_{n}"]
            ours = logits_one_by_one(model, ids)
            np.testing.assert_allclose(ours[:, cols], expected, atol=LOGIT_TOL, rtol=0)
            kv = new_kv(model)  # the whole prompt in one prefill: its last position
            last = run_segments(model, [(kv, ids)])[0]
            kv.release()
            np.testing.assert_allclose(last[cols], expected[-1], atol=LOGIT_TOL, rtol=0)


def test_greedy_tokens_match_llama_cpp(family: str, model_file: Path, reference: Reference) -> None:
    model = Model.load(model_file)
    texts = FAMILIES[family].texts
    requests = [
        Request(f"r{n}", reference[f"ids_{n}"].tolist(), SamplingParams(max_tokens=8))
        for n in range(len(texts))
    ]
    outputs = Engine(model).generate(requests)  # all of them in one batch
    for n in range(len(texts)):
        got = [t for out in outputs[f"r{n}"] for t in out.token_ids]
        assert got == reference[f"greedy_{n}"].tolist(), n


def test_sixteen_prompts_in_one_batch_equal_each_alone(family: str, model_file: Path) -> None:
    model = Model.load(model_file, device="cpu")
    rng = np.random.default_rng(11)
    vocab = model.config.vocab_size
    sizes = rng.integers(2, 40, size=16)
    prompts = [[int(t) for t in rng.integers(0, vocab, size=int(n))] for n in sizes]
    cases = compositions(16, [16, 7, 16], [0, 5, SMALL_ROWS + 8])
    assert check(model, prompts, cases) == sum(len(c.order) + (c.prefill > 0) for c in cases)
