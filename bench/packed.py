"""What packing a matrix 16 rows to a group buys its integer products (engine/ops/csrc/
int_packed.c, AVX-512 VNNI builds: Q8_0 and MXFP4): the engine's kernels on the file's
blocks against the same matrix packed, at 1, 8 and 32 activation rows:

    .venv/bin/python -m bench.packed --model FILE [--threads 2] [--repeats 7]

Two matrices: the file's output matrix (Q8_0 in bench.random_model's q8_0 files) and
layer 0's gate experts taken as one matrix (MXFP4 in gpt-oss's; the
loader leaves experts in the file). Each timing is the best of --repeats, alternated, the
activations' quantization included; "equal bits" says the packed outputs are the file's
blocks' bits, as they must be.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import gguf
import numpy as np

from bench.moe_parts import best_ms
from bench.table import print_table
from engine.device import set_threads
from engine.ops.quant.experts import ExpertMatrix
from engine.ops.quant.experts_native import ExpertKernels, Products, load
from engine.text.gguf_file import open_gguf


def in_file(path: Path, name: str, experts: bool) -> ExpertMatrix | None:
    """The tensor's blocks as one matrix of the file's rows (None: not in the file)."""
    tensor = next((t for t in open_gguf(path).tensors if t.name == name), None)
    if tensor is None:
        return None
    k = int(tensor.shape[0])
    rows = int(np.prod(tensor.shape[1:])) if experts else int(tensor.shape[1])
    raw = np.asarray(tensor.data).view(np.uint8).reshape(1, rows, -1)
    return ExpertMatrix(gguf.GGMLQuantizationType(tensor.tensor_type), raw, k)


def compare(
    kernels: ExpertKernels, name: str, raw: ExpertMatrix, b: int, threads: int, repeats: int
) -> list[str] | None:
    packed = kernels.pack(raw, threads)
    if packed is None:
        return None
    x = np.random.default_rng(0).standard_normal((b, raw.k)).astype(np.float32)
    rows, starts = np.arange(b, dtype=np.int64), np.array([0, b], dtype=np.int64)
    outs = {m.packed: np.empty((b, m.n), dtype=np.float32) for m in (raw, packed)}

    def run(m: ExpertMatrix) -> None:
        kernels.matmul(m, x, rows, starts, outs[m.packed], threads, Products.INTEGER)

    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for m in (raw, packed):
            times[m.packed].append(best_ms(functools.partial(run, m), 1))
    file_ms, packed_ms = min(times[False]), min(times[True])
    equal = np.array_equal(outs[True].view(np.uint32), outs[False].view(np.uint32))
    mb = raw.nbytes / 1e6
    a, p = (f"{ms:.1f} ({mb / ms:.1f} GB/s)" for ms in (file_ms, packed_ms))
    kind = f"{name} ({raw.qtype.name})"
    return [kind, str(b), a, p, f"{file_ms / packed_ms:.2f}x", "yes" if equal else "NO"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, metavar="FILE")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    args = p.parse_args(argv)
    kernels = load()
    if kernels is None:
        raise SystemExit("the C kernels are not built here")
    set_threads(args.threads)
    matrices = [
        ("output", "output.weight", False),
        ("gate experts", "blk.0.ffn_gate_exps.weight", True),
    ]
    rows = []
    for name, tensor, experts in matrices:
        raw = in_file(args.model, tensor, experts)
        if raw is None:
            continue
        for b in args.batches:
            row = compare(kernels, name, raw, b, args.threads, args.repeats)
            if row is None:
                print(f"{name}: {raw.qtype.name} is not packed by this build")
                break
            rows.append(row)
    header = ["matrix", "rows", "file's blocks ms", "packed ms", "speed-up", "equal bits"]
    print_table(header, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
