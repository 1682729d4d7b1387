"""What a model family says is what the engine does: a file of an architecture no family runs
is refused by name, each family's extra tensors are read where its layer has them and a
file holding one its layer has not is refused (left out, it would make the output wrong), and
no architecture belongs to two families."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.errors import UnsupportedModelError
from engine.model import Model
from engine.models.families import FAMILIES, family_for
from tests.tiny_gguf import write_tiny_llama

DIM, KV_DIM, HEAD_DIM = 64, 32, 16  # write_tiny_llama's default shape: 4 heads, 2 KV heads


def biases() -> dict[str, str | float | np.ndarray]:
    rng = np.random.default_rng(1)
    return {
        f"blk.{i}.attn_{x}.bias": rng.standard_normal(n).astype(np.float32)
        for i in range(2)
        for x, n in (("q", DIM), ("k", KV_DIM), ("v", KV_DIM))
    }


def norms() -> dict[str, str | float | np.ndarray]:
    return {
        f"blk.{i}.attn_{x}_norm.weight": np.ones(HEAD_DIM, dtype=np.float32)
        for i in range(2)
        for x in "qk"
    }


def test_each_architecture_has_one_family() -> None:
    names = [a for f in FAMILIES for a in f.architectures]
    assert len(names) == len(set(names)) and {"llama", "qwen2", "qwen3"} <= set(names)
    assert all(
        family_for(a).architectures == f.architectures for f in FAMILIES for a in f.architectures
    )


def test_an_architecture_no_family_runs_is_refused_by_name() -> None:
    with pytest.raises(UnsupportedModelError, match=r"'gpt2' is not supported.*qwen3"):
        family_for("gpt2")


@pytest.mark.parametrize(
    ("arch", "extras", "has"),
    [
        ("llama", None, (False, False)),
        ("qwen2", biases(), (True, False)),
        ("qwen3", norms(), (False, True)),
    ],
)
def test_a_family_s_extra_tensors_are_loaded_for_its_layer(
    tmp_path: Path,
    arch: str,
    extras: dict[str, str | float | np.ndarray] | None,
    has: tuple[bool, bool],
) -> None:
    model = Model.load(
        write_tiny_llama(tmp_path / "m.gguf", arch=arch, extras=extras), device="cpu"
    )
    layer = model.weights.layers[1]
    assert (layer.bqkv is not None, layer.q_norm is not None) == has
    assert model.family is family_for(arch)


@pytest.mark.parametrize(
    ("arch", "extras", "message"),
    [
        ("llama", biases(), r"blk\.0\.attn_q\.bias: the llama layer has no such tensor"),
        ("qwen2", norms(), r"blk\.0\.attn_q_norm\.weight: the qwen2 layer has no such tensor"),
        ("qwen2", None, r"tensor blk\.0\.attn_q\.bias is missing"),
    ],
)
def test_tensors_a_family_s_layer_has_not_or_lacks_are_refused(
    tmp_path: Path, arch: str, extras: dict[str, str | float | np.ndarray] | None, message: str
) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", arch=arch, extras=extras)
    with pytest.raises(UnsupportedModelError, match=message):
        Model.load(path, device="cpu")
