"""Shared fixtures: the real default model (fetched once, loaded once per test session), the
tiny random-weight model's file (written once), and the default two-worker cluster that the
general cluster tests share (started on first use)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest

from engine.model import Model
from tests import cuda_emu
from tests.cluster_helpers import write_keys
from tests.tiny_gguf import write_tiny_llama
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster
from warmfleet.models import pull_default_model

FIXTURES = Path(__file__).parent / "fixtures"


def pytest_addoption(parser: pytest.Parser) -> None:
    help = "the fuzz suite draws 20 times as many requests, new ones each run"
    parser.addoption("--long", action="store_true", help=help)


@pytest.fixture(scope="module")
def cuda_module() -> Iterator[ModuleType]:
    """CuPy, or where no GPU is found its CPU stand-in (tests/cuda_emu), as the module
    `import cupy` finds for a test module's lifetime."""
    with cuda_emu.installed() as cp:
        yield cp


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    return pull_default_model()


@pytest.fixture(scope="session")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama file (tests/tiny_gguf.py), written once per session."""
    return write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")


@pytest.fixture(scope="session")
def model(default_model_path: Path) -> Model:
    """The default model as workers load it on the CPU: matrices kept quantized, KV in
    float16."""
    return Model.load(default_model_path, device="cpu")


@pytest.fixture(scope="session")
def model_kv_float32(default_model_path: Path) -> Model:
    """The default model with its matrices kept quantized and its KV in float32 (the
    reference tests')."""
    return Model.load(default_model_path, device="cpu", kv_dtype="float32")


@pytest.fixture(scope="session")
def model_kv_q8(default_model_path: Path) -> Model:
    """The default model with its KV in q8_0 blocks (--kv-dtype q8_0)."""
    return Model.load(default_model_path, device="cpu", kv_dtype="q8_0")


@pytest.fixture(scope="session")
def model_float32(default_model_path: Path) -> Model:
    """The default model all in float32: every matrix expanded (--weights float32) and the
    KV (--kv-dtype float32)."""
    return Model.load(default_model_path, device="cpu", weights="float32", kv_dtype="float32")


@pytest.fixture(scope="session")
def model_mlx(default_model_path: Path) -> Model:
    """The default model on MLX (its CPU build here), matrices kept in MLX's quantized form."""
    return Model.load(default_model_path, device="mlx", kv_dtype="float32")


@pytest.fixture(scope="session")
def model_mlx_float32(default_model_path: Path) -> Model:
    """The default model on MLX with every matrix expanded to float32."""
    return Model.load(default_model_path, device="mlx", weights="float32", kv_dtype="float32")


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


TENANTS = {"alice": "", "bob": "", "low": 'max_priority = "batch"',
           "tiny": "max_queued = 1\nmax_concurrent = 1", "ops": "admin = true"}  # fmt: skip
MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class KeyedCluster:
    cluster: Cluster
    path: Path  # the key file
    keys: dict[str, str]  # the API key of each tenant in TENANTS


@pytest.fixture(scope="session")
def keyed_cluster(
    default_model_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[KeyedCluster]:
    """Two workers behind a gateway with API keys (TENANTS) and a small body limit, shared
    by the HTTP tests."""
    path = tmp_path_factory.mktemp("keys") / "keys.toml"
    keys = write_keys(path, TENANTS)
    config = ClusterConfig(
        num_workers=2,
        model=default_model_path,
        keys_file=path,
        spill_dir=tmp_path_factory.mktemp("spill"),
        gateway_args=["--max-body-bytes", str(MAX_BODY_BYTES)],
        log_dir=tmp_path_factory.mktemp("keyed-logs"),
    )
    with Cluster(config) as c:
        yield KeyedCluster(c, path, keys)
