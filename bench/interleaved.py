"""What repacking 32-weight blocks (Q8_0, MXFP4) 16 rows to a group would buy their
products: the engine's kernel against a prototype (bench/csrc/interleaved.c) on the same
bytes of a model file, at 1, 8 and 32 activation rows:

    .venv/bin/python -m bench.interleaved --model FILE [--threads 2] [--repeats 7]

The engine's kernels reduce each block's integer sums across a vector's lanes before the
block's float step, for 4 weight rows and up to 4 activation rows a tile. The prototype
repacks the weights so that one vector holds 4 weights of each of 16 rows: vpdpbusd leaves
each row's exact block sum in its own lane and the float step (the engine's formula for each
output) runs for 16 outputs at once. "equal" says whether the outputs are the engine's bits.
Two matrices: the file's output matrix (Q8_0 in bench.random_model's files) and layer 0's
gate experts taken as one matrix (MXFP4 in gpt-oss's). Each timing is the best of
--repeats, the activations' quantization included on both sides. AVX-512 VNNI only.
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

SOURCE = Path(__file__).parent / "csrc" / "interleaved.c"
KINDS = {8: 0, 39: 1}  # GGML type -> the prototype's kind (Q8_0, MXFP4)


def build(directory: Path) -> ctypes.CDLL:
    library = directory / "interleaved.so"
    subprocess.run(["cc", *FLAGS, "-o", str(library), str(SOURCE)], check=True)
    lib = ctypes.CDLL(str(library))
    p, i64, i = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.wf_il_group_block_bytes.restype = i64
    lib.wf_il_group_block_bytes.argtypes = [i]
    lib.wf_il_pack.argtypes = [i, p, i64, i64, p]
    lib.wf_il_quantize.argtypes = [p, i64, p, p, p]
    lib.wf_il_rows.argtypes = [i, p, i64, i64, i, p, p, p, p, i]
    return lib


def compare(
    lib: ctypes.CDLL, name: str, m: ExpertMatrix, b: int, threads: int, repeats: int
) -> list[str]:
    rows, nb, kind = m.data.shape[0] * m.data.shape[1], m.k // 32, KINDS[int(m.qtype)]
    flat = ExpertMatrix(m.qtype, m.data.reshape(1, rows, -1), m.k)
    packed = np.empty((rows // 16) * nb * lib.wf_il_group_block_bytes(kind), dtype=np.uint8)
    lib.wf_il_pack(kind, address(m.data), rows, nb, address(packed))
    x = np.random.default_rng(0).standard_normal((b, m.k)).astype(np.float32)
    q = np.empty((b, m.k), dtype=np.int8)
    d = np.empty((b, nb), dtype=np.float32)
    zero = np.empty((b, nb), dtype=np.int32)
    out = np.empty((b, rows), dtype=np.float32)

    def prototype() -> None:
        lib.wf_il_quantize(address(x), b * m.k, address(q), address(d), address(zero))
        lib.wf_il_rows(kind, address(packed), rows, nb, b, address(q), address(d),
                       address(zero), address(out), threads)  # fmt: skip

    ours_ms, proto_ms = best_ms(lambda: matmul_t(x, flat), repeats), best_ms(prototype, repeats)
    want = matmul_t(x, flat)
    equal = np.array_equal(out.view(np.uint32), want.view(np.uint32))
    mb = m.data.nbytes / 1e6
    ours, proto = (f"{ms:.1f} ({mb / ms:.1f} GB/s)" for ms in (ours_ms, proto_ms))
    return [name, str(b), ours, proto, f"{ours_ms / proto_ms:.2f}x", "yes" if equal else "NO"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", type=Path, required=True, metavar="FILE")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
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
            for b in args.batches
        ]
    header = ["matrix", "rows", "engine ms", "repacked ms", "speed-up", "equal bits"]
    print_table(header, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
