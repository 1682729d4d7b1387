"""`warmfleet doctor`'s table: one row per check, the exit code it implies, and its two
renderings (aligned text, JSON)."""

from __future__ import annotations

import enum
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

EXIT_OK_GPU = 0  # every check passed, and the engine ran on a GPU
EXIT_FAILED = 1  # a check failed (--device cuda without a usable GPU included)
EXIT_USAGE = 2  # the command line was wrong (the CLI's convention)
EXIT_OK_CPU_ONLY = 3  # every check passed, but on the CPU: no GPU was found or used
JSON_VERSION = 1


class Result(enum.StrEnum):
    OK = "ok"
    FAIL = "fail"
    SKIPPED = "skipped"
    INFO = "info"


Value = str | int | float | bool | None | list[int] | list[str]


@dataclass(frozen=True, slots=True)
class Check:
    """One row: what was checked, how it went, a line for people and values for scripts."""

    name: str
    result: Result
    detail: str
    values: dict[str, Value] = field(default_factory=dict)


def ok(name: str, detail: str, /, **values: Value) -> Check:
    return Check(name, Result.OK, detail, values)


def fail(name: str, detail: str, /, **values: Value) -> Check:
    return Check(name, Result.FAIL, detail, values)


def info(name: str, detail: str, /, **values: Value) -> Check:
    return Check(name, Result.INFO, detail, values)


def skipped(name: str, detail: str) -> Check:
    return Check(name, Result.SKIPPED, detail)


def exit_code(checks: Sequence[Check], gpu_used: bool) -> int:
    """EXIT_FAILED if any row failed; else EXIT_OK_GPU when the engine checks ran on a GPU,
    EXIT_OK_CPU_ONLY when they ran on the CPU."""
    if any(c.result is Result.FAIL for c in checks):
        return EXIT_FAILED
    return EXIT_OK_GPU if gpu_used else EXIT_OK_CPU_ONLY


def format_table(checks: Sequence[Check]) -> str:
    """The rows as aligned text: check | result | detail."""
    header = ("check", "result", "detail")
    rows = [(c.name, str(c.result), c.detail) for c in checks]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in (0, 1)]
    lines = [f"{h[0].ljust(widths[0])} | {h[1].ljust(widths[1])} | {h[2]}" for h in [header]]
    lines.append(f"{'-' * widths[0]}-|-{'-' * widths[1]}-|-{'-' * len(header[2])}")
    lines += [f"{n.ljust(widths[0])} | {r.ljust(widths[1])} | {d}" for n, r, d in rows]
    return "\n".join(lines)


def to_json(checks: Sequence[Check], device: str, gpu_found: bool, code: int) -> str:
    """The report as one JSON object: version, device (where the engine checks ran: "cpu",
    "cuda", "mlx", or null when they did not run), gpu_found (CuPy sees a GPU, or MLX
    computes on Metal), exit_code, and checks [{check, result, detail, values}] in the
    table's order."""
    return json.dumps(
        {
            "version": JSON_VERSION,
            "device": device or None,
            "gpu_found": gpu_found,
            "exit_code": code,
            "checks": [
                {"check": c.name, "result": str(c.result), "detail": c.detail, "values": c.values}
                for c in checks
            ],
        },
        ensure_ascii=False,
    )
