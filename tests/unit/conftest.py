"""Tiny random-weight GGUF models, written once per test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model import Model
from tests.tiny_gguf import write_tiny_llama


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def tiny_model(tiny_path: Path) -> Model:
    return Model.load(tiny_path, device="cpu")
