"""Decode graphs in the engine's own steps (engine/graph_steps.py, WARMFLEET_DECODE_GRAPHS=1):
on the CPU a replay runs the step again from the bucket's buffers, so the engine's greedy
tokens must be those of eager steps, the decode steps must have gone through the buckets,
and the prefill steps must not have; a mixture of experts' too. Refused on MLX, with a
message. On CUDA (the CPU stand-in's graphs where no GPU is found) the same, through
CudaCapturer; test_decode_graphs.py checks the default model's on a GPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gguf import GGMLQuantizationType

from common.errors import UnsupportedModelError
from common.sampling import SamplingParams
from engine.decode_graphs import DecodeGraphs
from engine.engine import Engine
from engine.graph_steps import GRAPHS_ENV
from engine.model import Model
from engine.sequence import Request
from tests.tiny_families import write_tiny
from tests.tiny_gguf import write_tiny_llama

PROMPTS = ([1, 2, 3, 4, 5], list(range(7, 40)), list(range(100, 118)))


def greedy(model: Model) -> dict[str, list[int]]:
    requests = [
        Request(f"r{i}", ids, SamplingParams(max_tokens=4 + 3 * i))  # they end apart: buckets
        for i, ids in enumerate(PROMPTS)
    ]
    outputs = Engine(model).generate(requests)
    return {rid: [t for out in outs for t in out.token_ids] for rid, outs in outputs.items()}


def test_the_engines_tokens_are_the_eager_ones_through_the_buckets(
    default_model_path: Path, model_kv_float32: Model, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(GRAPHS_ENV, "1")
    model = Model.load(default_model_path, device="cpu", kv_dtype="float32")
    assert model.graphs is not None and model_kv_float32.graphs is None
    replayed: list[int] = []
    run = DecodeGraphs.run

    def counted(self: DecodeGraphs, tokens: Any, positions: Any, layout: Any) -> Any:
        replayed.append(len(tokens))
        return run(self, tokens, positions, layout)

    monkeypatch.setattr(DecodeGraphs, "run", counted)
    want = greedy(model_kv_float32)
    assert greedy(model) == want
    assert [len(v) for v in want.values()] == [4, 7, 10]
    # every decode step, none of the prefill: 3 rows 3 times, 2 rows 3 times, 1 row 3 times
    assert replayed == [3] * 3 + [2] * 3 + [1] * 3
    ((_, graphs),) = model.graphs.by_pool.values()
    assert sorted(graphs.replays) == [1, 2, 4]  # a capture a bucket


def test_a_mixture_of_experts_gives_its_eager_tokens_and_mlx_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_tiny(tmp_path / "moe.gguf", "qwen3moe")
    graphs_give_the_eager_tokens(path, "cpu", monkeypatch)
    with pytest.raises(UnsupportedModelError, match="decode graphs run on CUDA, not MLX"):
        Model.load(path, device="mlx")
    monkeypatch.setenv(GRAPHS_ENV, "yes")
    with pytest.raises(ValueError, match="WARMFLEET_DECODE_GRAPHS='yes': expected 0 or 1"):
        Model.load(path, device="cpu")


@pytest.mark.usefixtures("cuda_module")
@pytest.mark.parametrize("family", ["llama", "qwen3moe"])
def test_on_cuda_the_graphs_give_the_eager_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, family: str
) -> None:
    """CudaCapturer's capture and replay (on a GPU, or the stand-in's graphs, which refuse a
    read back or a host copy inside the capture as CUDA does)."""
    if family == "llama":
        q8 = GGMLQuantizationType.Q8_0  # head_dim 32: the attention kernel's (a capture's)
        path = write_tiny_llama(tmp_path / "m.gguf", matrix_type=q8, dim=128, ffn_dim=256)
    else:
        path = write_tiny(tmp_path / "moe.gguf", "qwen3moe")
    graphs_give_the_eager_tokens(path, "cuda", monkeypatch)


def graphs_give_the_eager_tokens(path: Path, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With WARMFLEET_DECODE_GRAPHS=1 the greedy tokens are the eager ones, a capture a bucket."""
    want = greedy(Model.load(path, device=device))
    monkeypatch.setenv(GRAPHS_ENV, "1")
    model = Model.load(path, device=device)
    assert model.graphs is not None and greedy(model) == want
    ((_, graphs),) = model.graphs.by_pool.values()
    assert sorted(graphs.replays) == [1, 2, 4]
