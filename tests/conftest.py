"""Shared fixtures: the real default model (fetched once, loaded once per test session)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.model import Model
from warmfleet.models import pull_default_model

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    return pull_default_model()


@pytest.fixture(scope="session")
def model(default_model_path: Path) -> Model:
    return Model.load(default_model_path, device="cpu")
