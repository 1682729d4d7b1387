"""The tiny random-weight models, loaded once per test session: the default family's (its
file: tests/conftest.py's tiny_path) and gpt-oss's (sliding windows: tests/tiny_gpt_oss.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model import Model
from tests.tiny_gpt_oss import write_tiny_gpt_oss


@pytest.fixture(scope="session")
def tiny_model(tiny_path: Path) -> Model:
    return Model.load(tiny_path, device="cpu")


@pytest.fixture(scope="session")
def tiny_gpt_oss_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gpt_oss(tmp_path_factory.mktemp("gpt-oss") / "tiny-gpt-oss.gguf")


@pytest.fixture(scope="session")
def tiny_gpt_oss(tiny_gpt_oss_path: Path) -> Model:
    return Model.load(tiny_gpt_oss_path, device="cpu")


@pytest.fixture(scope="session")
def tiny_gpt_oss_mlx(tiny_gpt_oss_path: Path) -> Model:
    return Model.load(tiny_gpt_oss_path, device="mlx")
