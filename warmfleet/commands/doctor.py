"""`warmfleet doctor`: what this machine runs the engine with (Python, NumPy and BLAS, the C
kernels, CuPy, CUDA, the GPU, MLX), the engine on its device against the CPU float32
reference, and a short benchmark; one table, and an exit code that says whether a GPU was
used."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from common.enums import DEVICES
from engine.device import apple_silicon, set_threads
from engine.model import Model
from warmfleet import doctor_report as report
from warmfleet.commands.common import add_weights
from warmfleet.doctor_bench import BATCHES, PREFILL_TOKENS, measure, read_bandwidth_gbs
from warmfleet.doctor_reference import LOGIT_TOL, NUM_TOKENS, check_against
from warmfleet.doctor_report import Check, fail, info, ok, skipped
from warmfleet.doctor_system import (
    GpuProbe,
    MlxProbe,
    gpu_rows,
    kernels_row,
    mlx_row,
    numpy_row,
    probe_gpu,
    probe_mlx,
    python_row,
)
from warmfleet.models import DEFAULT_MODEL_FILE, env_int, model_dir, resolve_model, sha256_of
from warmfleet.sizes import format_size

T = TypeVar("T")
GPU_PROBE_TIMEOUT_S = 60.0  # importing CuPy and opening the driver; a hung driver fails here
GPU_DTYPES = ("float32", "float16")
EXIT_CODES = f"""exit codes:
  {report.EXIT_OK_GPU}  every check passed, on a GPU (CUDA, or MLX on Metal)
  {report.EXIT_FAILED}  a check failed (--device cuda or mlx where it cannot run included)
  {report.EXIT_USAGE}  usage error
  {report.EXIT_OK_CPU_ONLY}  every check passed, on the CPU only (no GPU found, --device cpu,
     or MLX's CPU build)"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this machine: Python, NumPy, CuPy, CUDA, the GPU, the engine against "
        "its CPU reference, and a short benchmark (one table)",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where the engine checks run: cuda fails without a GPU, mlx without "
                   "MLX; auto picks as a worker does: the GPU when CuPy sees one, MLX on "
                   "Apple silicon where it is installed, else the CPU (default)")  # fmt: skip
    p.add_argument("--dtype", choices=GPU_DTYPES, action="append", default=None,
                   help="compute dtype to check (repeatable; default: float32 and float16 "
                   "on a GPU, float32 on the CPU)")  # fmt: skip
    add_weights(p)
    p.add_argument("--model", metavar="PATH", help="a GGUF file (default: the default model)")
    p.add_argument("--threads", type=int, default=env_int("WARMFLEET_THREADS"), metavar="N",
                   help="BLAS/kernel threads (default: $WARMFLEET_THREADS, else one per "
                   "core)")  # fmt: skip
    p.add_argument("--quick", action="store_true", help="skip the benchmark")
    p.add_argument("--json", action="store_true", help="print the table as one JSON object")
    p.set_defaults(run=run)


@dataclass(frozen=True, slots=True)
class DoctorConfig:
    """What the engine checks run: on `device` ("cpu", "cuda" or "mlx"), in each of
    `dtypes`."""

    device: str
    dtypes: tuple[str, ...]
    weights: str
    model: str | None
    bench: bool

    @classmethod
    def choose(cls, args: argparse.Namespace, probe: GpuProbe, mlx: MlxProbe) -> DoctorConfig:
        device = pick_device(args.device, probe, mlx)
        dtypes = tuple(args.dtype or (GPU_DTYPES if device == "cuda" else ("float32",)))
        return cls(device, tuple(dict.fromkeys(dtypes)), args.weights, args.model, not args.quick)


def pick_device(asked: str, probe: GpuProbe, mlx: MlxProbe) -> str:
    """Where the engine checks run: as asked, and for "auto" as engine/device.py picks for
    a worker (MLX on Apple silicon where installed, the GPU when CuPy sees one, else the
    CPU)."""
    if asked != "auto":
        return asked
    if apple_silicon() and mlx.found:
        return "mlx"
    return "cuda" if probe.found else "cpu"


def _progress(message: str) -> None:
    print(f"warmfleet doctor: {message}", file=sys.stderr, flush=True)


