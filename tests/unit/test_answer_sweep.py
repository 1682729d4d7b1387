"""The kvstore's sweep deletes the shared-prefix answers no worker took (a worker that gave
up waiting for another's blocks leaves the late answer behind), and only those."""

from __future__ import annotations

import os
import time
from pathlib import Path

from engine.kv_files.spill_file import ANSWERS_DIR
from kvstore.disk_sweep import ANSWER_GRACE_S, DiskSweep


def test_answers_older_than_the_grace_are_swept(tmp_path: Path) -> None:
    answers = tmp_path / ANSWERS_DIR
    answers.mkdir()
    old, young = answers / "old", answers / "young"
    old.touch()
    young.touch()
    past = time.time() - ANSWER_GRACE_S - 60
    os.utime(old, (past, past))
    (tmp_path / "workers").mkdir()
    mark = tmp_path / "workers" / "w0"
    mark.touch()
    os.utime(mark, (past, past))  # a running worker's mark: not the sweep's
    DiskSweep(tmp_path).run()
    assert not old.exists() and young.exists() and mark.exists()


def test_a_directory_without_answers_sweeps_quietly(tmp_path: Path) -> None:
    DiskSweep(tmp_path).run()
    assert list(tmp_path.iterdir()) == []
