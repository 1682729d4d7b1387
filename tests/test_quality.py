"""ruff (lint and format) and mypy stay clean on the whole tree."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "tool",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy", "."]],
    ids=["ruff-check", "ruff-format", "mypy"],
)
def test_tool_is_clean(tool: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *tool], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