def probe_gpu_within(timeout_s: float) -> GpuProbe:
    """probe_gpu(), or a GpuProbe saying the driver did not answer in time."""
    found: list[GpuProbe] = []
    thread = threading.Thread(target=lambda: found.append(probe_gpu()), daemon=True)
    thread.start()
    thread.join(timeout_s)
    return found[0] if found else GpuProbe(why=f"CUDA did not answer within {timeout_s:.0f} s")


def run(args: argparse.Namespace) -> int:
    set_threads(args.threads)
    _progress(
        "looking at the machine: Python, NumPy, the C kernels (built the first time: up "
        "to a minute), CuPy, MLX"
    )
    checks = [python_row(), numpy_row(), kernels_row()]
    probe = probe_gpu_within(GPU_PROBE_TIMEOUT_S)
    checks += gpu_rows(probe, required=args.device == "cuda")
    mlx = MlxProbe(why="not asked for")  # --device cpu or cuda: MLX plays no part
    if args.device in ("auto", "mlx"):
        mlx = probe_mlx()
        if mlx.found or args.device == "mlx" or apple_silicon():
            checks.append(mlx_row(mlx, required=args.device == "mlx"))
    config = DoctorConfig.choose(args, probe, mlx)
    if args.device == "cuda" and not probe.found:
        checks.append(skipped("engine", "not run: --device cuda, and no GPU"))
        ran_on = ""
    elif args.device == "mlx" and not mlx.found:
        checks.append(skipped("engine", "not run: --device mlx, and no MLX"))
        ran_on = ""
    else:
        checks += engine_rows(config)
        ran_on = config.device
    on_gpu = ran_on == "cuda" or (ran_on == "mlx" and mlx.on_gpu)
    code = report.exit_code(checks, gpu_used=on_gpu)
    if args.json:
        print(report.to_json(checks, ran_on, probe.found or mlx.on_gpu, code))
    else:
        print(report.format_table(checks))
        print(verdict(code, checks, probe, ran_on))
    return code


def verdict(code: int, checks: list[Check], probe: GpuProbe, ran_on: str) -> str:
    """The last line of the table: the exit code and what it means here."""
    if code == report.EXIT_OK_GPU:
        return f"exit {code}: every check passed, on the GPU" + (
            " (MLX on Metal)" if ran_on == "mlx" else ""
        )
    if code == report.EXIT_OK_CPU_ONLY:
        why = "MLX's CPU build" if ran_on == "mlx" else probe.why or "--device cpu"
        return f"exit {code}: every check passed, on the CPU only (no GPU used: {why})"
    failed = ", ".join(c.name for c in checks if c.result is report.Result.FAIL)
    return f"exit {code}: failed: {failed}"


def attempt(name: str, step: Callable[[], tuple[Check, T]]) -> tuple[Check, T | None]:
    """The step's row and result, or a failed row naming the exception it raised."""
    try:
        return step()
    except Exception as e:
        return fail(name, f"{type(e).__name__}: {e}"), None


def engine_rows(config: DoctorConfig) -> list[Check]:
    """The model, the CPU float32 reference, then per dtype: the load on the device, the
    reference check and the benchmark. A failed step ends what depends on it."""
    row, path = attempt("model", lambda: find_model(config.model))
    if path is None:
        return [row]
    rows = [row]
    # the reference: float32 compute, every matrix expanded (no quantized kernel involved)
    name = "load reference"
    row, reference = attempt(name, lambda: load(name, path, "cpu", "float32", "float32"))
    rows.append(row)
    if reference is None:
        return rows
    for dtype in config.dtypes:
        rows += dtype_rows(config, reference, path, dtype)
    return rows


def dtype_rows(config: DoctorConfig, reference: Model, path: Path, dtype: str) -> list[Check]:
    """Load on the device in `dtype`, check against the reference, time it."""
    where = f"{config.device} {dtype}"
    name = f"load {where}"
    row, model = attempt(name, lambda: load(name, path, config.device, dtype, config.weights))
    if model is None:
        return [row]
    rows = [row]
    name = f"reference {where}"
    rows.append(attempt(name, lambda: (reference_row(name, reference, model, dtype), None))[0])
    if not config.bench:
        return [*rows, skipped(f"benchmark {where}", "--quick")]
    slow = " (a few seconds; MLX's CPU build: a minute or more)" if config.device == "mlx" else ""
    _progress(f"benchmark on {where}{slow or ' (a few seconds)'}")
    return rows + bench_rows(model, where)


