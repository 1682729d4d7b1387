"""The tiny random-weight model (its file: tests/conftest.py's tiny_path), loaded once per
test session."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model import Model


@pytest.fixture(scope="session")
def tiny_model(tiny_path: Path) -> Model:
    return Model.load(tiny_path, device="cpu")
