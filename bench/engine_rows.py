"""The engine benchmark's report: the line above the table, the table's rows (a cell per
device and the ratios between them) and the footnotes for the cells that hold no figure."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

from bench.engine_measure import Bandwidth, Figures, Loaded, Workload, peak_rss_mib

LABELS = {"cpu": "NumPy (cpu)", "mlx": "MLX (mlx)"}


def ratio(ours: float | None, theirs: float | None) -> str:
    """`ours / theirs` as "1.23x"; "-" when there is nothing to compare with."""
    return f"{ours / theirs:.2f}x" if ours and theirs else "-"


def rate(tok_s: float) -> str:
    return f"{tok_s:.0f}" if tok_s >= 100 else f"{tok_s:.1f}"


class Notes:
    """Footnotes for the cells that hold no figure: each text once, numbered in order."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def ref(self, text: str) -> str:
        if text not in self.texts:
            self.texts.append(text)
        return f"[{self.texts.index(text) + 1}]"

    def print(self) -> None:
        for i, text in enumerate(self.texts, 1):
            print(f"[{i}] {text}")


@dataclass(frozen=True, slots=True)
class Line:
    """One figure: a cell per device, the numbers their ratio is taken of, and llama.cpp's."""

    label: str
    cells: dict[str, str]
    values: dict[str, float]  # by device, where a ratio between devices means something
    llamacpp: str = "-"
    llamacpp_value: float | None = None


def speed_lines(figures: dict[str, Figures], lc: dict[str, float], work: Workload) -> list[Line]:
    """Prefill and decode speed on each device; NumPy's against llama.cpp where measured."""
    lc_decode, lc_prefill = lc.get("decode_tok_s"), lc.get("prefill_tok_s")
    lines = [
        Line(
            f"prefill, {len(work.prompt_ids)}-token prompt (tok/s)",
            {d: rate(f.prefill_tok_s) for d, f in figures.items()},
            {d: f.prefill_tok_s for d, f in figures.items()},
            f"{lc_prefill:.0f}" if lc_prefill else "-",
            lc_prefill,
        )
    ]
    for b in work.batches:
        lines.append(
            Line(
                f"decode batch {b}, aggregate (tok/s)",
                {d: rate(f.decode_tok_s[b]) for d, f in figures.items()},
                {d: f.decode_tok_s[b] for d, f in figures.items()},
                f"{lc_decode:.1f} (batch 1)" if lc_decode else "-",
                lc_decode,
            )
        )
    return lines


NO_FLOOR = (
    "no floor for MLX: the rates are the CPU cores' (Numba, on every --threads thread), and "
    "MLX reads its weights on its own device (a Mac's GPU; one thread in MLX's Linux CPU "
    "build), whose rate this does not measure"
)


def floor_lines(
    loaded: dict[str, Loaded], figures: dict[str, Figures], bw: Bandwidth | None, notes: Notes
) -> list[Line]:
    """The batch-1 decode step against the time to stream the weights once at the CPU
    cores' copy and read rates: a floor for NumPy only."""
    step_ms = {d: 1e3 / f.decode_tok_s[1] for d, f in figures.items()}
    lines = [Line("decode step, batch 1 (ms)", {d: f"{ms:.1f}" for d, ms in step_ms.items()},
                  step_ms)]  # fmt: skip
    for kind in ("copy", "read"):
        gbs = getattr(bw, f"{kind}_gbs") if bw else None
        cells = {d: f"n/a {notes.ref(NO_FLOOR)}" for d in loaded if d == "mlx"}
        if gbs and "cpu" in loaded:
            floor_ms = loaded["cpu"].model.weight_bytes / (gbs * 1e9) * 1e3
            cells["cpu"] = f"{floor_ms:.1f} (step {step_ms['cpu'] / floor_ms:.2f}x)"
        label = f"floor: weights / {kind} {gbs:.1f} GB/s (ms)" if gbs else f"floor: {kind}"
        lines.append(Line(label, cells, {}))
    return lines


NO_PROC = "no /proc here (macOS): the RSS a load added is not measured"
PEAK_RSS = (
    "the process's, one for the whole run: every device's model, and where cpu ran the "
    "bandwidth test's two 512 MiB buffers; MLX's own allocations are in the MLX rows"
)


