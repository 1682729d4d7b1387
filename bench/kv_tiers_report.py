"""The tables of the KV tiers benchmark (bench/kv_tiers.py): time to first token on resume by
path and KV dtype, against recompute and against the targets."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from bench.kv_tiers_session import SOURCE_NAMES, Turn
from bench.table import print_table

SOURCE_KINDS = ("warm", "disk", "recompute")
Results = list[dict[str, Turn]]  # one per repeat: the "warm", "disk" and "recompute" turns


def print_dtype_table(by_dtype: dict[str, Results], repeats: int) -> None:
    """Each path's median time to first token in every KV dtype, against the first's."""
    first = next(iter(by_dtype))
    base = {k: statistics.median(pick(by_dtype[first], k, "ttft_s")) for k in SOURCE_KINDS}
    rows = []
    for kind in SOURCE_KINDS:
        cells = [kind]
        for name, results in by_dtype.items():
            ttft = statistics.median(pick(results, kind, "ttft_s"))
            cells.append(f"{ttft * 1e3:.1f}")
            if name != first:
                cells.append(f"{base[kind] / ttft:.2f}x")
        rows.append(tuple(cells))
    head = ["path"]
    for name in by_dtype:
        head.append(f"{name} TTFT (ms)")
        if name != first:
            head.append(f"{first} / {name}")
    print(f"Time to first token on resume by KV dtype, median of {repeats}")
    print_table(tuple(head), rows)


def pick(results: Results, kind: str, attr: str) -> list[float]:
    """`attr` of the `kind` turn in every repeat."""
    return [float(getattr(r[kind], attr)) for r in results]


def ms(values: Sequence[float]) -> str:
    """The median of `values` (seconds) in milliseconds, to 0.1."""
    return f"{statistics.median(values) * 1e3:.1f}"


def print_resume_table(
    results: Results, threads: int, repeats: int, methods: set[str], resident: list[int]
) -> None:
    """Time to first token of the warm, disk and recomputed resumes, against recompute."""
    rec = statistics.median(pick(results, "recompute", "ttft_s"))
    rows = []
    for kind in SOURCE_KINDS:
        ttft = pick(results, kind, "ttft_s")
        rows.append(
            (
                kind,
                SOURCE_NAMES[results[0][kind].source],
                f"{results[0][kind].prompt_tokens}",
                f"{results[0][kind].cached_tokens}",
                ms(ttft),
                f"{min(ttft) * 1e3:.1f}-{max(ttft) * 1e3:.1f}",
                ms(pick(results, kind, "client_ttft_s")),
                f"{rec / statistics.median(ttft):.1f}x",
            )
        )
    print(
        f"Time to first token on resume, 1 worker with {threads} threads, "
        f"median of {repeats}; page cache before the disk resume: {', '.join(sorted(methods))}"
        + (f" (spill files resident after the drop: max {max(resident)} bytes)" if resident else "")
    )
    print_table(
        (
            "path",
            "kv_source",
            "prompt tokens",
            "cached",
            "TTFT (ms)",
            "min-max (ms)",
            "client TTFT (ms)",
            "recompute / this",
        ),
        rows,
    )


def print_targets(results: Results) -> None:
    """Whether the warm and disk resumes meet their speed targets against recompute."""
    rec = statistics.median(pick(results, "recompute", "ttft_s"))
    warm, disk = (
        statistics.median(pick(results, "warm", "ttft_s")),
        statistics.median(pick(results, "disk", "ttft_s")),
    )
    slowest_disk = max(pick(results, "disk", "ttft_s"))
    fastest_recompute = min(pick(results, "recompute", "ttft_s"))
    print_table(
        ("target", "result", "holds"),
        [
            ("warm >= 100x faster than recompute", f"{rec / warm:.1f}x", _yes(rec / warm >= 100)),
            ("disk >= 20x faster than recompute", f"{rec / disk:.1f}x", _yes(rec / disk >= 20)),
            (
                "disk never slower than recompute",
                f"slowest disk {slowest_disk * 1e3:.0f} ms, fastest recompute "
                f"{fastest_recompute * 1e3:.0f} ms",
                _yes(slowest_disk < fastest_recompute),
            ),
        ],
    )


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"
