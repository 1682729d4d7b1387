"""`warmfleet top`'s picture of a snapshot (no Redis): per-interval figures from two
samples, sizes, the session list cut to the terminal, and its command-line errors."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from rich.console import Console

from warmfleet.cli import main
from warmfleet.commands import top

MIB, GIB = 1 << 20, 1 << 30


def worker(worker_id: str, **fields: Any) -> dict[str, Any]:
    w = {
        "id": worker_id,
        "state": "alive",
        "heartbeat_age_s": 0.25,
        "running": 1,
        "paused": 0,
        "slots": 4,
        "sessions": 2,
        "pool_bytes": MIB,
        "warm_budget": 4 * GIB,
        "kv_blocks": {},
        "steps": 100,
        "generated_tokens": 1000,
        "prefill_tokens": 50,
        "step_seconds": 2.0,
        "weights": "quantized",
        "kv_dtype": "float16",
        "kv_bytes_per_token": 23040,
        "sessions_per_gib": 2048.0,
    }
    return w | fields


def usage() -> dict[str, Any]:
    """GetUsage as kvstore/usage.py's to_json writes it."""
    counters = {"spills": 7, "restores": 5, "rejected_files": 1, "failed_writes": 0,
                "budget_deletions": 2, "evictions_ordered": 9}  # fmt: skip
    disk = {"spill_dir": "/s", "used_bytes": 12 * MIB, "budget_bytes": GIB,
            "num_files": 3}  # fmt: skip
    tiers = {"hot": 1, "warm": 2, "spilling": 0, "disk": 3, "gone": 0}
    return {"workers": [], "disk": disk, "tiers": tiers, "counters": counters,
            "events_behind": 0}  # fmt: skip


def snapshot(at: float, workers: list[dict[str, Any]], num_sessions: int = 3) -> dict[str, Any]:
    recent = [{"tenant": "local", "session_id": f"s{i}", "tier": "warm", "worker": "w0",
               "tokens": 100 + i, "bytes": 2 * MIB, "last_used": at - i}
              for i in range(num_sessions)]  # fmt: skip
    lanes = [{"priority": "batch", "tenant": "bob", "depth": 2, "oldest_age_s": 3.5}]
    queues = {"waiting": 2, "running": {"alice": 2}, "admitted": 40, "refused": 4, "lanes": lanes}
    return {
        "time": at,
        "queues": queues,
        "workers": workers,
        "sessions": {"total": num_sessions, "tiers": usage()["tiers"], "recent": recent},
        "kvstore": {"alive": True, "usage": usage()},
        "responses": {"grpc OK": 30, "http 429": 4},
    }


def draw(snap: dict[str, Any], before: dict[str, Any] | None, height: int = 60) -> str:
    console = Console(file=io.StringIO(), width=200, height=height, color_system=None)
    console.print(top.fit(console, snap, before, None))
    return str(console.file.getvalue())  # type: ignore[attr-defined]


def row(text: str, first_cell: str) -> list[str]:
    """The cells of the table row that starts with `first_cell`."""
    line = next(x for x in text.splitlines() if x.split() and x.split()[0] == first_cell)
    return [cell for cell in line.split("  ") if cell.strip()]


def test_figures_per_interval_come_from_the_difference_of_two_samples() -> None:
    before = snapshot(100.0, [worker("w0"), worker("w1")])
    after = snapshot(102.0, [worker("w0", steps=150, step_seconds=3.25, generated_tokens=1300),
                             worker("w1")])  # fmt: skip
    after["queues"] |= {"admitted": 46, "refused": 5}
    text = draw(after, before)
    # w0: 300 tokens in 2 s; 50 steps in 1.25 s; w1 took no step
    cells = [c.strip() for c in row(text, "w0")]
    assert cells == ["w0", "alive", "1 / 4", "0", "150.0", "25.0", "1.0 MiB / 4.0 GiB", "2",
                     "float16", "2048.0", "0.2 s ago"]  # fmt: skip
    assert [c.strip() for c in row(text, "w1")][4:6] == ["0.0", "-"]
    assert "3.0 admitted/s, 0.5 refused/s" in text
    assert "running alice 2" in text and "responses: grpc OK 30, http 429 4" in text
    assert [c.strip() for c in row(text, "batch")] == ["batch", "bob", "2", "3.5 s"]


def test_one_sample_shows_no_rates() -> None:
    text = draw(snapshot(100.0, [worker("w0")]), None)
    assert [c.strip() for c in row(text, "w0")][4:6] == ["-", "-"]
    assert "- admitted/s, - refused/s" in text


def test_kvstore_counters_and_disk_read_from_usage_json() -> None:
    text = draw(snapshot(100.0, [worker("w0")]), None)
    assert "KV store: alive" in text
    assert [c.strip() for c in row(text, "7")] == ["7", "5", "1", "0", "2",
                                                   "12.0 MiB / 1.0 GiB", "3", "0"]  # fmt: skip
    assert "Sessions: 3 (hot 1, warm 2, spilling 0, disk 3, gone 0)" in text
    down = snapshot(100.0, [])
    down["kvstore"] = {"alive": False, "usage": None}
    assert "KV store: down" in draw(down, None)


@pytest.mark.parametrize("height", [30, 45])
def test_the_session_list_fills_the_terminal_most_recent_first(height: int) -> None:
    text = draw(snapshot(100.0, [worker("w0"), worker("w1")], num_sessions=100), None, height)
    lines = text.splitlines()
    assert len(lines) == height - 1
    listed = [x.split()[1] for x in lines if x.startswith("local ")]
    assert listed == [f"s{i}" for i in range(len(listed))] and len(listed) > 5
    assert f"; {len(listed)} most recently used" in text


def test_sessions_option_lists_exactly_n() -> None:
    console = Console(file=io.StringIO(), width=200, height=20, color_system=None)
    console.print(top.fit(console, snapshot(100.0, [], num_sessions=100), None, 40))
    text = str(console.file.getvalue())  # type: ignore[attr-defined]
    assert sum(x.startswith("local ") for x in text.splitlines()) == 40


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--interval", "0"], "--interval: must be positive, got 0.0"),
     (["--sessions", "-1"], "--sessions: must be at least 0, got -1")],
)  # fmt: skip
def test_bad_options_exit_2(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert main(["top", "--once", *argv]) == 2
    assert capsys.readouterr().err == f"warmfleet: error: {message}\n"


def test_unreachable_redis_is_one_line_and_exit_2(capsys: pytest.CaptureFixture) -> None:
    assert main(["top", "--once", "--json", "--redis-url", "redis://127.0.0.1:1/0"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith("warmfleet: error: cannot read the fleet from Redis at ")
    assert out.err.count("\n") == 1 and "127.0.0.1:1" in out.err


def test_json_snapshot_is_printed_as_is(capsys: pytest.CaptureFixture) -> None:
    snap = snapshot(100.0, [worker("w0")])
    top._print_json_line(snap, None)
    assert json.loads(capsys.readouterr().out) == snap
    later = snapshot(102.0, [worker("w0", generated_tokens=1100)])
    top._print_json_line(later, snap)
    printed = json.loads(capsys.readouterr().out)
    assert printed.pop("rates")["tokens_per_s_by_worker"] == {"w0": 50.0}
    assert printed == later
