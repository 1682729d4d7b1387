"""bench.settings_run: a benchmark's measuring half in a process of its own, under the
settings given, read back from the last line it prints."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from bench.settings_run import measured

MODULE = """
import json, os, sys
print("progress, not a result")
if os.environ.get("FAIL"):
    sys.exit(3)
print(json.dumps({"rows": os.environ["WARMFLEET_CHUNK_ROWS"], "args": sys.argv[1:]}))
"""


def test_the_setting_reaches_the_process_and_its_last_line_comes_back(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(MODULE)
    settings = {"PYTHONPATH": str(tmp_path), "WARMFLEET_CHUNK_ROWS": "64"}
    assert measured("probe", ["--measure", "x"], settings) == {
        "rows": "64",
        "args": ["--measure", "x"],
    }
    with pytest.raises(subprocess.CalledProcessError):
        measured("probe", [], {**settings, "FAIL": "1"})
