"""A mixture-of-experts file asking for what the engine does not build is refused at load
with a message naming it: left out, each would make the output wrong. And the CLI says so
in one line, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

from common.errors import UnsupportedModelError
from engine.model import Model
from tests.tiny_families import write_tiny

REPO = Path(__file__).resolve().parents[2]
SHARED = np.zeros((64, 128), dtype=np.float32)
Extras = dict[str, int | float | bool | np.ndarray]
CASES: dict[str, tuple[Extras, str]] = {
    "shared experts (metadata)": ({"expert_shared_count": 1}, "shared experts"),
    "shared experts (tensor)": ({"blk.0.ffn_gate_shexp.weight": SHARED}, "shared experts"),
    "sigmoid router": ({"expert_gating_func": 2}, "sigmoid router"),
    "grouped routing": ({"expert_group_count": 4, "expert_group_used_count": 2}, "grouped"),
    "selection biases": ({"blk.1.exp_probs_b.bias": np.zeros(8, np.float32)}, "biased routing"),
    "expert biases": ({"blk.2.ffn_down_exps.bias": np.zeros((8, 128), np.float32)}, "biases"),
    "router biases": ({"blk.0.ffn_gate_inp.bias": np.zeros(8, np.float32)}, "router biases"),
    "scaled weights": ({"expert_weights_scale": 2.5}, "scaled expert weights"),
    "unnormalised weights": ({"expert_weights_norm": False}, "unnormalised"),
    "leading dense layers": ({"leading_dense_block_count": 1}, "leading dense layers"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_unbuilt_variant_is_refused_by_name(tmp_path: Path, case: str) -> None:
    extras, named = CASES[case]
    path = write_tiny(tmp_path / "moe.gguf", "qwen3moe", extras=extras)
    with pytest.raises(UnsupportedModelError, match=named):
        Model.load(path, device="cpu")


def test_experts_in_a_dense_family_are_refused(tmp_path: Path) -> None:
    experts = np.zeros((8, 64, 128), dtype=np.float32)
    path = write_tiny(
        tmp_path / "qwen3.gguf", "qwen3", extras={"blk.0.ffn_up_exps.weight": experts}
    )
    with pytest.raises(
        UnsupportedModelError, match=r"blk\.0\.ffn_up_exps\.weight.*experts in a qwen3"
    ):
        Model.load(path, device="cpu")


def test_experts_of_a_type_without_a_kernel_are_refused(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "moe.gguf", "qwen3moe", matrix_type=gguf.GGMLQuantizationType.Q8_0)
    data = bytearray(path.read_bytes())
    # gguf-py writes no IQ4_NL: give one expert tensor that type id in the header (its
    # blocks are smaller than Q8_0's, so the tensor still lies inside the file)
    at = data.index(b"blk.0.ffn_up_exps.weight") + len(b"blk.0.ffn_up_exps.weight")
    dims = int.from_bytes(data[at : at + 4], "little")
    type_at = at + 4 + 8 * dims
    assert int.from_bytes(data[type_at : type_at + 4], "little") == gguf.GGMLQuantizationType.Q8_0
    data[type_at : type_at + 4] = int(gguf.GGMLQuantizationType.IQ4_NL).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    with pytest.raises(UnsupportedModelError, match=r"ffn_up_exps.*experts of type IQ4_NL"):
        Model.load(path, device="cpu")


def test_experts_in_float16_compute_are_refused(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "moe.gguf", "qwen3moe")
    with pytest.raises(UnsupportedModelError, match=r"qwen3moe: the experts compute in float32"):
        Model.load(path, device="cpu", dtype="float16")


def test_the_cli_refuses_in_one_line(tmp_path: Path) -> None:
    path = write_tiny(tmp_path / "moe.gguf", "qwen3moe", extras={"expert_gating_func": 2})
    argv = [
        sys.executable,
        "-m",
        "warmfleet.cli",
        "generate",
        "--model",
        str(path),
        "--prompt",
        "hi",
    ]
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "sigmoid router" in done.stderr and "Traceback" not in done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, done.stderr
