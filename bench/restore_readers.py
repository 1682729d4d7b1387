"""The two readers of a session's block files on a disk resume into a host pool: the C kernels'
(engine/ops/csrc/frame_read.c: each reader thread's share in one call, off the GIL) and
Python's, block by block (engine/kv_files/block_file.py read_block), in one process.

    .venv/bin/python -m bench.restore_readers [--model PATH] [--repeats 5]
        [--kv-dtypes float32 float16 q8_0] [--beside float16] [--batch 8] [--steps 40]

1. A 2,000-token session of the model's shape restored alone into a pool, per KV dtype, with
   its files' pages dropped before (as a resume of a session spilled a while ago finds
   them) and kept: the two readers alternated, median of --repeats.
2. What restores cost the sessions a worker goes on decoding meanwhile (KV --beside): a
   batch's decode steps timed alone and while one reader restores such a session back to
   back from the page cache, into a pool of its own (the memory, the cores and the GIL are
   what they share): the C reader with its block readers at the worker's priority and at
   the lower one they run at (block_reads.READ_NICE), and Python's; each mode's decode step
   (median, 90th percentile) and the restores it completed a second. The modes alternated,
   --repeats rounds.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.kv_tiers_disk import drop_page_cache, random_kv, restore
from bench.table import print_table
from common.sampling import SamplingParams
from engine.engine import Engine
from engine.kv.frame_reads import frame_reads
from engine.kv.kv_pool import BLOCK_TOKENS, KVPool
from engine.kv_files import block_reads
from engine.kv_files.block_reads import READ_NICE
from engine.kv_files.kv_dtypes import kv_dtype_named
from engine.kv_files.spill_file import SpillStore
from engine.model import Model
from engine.sequence import Request
from engine.text.model_config import ModelConfig
from warmfleet.models import resolve_model

SESSION_TOKENS = 2000
READERS = ("C", "Python")
DTYPES = ("float32", "float16", "q8_0")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a GGUF file (default: the default model)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kv-dtypes", nargs="+", default=list(DTYPES), choices=DTYPES)
    parser.add_argument("--beside", default="float16", choices=DTYPES, help="KV of part 2")
    parser.add_argument("--batch", type=int, default=8, help="sessions decoding in part 2")
    parser.add_argument("--steps", type=int, default=40, help="decode steps timed a mode")
    return parser.parse_args()


class Session:
    """One spilled session of the model's shape in `dtype`, restored into a pool of its own."""

    def __init__(self, config: ModelConfig, dtype: np.dtype[Any], directory: Path) -> None:
        kv = random_kv(config, SESSION_TOKENS, dtype)
        self.store = SpillStore(directory, "bench")
        self.store.write("s", kv)
        self.paths = [p for p in self.store.directory.rglob("*") if p.is_file()]
        self.pool = KVPool(config, SESSION_TOKENS // BLOCK_TOKENS + 2, dtype, np)
        self.like = (config.num_layers, config.num_kv_heads, config.head_dim)
        self.dtype, self.v = dtype, kv.v

    def restore(self, reader: str, cold: bool) -> float:
        """One restore's seconds, by `reader`, its files' pages dropped first if `cold`."""
        if cold:
            drop_page_cache(self.paths)
        start = time.perf_counter()
        table = restore(self.store, self.pool, self.like, self.dtype, reader == "Python")
        took = time.perf_counter() - start
        table.release(forget=True)
        return took


def alone(config: ModelConfig, names: list[str], repeats: int, directory: Path) -> None:
    rows = []
    for name in names:
        session = Session(config, kv_dtype_named(name), directory / name)
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(repeats):
            for cold in (True, False):
                for reader in READERS:
                    times.setdefault((reader, cold), []).append(session.restore(reader, cold))
        ms = {key: statistics.median(t) * 1e3 for key, t in times.items()}
        mb = 2 * session.v.nbytes / 1e6
        for cold in (True, False):
            c, py = ms[("C", cold)], ms[("Python", cold)]
            pages = "dropped" if cold else "cached"
            rows.append((name, f"{mb:.1f}", pages, f"{c:.1f}", f"{py:.1f}", f"{py / c:.2f}x"))
    print(f"\nA {SESSION_TOKENS}-token session restored alone, median of {repeats}")
    header = ("KV", "MB", "its pages", "C reader (ms)", "Python (ms)", "Python / C")
    print_table(header, rows)


class Restores:
    """A session restored back to back on a thread by one reader, until stopped."""

    def __init__(self, session: Session) -> None:
        self.session, self.done, self._stop = session, 0, threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, reader: str) -> None:
        self.done, self._stop = 0, threading.Event()
        self._thread = threading.Thread(target=self._run, args=(reader,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self, reader: str) -> None:
        while not self._stop.is_set():
            self.session.restore(reader, cold=False)
            self.done += 1


def decoding(model: Model, batch: int) -> Engine:
    """An engine with `batch` sessions past their prefill, each with tokens to go."""
    engine = Engine(model)
    vocab = model.config.vocab_size
    for i in range(batch):
        ids = [int(t) for t in np.random.default_rng(i).integers(3, vocab, 200)]
        engine.add(Request(f"d{i}", ids, SamplingParams(max_tokens=100_000, ignore_eos=True)))
    while any(s.prefilling for s in engine.sequences.values()):
        engine.step()
    return engine


def timed_steps(engine: Engine, steps: int) -> list[float]:
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t)
    return times