def memory_lines(
    loaded: dict[str, Loaded], lc: dict[str, float], file_bytes: int, prompt_tokens: int,
    notes: Notes,
) -> list[Line]:  # fmt: skip
    """Weights in memory and the memory each load added (models loaded left to right),
    against the GGUF file's size; KV bytes per token (llama.cpp's from its saved state);
    the process's peak RSS and MLX's peak."""
    file_mib = file_bytes / 2**20
    weights = {d: one.model.weight_bytes / 2**20 for d, one in loaded.items()}
    rss = {d: one.rss_bytes / 2**20 for d, one in loaded.items() if one.rss_bytes is not None}
    rss_cells = {d: f"{mib:.0f} ({mib / file_mib:.2f}x file)" for d, mib in rss.items()}
    rss_cells |= {d: f"n/a {notes.ref(NO_PROC)}" for d in loaded if d not in rss}
    kv = {d: float(one.model.bytes_per_token) for d, one in loaded.items()}
    lc_kv = lc["state_bytes"] / prompt_tokens if lc.get("state_bytes") else None
    lines = [
        Line(f"weights in memory (MiB; GGUF file {file_mib:.0f})",
             {d: f"{mib:.0f} {loaded[d].model.weights_mode} ({mib / file_mib:.2f}x file)"
              for d, mib in weights.items()}, weights),
        Line("RSS added by the load (MiB)", rss_cells, rss),
    ]  # fmt: skip
    mlx_load = loaded.get("mlx")
    if mlx_load is not None:
        added = (mlx_load.mlx_bytes or 0) / 2**20
        lines.append(Line("MLX memory added by the load (MiB)", {"mlx": f"{added:.0f}"}, {}))
    lines.append(Line("KV bytes per token", {d: f"{v:.0f}" for d, v in kv.items()}, kv,
                      f"{lc_kv:.0f} (f16)" if lc_kv else "-"))  # fmt: skip
    first, *others = loaded
    peak = {first: f"{peak_rss_mib():.0f}", **dict.fromkeys(others, "same")}
    lines.append(Line(f"peak RSS of the process (MiB) {notes.ref(PEAK_RSS)}", peak, {}))
    if mlx_load is not None:
        import mlx.core as mx

        peak_mib = mx.get_peak_memory() / 2**20
        lines.append(Line("MLX peak memory (MiB)", {"mlx": f"{peak_mib:.0f}"}, {}))
    return lines


def table(lines: list[Line], devices: list[str]) -> tuple[list[str], list[tuple[str, ...]]]:
    """The header and rows: a column per device, MLX / NumPy when both ran, and llama.cpp's
    column and NumPy / llama.cpp when NumPy ran."""
    both, with_lc = len(devices) > 1, "cpu" in devices
    header = ["figure", *(LABELS[d] for d in devices)]
    header += ["mlx / cpu"] if both else []
    header += ["llama.cpp", "cpu / llama.cpp"] if with_lc else []
    rows = []
    for line in lines:
        row = [line.label, *(line.cells.get(d, "-") for d in devices)]
        row += [ratio(line.values.get("mlx"), line.values.get("cpu"))] if both else []
        row += (
            [line.llamacpp, ratio(line.values.get("cpu"), line.llamacpp_value)] if with_lc else []
        )
        rows.append(tuple(row))
    return header, rows


def plural(num_rounds: int) -> str:
    return f"{num_rounds} round" + ("s" if num_rounds != 1 else "")


def blas_kernels() -> str:
    """Which OpenBLAS kernels NumPy runs (prefill's products): OPENBLAS_CORETYPE, set on some
    machines, can hold a CPU to slower ones than it would pick (Haswell's AVX2 on an
    AVX-512 machine: about half the float32 rate)."""
    from threadpoolctl import threadpool_info

    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    return f"BLAS {blas[0].get('internal_api')} {blas[0].get('architecture')}" if blas else "BLAS ?"


def describe(devices: list[str], threads: int, rounds: dict[str, int], path: Path) -> str:
    """One line on what ran where, printed above the table."""
    parts = [f"model {path.name}"]
    if "cpu" in devices:
        parts.append(
            f"cpu: NumPy and the C kernels, {threads} threads, {plural(rounds['cpu'])}, "
            f"{blas_kernels()}"
        )
    if "mlx" in devices:
        import mlx.core as mx

        where, version = mx.default_device(), importlib.metadata.version("mlx")
        build = " (MLX's CPU build: one thread, --threads does not apply)" \
            if where == mx.cpu else ""  # fmt: skip
        parts.append(f"mlx: MLX {version} on {where}{build}, {plural(rounds['mlx'])}")
    return "; ".join(parts) + "; each figure the best of its rounds"
