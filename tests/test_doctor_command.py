"""`warmfleet doctor`: the comparison rule and the GPU rows without a model (a fake CuPy
module stands in for a GPU this machine lacks), the device it picks, then the command on
this machine with the real default model, on the CPU and on MLX's CPU build (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import numpy as np
import pytest

from engine.model import Model
from engine.ops.chunks import kernel_attention_rows, kernel_chunk_rows
from tests.tiny_gguf import write_tiny_llama
from warmfleet.cli import main
from warmfleet.commands import doctor
from warmfleet.doctor_reference import NUM_TOKENS, check_against, compare
from warmfleet.doctor_report import (
    EXIT_FAILED,
    EXIT_OK_CPU_ONLY,
    EXIT_OK_GPU,
    Result,
    exit_code,
    fail,
    format_table,
    info,
    ok,
    skipped,
)
from warmfleet.doctor_system import GpuProbe, MlxProbe, gpu_rows, mlx_row, probe_gpu, probe_mlx
from warmfleet.models import sha256_of

VOCAB = 8


def logits_rows(*tops: tuple[int, float, int, float]) -> np.ndarray:
    """One row per position: token a scores x, token b scores y, the rest 0."""
    rows = np.zeros((len(tops), VOCAB), dtype=np.float32)
    for i, (a, x, b, y) in enumerate(tops):
        rows[i, a], rows[i, b] = x, y
    return rows


def test_identical_runs_pass() -> None:
    ref = logits_rows((1, 5.0, 2, 3.0), (3, 6.0, 4, 1.0))
    c = compare(ref, ref + 1e-3, [1, 3], [1, 3], tol=2e-3)
    assert c.passed and c.divergence is None and c.max_abs_diff == pytest.approx(1e-3, rel=1e-3)


def test_a_logit_over_the_tolerance_fails_at_its_position() -> None:
    ref = logits_rows((1, 5.0, 2, 3.0), (3, 6.0, 4, 1.0))
    dev = ref.copy()
    dev[1, 7] += 0.3
    c = compare(ref, dev, [1, 3], [1, 3], tol=0.25)
    assert not c.logits_ok and c.tokens_ok and not c.passed
    assert c.worst_position == 1 and c.max_abs_diff == pytest.approx(0.3)


def test_a_nan_fails_whatever_the_tolerance() -> None:
    ref = logits_rows((1, 5.0, 2, 3.0))
    dev = ref.copy()
    dev[0, 5] = np.nan
    assert not compare(ref, dev, [1], [1], tol=1e9).passed


def test_divergence_at_a_near_tie_passes_and_later_tokens_are_not_compared() -> None:
    # position 1: the reference scores token 4 only 0.4 below its choice, token 3
    ref = logits_rows((1, 5.0, 2, 3.0), (3, 6.0, 4, 5.6), (5, 2.0, 6, 1.0))
    c = compare(ref, ref, [1, 3, 5], [1, 4, 0], tol=0.25)
    assert c.divergence == 1 and c.tie_gap == pytest.approx(0.4)
    assert c.passed  # 0.4 <= 2 x 0.25: two logits each 0.25 off can swap
    assert "near-tie" in c.describe()


def test_divergence_without_a_near_tie_fails() -> None:
    ref = logits_rows((1, 5.0, 2, 3.0), (3, 6.0, 4, 5.4))
    c = compare(ref, ref, [1, 3], [1, 4], tol=0.25)
    assert c.divergence == 1 and c.tie_gap == pytest.approx(0.6) and not c.passed
    assert "not a near-tie" in c.describe()


def test_a_model_that_computes_otherwise_fails_the_check(tmp_path: Path) -> None:
    """The check's plumbing (stepped logits, the engine's greedy tokens) on tiny models:
    the same weights pass; other weights (a wrong device) fail."""
    path = write_tiny_llama(tmp_path / "a.gguf")
    reference = Model.load(path, device="cpu", weights="float32")
    same = check_against(reference, Model.load(path, device="cpu", weights="float32"), "float32")
    assert same.passed and same.max_abs_diff == 0.0 and same.divergence is None
    other = Model.load(write_tiny_llama(tmp_path / "b.gguf", seed=1), device="cpu")
    wrong = check_against(reference, other, "float32")
    assert not wrong.passed and wrong.max_abs_diff > 0.1


def test_exit_codes() -> None:
    passed = [ok("python", "3.11"), info("cupy", "no GPU: x"), skipped("cuda", "no GPU")]
    assert exit_code(passed, gpu_used=True) == EXIT_OK_GPU == 0
    assert exit_code(passed, gpu_used=False) == EXIT_OK_CPU_ONLY == 3
    assert exit_code([*passed, fail("device", "no GPU")], gpu_used=False) == EXIT_FAILED == 1


def test_table_is_aligned() -> None:
    lines = format_table([ok("python", "3.11"), info("device memory", "1 GiB")]).splitlines()
    assert lines[0].split(" | ") == ["check        ", "result", "detail"]
    assert lines[3] == "device memory | info   | 1 GiB"
    assert len({line.index("|") for line in lines}) == 1


def fake_cupy(count: int | Exception, integrated: int = 0) -> ModuleType:
    def device_count() -> int:
        if isinstance(count, Exception):
            raise count
        return count

    runtime = SimpleNamespace(
        getDeviceCount=device_count, runtimeGetVersion=lambda: 13000,
        driverGetVersion=lambda: 13010,
        getDeviceProperties=lambda i: {"name": b"NVIDIA GB10", "integrated": integrated},
    )  # fmt: skip
    device = SimpleNamespace(mem_info=(100 << 30, 119 << 30), compute_capability="121")
    module = ModuleType("cupy")
    module.__dict__.update(__version__="13.6.0", cuda=SimpleNamespace(
        runtime=runtime, Device=lambda i: device))  # fmt: skip
    return module


def rows_by_name(probe: GpuProbe, required: bool = False) -> dict[str, Any]:
    return {c.name: c for c in gpu_rows(probe, required)}


def test_gpu_rows_report_versions_device_and_memory() -> None:
    rows = rows_by_name(probe_gpu(lambda name: fake_cupy(1, integrated=1)))
    assert all(c.result is Result.OK for c in rows.values())
    assert rows["cuda"].detail == "runtime 13.0, driver supports 13.1"
    assert rows["device"].values["compute_capability"] == "12.1"
    assert rows["device"].detail.startswith("NVIDIA GB10, compute capability 12.1")
    assert rows["device memory"].detail == "119.0 GiB total, 100.0 GiB free, shared with the CPU"


def test_no_cupy_and_no_device_say_why() -> None:
    def missing(name: str) -> ModuleType:
        raise ModuleNotFoundError("No module named 'cupy'")

    rows = rows_by_name(probe_gpu(missing))
    assert rows["cupy"].result is Result.INFO
    assert rows["cupy"].detail.startswith("no GPU: CuPy is not installed")
    assert rows["device"].result is Result.SKIPPED
    probe = probe_gpu(lambda name: fake_cupy(RuntimeError("cudaErrorNoDevice")))
    assert not probe.found and probe.why == "CuPy sees no CUDA device"
    rows = rows_by_name(probe, required=True)
    assert rows["cupy"].result is Result.OK and rows["cuda"].detail.startswith("runtime 13.0")
    assert rows["device"].result is Result.FAIL and "cudaErrorNoDevice" in rows["device"].detail


def test_mlx_rows_say_where_it_computes_or_why_not() -> None:
    def missing(name: str) -> ModuleType:
        raise ModuleNotFoundError("No module named 'mlx'")

    gone = probe_mlx(missing)
    assert not gone.found and gone.why.startswith("MLX is not installed (ModuleNotFoundError")
    assert mlx_row(gone, required=False).result is Result.INFO
    row = mlx_row(gone, required=True)  # --device mlx
    assert row.result is Result.FAIL and row.detail.endswith("pip install 'warmfleet[mlx]'")
    metal = mlx_row(MlxProbe(version="0.29.0", device="gpu"), required=True)
    assert (metal.result, metal.detail) == (Result.OK, "0.29.0, computing on Metal (the GPU)")


@pytest.mark.parametrize(
    ("asked", "apple", "gpu", "mlx", "expected"),
    [
        ("auto", False, False, True, "cpu"),  # MLX's CPU build is not picked by itself
        ("auto", True, False, True, "mlx"),  # a Mac: as its workers do
        ("auto", True, False, False, "cpu"),  # a Mac without the extra
        ("auto", False, True, True, "cuda"),
        ("mlx", False, False, True, "mlx"),
        ("cpu", True, True, True, "cpu"),
    ],
)
def test_auto_picks_the_device_a_worker_would(
    monkeypatch: pytest.MonkeyPatch, asked: str, apple: bool, gpu: bool, mlx: bool, expected: str
) -> None:
    monkeypatch.setattr(doctor, "apple_silicon", lambda: apple)
    probe = GpuProbe() if gpu else GpuProbe(why="CuPy is not installed")
    mlx_probe = MlxProbe(version="1", device="gpu") if mlx else MlxProbe(why="not installed")
    assert doctor.pick_device(asked, probe, mlx_probe) == expected


def test_device_cuda_without_a_gpu_exits_1_with_the_reason(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["doctor", "--device", "cuda", "--json"]) == EXIT_FAILED
    report = json.loads(capsys.readouterr().out)
    assert report["device"] is None and report["gpu_found"] is False
    failed = [c for c in report["checks"] if c["result"] == "fail"]
    assert [c["check"] for c in failed] in (["cupy"], ["device"])
    assert failed[0]["detail"].startswith("no GPU: ")


def test_every_engine_row_on_a_tiny_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_tiny_llama(tmp_path / "tiny.gguf", context_length=512)
    assert main(["doctor", "--device", "cpu", "--model", str(path), "--json"]) == 3
    report = json.loads(capsys.readouterr().out)
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["model"]["values"]["sha256"] == sha256_of(path)
    assert checks["load reference"]["values"]["weights"] == "float32"
    assert checks["reference cpu float32"]["result"] == "ok"
    assert checks["reference cpu float32"]["values"]["num_tokens"] == NUM_TOKENS
    assert checks["decode cpu float32 batch 8"]["values"]["tok_s"] > 0
    decodes = ["decode cpu float32 batch 1", "decode cpu float32 batch 8"]
    ends = ["reference cpu float32", "prefill cpu float32", *decodes, "weight reads cpu float32"]
    assert [c["check"] for c in report["checks"]][-5:] == ends
    reads = checks["weight reads cpu float32"]["values"]
    assert reads["gbs"] > 0 and reads["machine_gbs"] > 0
    assert checks["C kernels"]["values"]["isa"]
    assert checks["C kernels"]["values"]["chunk_rows"] == kernel_chunk_rows()
    assert checks["C kernels"]["values"]["attention_rows"] == kernel_attention_rows()
    assert checks["C kernels"]["values"]["threads"] == "OpenMP's threads"  # GCC has OpenMP
    # NumPy's wheels ship OpenBLAS: the kernels call it from their own threads
    assert checks["C kernels"]["values"]["blas_on_kernel_threads"] is True


def test_a_missing_model_file_fails_its_row(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["doctor", "--device", "cpu", "--model", str(tmp_path / "none.gguf"), "--json"]
    assert main(argv) == EXIT_FAILED
    checks = json.loads(capsys.readouterr().out)["checks"]
    assert checks[-1]["check"] == "model" and checks[-1]["result"] == "fail"
    assert checks[-1]["detail"].startswith("ModelNotFoundError: model file not found")


@pytest.mark.slow
def test_doctor_on_this_machine_passes_on_the_cpu(default_model_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "warmfleet.cli", "doctor"], capture_output=True,
                          text=True, timeout=300, check=False)  # fmt: skip
    assert done.returncode == EXIT_OK_CPU_ONLY, done.stdout + done.stderr
    rows = {line.split(" | ")[0].strip(): line.split(" | ")[1:] for line in
            done.stdout.splitlines()[2:-1]}  # fmt: skip
    assert rows["cupy"][0].strip() == "info" and rows["cupy"][1].startswith("no GPU: ")
    assert rows["reference cpu float32"][0].strip() == "ok"
    for name in ("prefill cpu float32", "decode cpu float32 batch 8"):
        assert float(rows[name][1].split()[0]) > 0
    assert done.stdout.splitlines()[-1].startswith("exit 3: every check passed, on the CPU")


@pytest.mark.slow
def test_doctor_json_on_this_machine(
    default_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["doctor", "--json", "--quick"]) == EXIT_OK_CPU_ONLY
    report = json.loads(capsys.readouterr().out)
    assert report["version"] == 1 and report["exit_code"] == EXIT_OK_CPU_ONLY
    assert report["device"] == "cpu" and report["gpu_found"] is False
    checks = {c["check"]: c for c in report["checks"]}
    assert set(checks["model"]) == {"check", "result", "detail", "values"}
    ref = checks["reference cpu float32"]
    assert ref["result"] == "ok" and ref["values"]["divergence"] is None
    assert ref["values"]["max_abs_diff"] <= ref["values"]["tol"] == 2e-3
    assert checks["load cpu float32"]["values"]["weights"] == "quantized"
    assert checks["benchmark cpu float32"]["result"] == "skipped"


@pytest.mark.slow
def test_float16_on_the_cpu_matches_the_float32_reference(
    default_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The GPU's dtype, run through the NumPy path: within float16's tolerance, the same
    greedy tokens (the norm's squares once overflowed float16 and gave garbage)."""
    assert main(["doctor", "--device", "cpu", "--dtype", "float16", "--json", "--quick"]) == 3
    checks = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    ref = checks["reference cpu float16"]
    assert ref["result"] == "ok", ref["detail"]
    assert ref["values"]["max_abs_diff"] <= ref["values"]["tol"] == 0.25
    assert ref["values"]["divergence"] is None


@pytest.mark.slow
def test_mlx_on_this_machine_matches_the_reference(
    default_model_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--device mlx checks the MLX backend (its CPU build here) against the CPU float32
    reference: a Mac owner's first command checks what the workers will run."""
    assert main(["doctor", "--device", "mlx", "--json", "--quick"]) == EXIT_OK_CPU_ONLY
    report = json.loads(capsys.readouterr().out)
    assert report["device"] == "mlx" and report["gpu_found"] is False
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["mlx"]["result"] == "ok" and checks["mlx"]["values"]["device"] == "cpu"
    assert checks["load mlx float32"]["values"]["device"] == "mlx"
    ref = checks["reference mlx float32"]
    assert ref["result"] == "ok", ref["detail"]
    assert ref["values"]["max_abs_diff"] <= ref["values"]["tol"] == 2e-3
    assert ref["values"]["divergence"] is None and ref["values"]["num_tokens"] == NUM_TOKENS