def find_model(given: str | None) -> tuple[Check, Path]:
    """The model file: `given`, or the default one (fetched if need be, verified)."""
    cached = given is None and (model_dir() / DEFAULT_MODEL_FILE).exists()
    path = resolve_model(given, _progress)
    num_bytes = path.stat().st_size
    size = format_size(num_bytes)
    if given is None:
        how = "found in the cache" if cached else "fetched"
        return ok("model", f"{path} ({how}, {size}, sha256 verified)", path=str(path),
                  bytes=num_bytes), path  # fmt: skip
    digest = sha256_of(path)
    return info("model", f"{path} ({size}, sha256 {digest[:16]}...)", path=str(path),
                bytes=num_bytes, sha256=digest), path  # fmt: skip


def load(name: str, path: Path, device: str, dtype: str, weights: str) -> tuple[Check, Model]:
    """The model loaded as asked, its KV in the compute dtype (the check is of the device's
    arithmetic: float16 KV alone moves logits by ~0.015, past float32's tolerance), and its
    row."""
    _progress(f"loading {path.name} on {device} ({dtype}, weights {weights})")
    t0 = time.perf_counter()
    model = Model.load(path, device=device, dtype=dtype, weights=weights, kv_dtype=dtype)
    took = time.perf_counter() - t0
    return info(name, f"{model.device}, weights {model.weights_mode} "
                f"({format_size(model.weight_bytes)}), {took:.1f} s", device=model.device,
                weights=model.weights_mode, weight_bytes=model.weight_bytes,
                load_s=round(took, 2)), model  # fmt: skip


def reference_row(name: str, reference: Model, model: Model, dtype: str) -> Check:
    _progress(f"{name}: {NUM_TOKENS} greedy tokens and their logits against the CPU float32")
    c = check_against(reference, model, dtype)
    values: dict[str, report.Value] = {
        "max_abs_diff": c.max_abs_diff, "tol": LOGIT_TOL[dtype], "num_tokens": c.num_tokens,
        "divergence": c.divergence, "tie_gap": c.tie_gap,
    }  # fmt: skip
    return (ok if c.passed else fail)(name, c.describe(), **values)


def bench_rows(model: Model, where: str) -> list[Check]:
    try:
        speed = measure(model)
    except Exception as e:
        return [fail(f"benchmark {where}", f"{type(e).__name__}: {e}")]
    rows = [info(f"prefill {where}", f"{speed.prefill_tok_s:.0f} tok/s ({PREFILL_TOKENS}-token "
                 "prompt, one step)", tok_s=round(speed.prefill_tok_s, 1))]  # fmt: skip
    for b in BATCHES:
        rate, steps = speed.decode_tok_s[b], speed.decode_steps[b]
        rows.append(info(f"decode {where} batch {b}", f"{rate:.1f} tok/s aggregate "
                         f"(median of {steps} steps: {1e3 * b / rate:.1f} ms)",
                         tok_s=round(rate, 1), steps=steps))  # fmt: skip
    if where.startswith("cpu") and not model.config.num_experts:
        rows.append(read_rate_row(model, where, speed.decode_tok_s[1]))
    return rows


def read_rate_row(model: Model, where: str, batch1_tok_s: float) -> Check:
    """A batch-1 decode step reads every weight once: their bytes over the step's time,
    against what the machine streams (a BLAS product over a weights-sized buffer)."""
    rate, machine = model.weight_bytes * batch1_tok_s / 1e9, read_bandwidth_gbs()
    detail = (
        f"batch 1 reads its {model.weight_bytes / 2**20:.0f} MiB of weights at {rate:.1f} "
        f"GB/s, {rate / machine:.0%} of this machine's read rate ({machine:.1f} GB/s)"
    )
    return info(f"weight reads {where}", detail, gbs=round(rate, 1), machine_gbs=round(machine, 1))