# part 2's modes: the reader, and what its block readers add to their nice value
BESIDE = {
    "none": None,
    "C, nice +0": ("C", 0),
    "C": ("C", READ_NICE),
    "Python": ("Python", READ_NICE),
}


def readers_at(nice: int) -> None:
    """The block readers' pool made anew, its threads at nice + `nice`."""
    block_reads._readers().shutdown()
    block_reads._readers.cache_clear()
    block_reads.READ_NICE = nice


def beside(model: Model, args: argparse.Namespace, directory: Path) -> None:
    steps: dict[str, list[float]] = {m: [] for m in BESIDE}
    rates: dict[str, list[float]] = {m: [] for m in BESIDE}
    restores = Restores(Session(model.config, model.kv_dtype, directory))
    engine = decoding(model, args.batch)
    timed_steps(engine, 5)  # warm
    for _ in range(args.repeats):
        for mode, how in BESIDE.items():
            if how is not None:
                readers_at(how[1])
                restores.start(how[0])
            start = time.perf_counter()
            steps[mode] += timed_steps(engine, args.steps)
            if how is not None:
                restores.stop()
                rates[mode].append(restores.done / (time.perf_counter() - start))
    readers_at(READ_NICE)
    print(f"\nDecode steps of {args.batch} sessions (KV {args.beside}) beside restores of a")
    print(f"{SESSION_TOKENS}-token session back to back from the page cache, {args.repeats} rounds")
    print(f"(the block readers at nice +{READ_NICE} but where said)")
    rows = []
    for mode in BESIDE:
        ms = sorted(t * 1e3 for t in steps[mode])
        p90 = ms[int(0.9 * (len(ms) - 1))]
        rate = f"{statistics.median(rates[mode]):.1f}" if rates[mode] else ""
        rows.append((mode, f"{statistics.median(ms):.1f}", f"{p90:.1f}", rate))
    print_table(("restores by", "decode step (ms)", "p90 (ms)", "restores / s"), rows)


def main() -> None:
    args = parse_args()
    model = Model.load(resolve_model(args.model), kv_dtype=args.beside)
    assert frame_reads() is not None, "the C kernels have no frame reader (libxxhash-dev)"
    with tempfile.TemporaryDirectory(prefix="wf-readers-") as d:
        alone(model.config, args.kv_dtypes, args.repeats, Path(d) / "alone")
        beside(model, args, Path(d) / "beside")


if __name__ == "__main__":
    main()
