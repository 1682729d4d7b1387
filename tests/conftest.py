"""Shared fixtures: the real default model (fetched once, loaded once per test session) and
the default two-worker cluster that the general cluster tests share (started on first use)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.model import Model
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.models import pull_default_model

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    return pull_default_model()


@pytest.fixture(scope="session")
def model(default_model_path: Path) -> Model:
    return Model.load(default_model_path, device="cpu")


@pytest.fixture(scope="session")
def default_cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """Two workers with the default settings (a short lease), shared by the modules that
    run the general cluster tests; started once, on first use."""
    config = ClusterConfig(
        num_workers=2,
        model=default_model_path,
        lease_s=2.0,
        log_dir=tmp_path_factory.mktemp("cluster-logs"),
        spill_dir=tmp_path_factory.mktemp("spill"),
    )
    with Cluster(config) as c:
        yield c
