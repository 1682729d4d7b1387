"""What folding the float step per lane would buy the one-row products of 32-weight blocks
(Q8_0, MXFP4): the engine's kernel against a prototype (bench/csrc/lane_tree.c) on the same
bytes of a model file, at 1, 8 and 32 activation rows:

    .venv/bin/python -m bench.lane_tree --model FILE [--threads 2] [--repeats 7]

The engine's kernels reduce each block's integer dot product (per pair of blocks on
AVX-512) to one sum before its float step, so a row's 32 weights cost a horizontal
reduction and a float step; the prototype keeps a block's 8 lane sums, converts and scales
them into 8 float accumulators and adds the lanes once per row (a fixed tree, which every
build could share). Two matrices: the file's output matrix (Q8_0 in bench.random_model's
files) and layer 0's gate experts taken as one matrix (MXFP4 in gpt-oss's). Each timing is
the best of --repeats; "agree" is the largest difference between the two results relative
to the largest output (different summation orders, so not the same bits). The prototype
takes 8 activation rows a pass over the weights, one weight row at a time (no register
tiles). AVX-512 VNNI only.
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from bench.moe_parts import best_ms
from bench.table import print_table
from engine.device import set_threads
from engine.model import Model
from engine.ops.kernels import matmul_t
from engine.ops.native import FLAGS, address
from engine.ops.quant.experts import ExpertMatrix

SOURCE = Path(__file__).parent / "csrc" / "lane_tree.c"
KINDS = {8: 0, 39: 1}  # GGML type -> the prototype's kind (Q8_0, MXFP4)
TILE = 8  # activation rows a pass of the prototype


def build(directory: Path) -> ctypes.CDLL:
    library = directory / "lane_tree.so"
    subprocess.run(["cc", *FLAGS, "-o", str(library), str(SOURCE)], check=True)
    lib = ctypes.CDLL(str(library))
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    lib.wf_lane_rows.argtypes = [ctypes.c_int, p, i64, i64, ctypes.c_int, p, p, p, p, ctypes.c_int]
    return lib


def quantized(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x [m, k] as int8 codes, per-32 scales and per-lane (4 codes) sums."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = np.abs(blocks).max(axis=2) / 127
    q = np.round(blocks / np.where(d > 0, d, 1)[:, :, None]).astype(np.int8)
    sums = q.reshape(x.shape[0], -1, 8, 4).sum(axis=3, dtype=np.int32)
    return np.ascontiguousarray(q), d.astype(np.float32), np.ascontiguousarray(sums)


def compare(
    lib: ctypes.CDLL, name: str, m: ExpertMatrix, b: int, threads: int, repeats: int
) -> list[str]:
    rows, nb = m.data.shape[0] * m.data.shape[1], m.k // 32
    flat = ExpertMatrix(m.qtype, m.data.reshape(1, rows, -1), m.k)
    x = np.random.default_rng(0).standard_normal((b, m.k)).astype(np.float32)
    tiles = [quantized(x[i : i + TILE]) for i in range(0, b, TILE)]
    out = np.empty((b, rows), dtype=np.float32)

    def prototype() -> None:  # TILE activation rows a pass over the weights
        kind, weights = KINDS[int(m.qtype)], address(m.data)
        for i, (q, d, sums) in enumerate(tiles):
            acts = (address(q), address(d), address(sums), address(out[i * TILE :]))
            lib.wf_lane_rows(kind, weights, rows, nb, len(q), *acts, threads)

    ours_ms, proto_ms = best_ms(lambda: matmul_t(x, flat), repeats), best_ms(prototype, repeats)
    want = matmul_t(x, flat)
    agree = float(np.abs(out - want).max() / np.abs(want).max())
    mb = m.data.nbytes / 1e6
    ours, proto = (f"{ms:.1f} ({mb / ms:.1f} GB/s)" for ms in (ours_ms, proto_ms))
    return [name, str(b), ours, proto, f"{ours_ms / proto_ms:.2f}x", f"{agree:.1e}"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, metavar="FILE")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    set_threads(args.threads)
    model = Model.load(args.model)
    output, moe = model.weights.output, model.weights.layers[0].moe
    matrices = [("output", output)] + ([("layer 0 gate experts", moe.gate)] if moe else [])
    with tempfile.TemporaryDirectory() as tmp:
        lib = build(Path(tmp))
        rows = [
            compare(lib, name, m, b, args.threads, args.repeats)
            for name, m in matrices
            if isinstance(m, ExpertMatrix) and int(m.qtype) in KINDS
            for b in (1, 8, 32)
        ]
    header = ["matrix", "rows", "engine ms", "per-lane ms", "speed-up", "agree"]
    print_table(header, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
