"""The Llama 3 path end to end against llama.cpp: a tiny random model shaped as Llama 3.2
(tests/tiny_llama3.py: Meta's vocabulary and tokenizer, grouped-query attention, tied
output, RoPE frequency factors) and the float32 logits llama.cpp computed for it
(tests/reference/make_llama3_fixture.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest

from common.sampling import SamplingParams
from engine.engine import Engine
from engine.model import Model
from engine.sequence import Request
from tests.conftest import FIXTURES
from tests.paged import new_kv, run_segments
from tests.tiny_llama3 import TEXTS, write_tiny_llama3

LOGIT_TOL = 2e-3  # as for the default model against transformers (measured here: 2.5e-05)


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    z = np.load(FIXTURES / "tiny_llama3_llamacpp.npz")
    return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory, reference: dict[str, np.ndarray]) -> Path:
    path = write_tiny_llama3(tmp_path_factory.mktemp("llama3") / "tiny-llama3.gguf")
    # the same bytes llama.cpp ran (a change of NumPy's random streams would show here)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == str(reference["model_sha256"])
    return path


def logits_one_by_one(model: Model, ids: list[int]) -> np.ndarray:
    """Decode `ids` one token a step: the logits at every position."""
    kv = new_kv(model)
    rows = [run_segments(model, [(kv, ids[i : i + 1])])[0] for i in range(len(ids))]
    kv.release()
    return np.stack(rows)


@pytest.mark.parametrize("device", ["cpu", "mlx"])
def test_tokens_and_logits_at_every_position_match_llama_cpp(
    model_file: Path, reference: dict[str, np.ndarray], device: str
) -> None:
    model = Model.load(model_file, device=device)
    for n, text in enumerate(TEXTS):
        ids = reference[f"ids_{n}"].tolist()
        assert model.tokenizer.encode(text) == ids  # BOS first, the chat markup whole
        cols, expected = reference[f"cols_{n}"], reference[f"logits_{n}"]
        ours = logits_one_by_one(model, ids)
        np.testing.assert_allclose(ours[:, cols], expected, atol=LOGIT_TOL, rtol=0)
        kv = new_kv(model)  # the whole prompt in one prefill: its last position
        last = run_segments(model, [(kv, ids)])[0]
        kv.release()
        np.testing.assert_allclose(last[cols], expected[-1], atol=LOGIT_TOL, rtol=0)


def test_greedy_tokens_match_llama_cpp(model_file: Path, reference: dict[str, np.ndarray]) -> None:
    model = Model.load(model_file)
    requests = [
        Request(f"r{n}", reference[f"ids_{n}"].tolist(), SamplingParams(max_tokens=8))
        for n in range(len(TEXTS))
    ]
    outputs = Engine(model).generate(requests)  # all three in one batch
    for n in range(len(TEXTS)):
        got = [t for out in outputs[f"r{n}"] for t in out.token_ids]
        assert got == reference[f"greedy_{n}"].tolist(), n
