"""The head size comes from the file (attention.key_length, as llama.cpp reads it) and
need not divide the embedding: Qwen 3 0.6B has 16 heads of 128 on a 1024-wide model.
Sizes the engine cannot run (values or rope of another size) are refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from common.errors import UnsupportedModelError
from engine.model import Model
from engine.models.families import family_for
from engine.text.model_config import ModelConfig
from tests.tiny_gguf import write_tiny_llama


def metadata(keys: dict[str, int] | None = None, arch: str = "qwen3") -> dict[str, Any]:
    base = {
        "block_count": 2,
        "embedding_length": 1024,
        "feed_forward_length": 3072,
        "attention.head_count": 16,
        "attention.head_count_kv": 8,
        "context_length": 4096,
        "vocab_size": 151936,
    }
    meta: dict[str, Any] = {f"{arch}.{k}": v for k, v in {**base, **(keys or {})}.items()}
    return {"general.architecture": arch, **meta}


def test_key_length_sets_the_head_size_whatever_the_width() -> None:
    config = ModelConfig.from_metadata(
        metadata({"attention.key_length": 128, "attention.value_length": 128})
    )
    assert (config.head_dim, config.q_dim, config.kv_dim) == (128, 2048, 1024)
    qwen3 = family_for(config.architecture).tensors
    assert qwen3.qk_norm and not qwen3.rope_in_pairs
    assert ModelConfig.from_metadata(metadata()).head_dim == 64  # dim / heads without it
    llama = ModelConfig.from_metadata(metadata({"rope.dimension_count": 64}, "llama"))
    assert llama.head_dim == 64
    tensors = family_for(llama.architecture).tensors
    assert not tensors.qk_norm and tensors.rope_in_pairs


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"attention.key_length": 128, "attention.value_length": 64}, "value_length=64"),
        ({"attention.key_length": 128, "rope.dimension_count": 64}, "dimension_count=64"),
        ({"attention.head_count": 24}, "not a multiple of head_count 24"),
        ({"attention.key_length": 127}, "head_dim 127 is not a positive even number"),
    ],
)
def test_sizes_it_cannot_run_are_refused_by_name(keys: dict[str, int], message: str) -> None:
    with pytest.raises(UnsupportedModelError, match=message):
        ModelConfig.from_metadata(metadata(keys))


def test_a_qwen3_file_without_its_norms_names_the_missing_tensor(tmp_path: Path) -> None:
    path = write_tiny_llama(tmp_path / "m.gguf", arch="qwen3")
    with pytest.raises(UnsupportedModelError, match=r"blk\.0\.attn_q_norm\.weight is missing"):
        Model.load(path, device="cpu")
    norms: dict[str, str | float | np.ndarray] = {
        f"blk.{i}.attn_{x}_norm.weight": np.ones(16, dtype=np.float32)
        for i in range(2)
        for x in "qk"
    }
    with_norms = write_tiny_llama(tmp_path / "n.gguf", arch="qwen3", extras=norms)
    k_norm = Model.load(with_norms, device="cpu").weights.layers[1].k_norm
    assert k_norm is not None and k_norm.shape == (16,)
