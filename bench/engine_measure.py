"""The engine benchmark's measurements: the memory-bandwidth probes, the model loads and
the memory they add, and the timed prefill and decode of one workload on one device."""

from __future__ import annotations

import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numba import njit, prange

from bench.llamacpp import llamacpp_available, measure_llamacpp
from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv.kv_pool import BLOCK_TOKENS
from engine.model import Model
from engine.ops.kernels import SMALL_ROWS
from engine.sequence import Request
from warmfleet.doctor_bench import read_bandwidth_gbs

POOL_PROMPTS = 2  # prompts bench_prefill's pool holds

TEXT = (
    "The history of computing is a story of layers: each generation of engineers builds on "
    "the abstractions of the last, and the best of them remember what lies underneath. "
)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@njit(parallel=True, cache=True)
def _parallel_copy(src: np.ndarray, dst: np.ndarray) -> None:  # pragma: no cover
    chunk = 1 << 16
    for c in prange(src.shape[0] // chunk):
        dst[c * chunk : (c + 1) * chunk] = src[c * chunk : (c + 1) * chunk]


def copy_bandwidth_gbs(nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Best memory copy rate (bytes copied per second) on all the engine's threads, over a
    buffer as large as the weights, with every page touched first."""
    src = np.ones(nbytes // 4, dtype=np.float32)
    dst = np.zeros_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        _parallel_copy(src, dst)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


@dataclass(frozen=True, slots=True)
class Workload:
    """What every device runs in a round: the same, so that their ratios mean something."""

    prompt_ids: list[int]  # the prefill's prompt; each decode prompt is 16 tokens of it
    decode_tokens: int  # per sequence
    batches: tuple[int, ...]


def make_workload(
    model: Model, prompt_tokens: int, decode_tokens: int, batches: tuple[int, ...]
) -> Workload:
    """The same prompt for every device: `prompt_tokens` tokens of TEXT repeated."""
    text = TEXT * (prompt_tokens // 16 + 1)  # TEXT is about 32 tokens
    work = Workload(model.tokenizer.encode(text)[:prompt_tokens], decode_tokens, batches)
    assert len(work.prompt_ids) == prompt_tokens
    return work


def warm_up(model: Model, ids: list[int]) -> None:
    """One untimed prefill longer than SMALL_ROWS (the long-chunk path) and two decode
    steps: a first use (Metal compiling its kernels, the C kernels' build) is no figure."""
    engine = Engine(model)
    engine.add(Request("warm", ids[: 2 * SMALL_ROWS], SamplingParams(max_tokens=3)))
    while engine.has_work:
        engine.step()


def bench_prefill(model: Model, ids: list[int], repeats: int) -> float:
    """Tokens/s of prefilling `ids` with nothing cached (one chunk, first token included),
    the best of `repeats`, in one engine as a worker that has served a while runs it: each
    prompt starts with a token of its own, so no block of an earlier one is cached and the
    work is that of `ids`, and its blocks lie in pool pages written before. The pool holds
    POOL_PROMPTS such prompts and the untimed prefills write all of it; each later prompt
    takes the blocks of the oldest one cached. (A worker's pool is written once over as it
    fills, 6 MiB of pages a 512-token prefill of the default model: a 2 MiB page the
    process never had costs ~5 ms in this VM, 1-2 of them a layer, 4% more on AVX2; with a
    pool of the default size, which no prefill here fills, every prompt paid it.
    llama-batched-bench clears its cache when it creates it, which writes it all, and
    warms up.)"""
    config = EngineConfig(
        prefill_chunk_tokens=len(ids),
        step_prefill_tokens=len(ids),
        kv_pool_bytes=POOL_PROMPTS * (len(ids) + BLOCK_TOKENS) * model.bytes_per_token,
    )
    engine, vocab = Engine(model, config), model.config.vocab_size
    best = float("inf")
    for r in range(-POOL_PROMPTS, repeats):
        own = [(ids[0] + 2 + r) % vocab, *ids[1:]]
        engine.add(Request(f"p{r}", own, SamplingParams(max_tokens=1)))
        t = time.perf_counter()
        engine.step()
        if r >= 0:
            best = min(best, time.perf_counter() - t)
        while engine.has_work:
            engine.step()
    return len(ids) / best


def bench_decode(
    model: Model,
    prompt: list[int],
    batch: int,
    decode_tokens: int,
    repeats: int,
    prompt_tokens: int = 16,
) -> float:
    """Aggregate tokens/s of `batch` sequences decoding `decode_tokens` each, greedily, after
    prompts of `prompt_tokens` (prefill untimed)."""
    best = float("inf")
    for r in range(repeats):
        engine = Engine(model)
        for i in range(batch):
            # distinct prompts: the same prompt shifted by one token per sequence
            ids = prompt[i : i + prompt_tokens]
            assert len(ids) == prompt_tokens, "the prompt is too short for the batch"
            engine.add(Request(f"d{r}-{i}", ids, SamplingParams(max_tokens=decode_tokens + 1)))
        while any(s.prefilling for s in engine.sequences.values()) or engine.scheduler.waiting:
            engine.step()
        t = time.perf_counter()
        steps = 0
        while engine.has_work:
            engine.step()
            steps += 1
        best = min(best, (time.perf_counter() - t) / steps)
    return batch / best


@dataclass(slots=True)
class Figures:
    """One device's speeds in one run."""

    prefill_tok_s: float
    decode_tok_s: dict[int, float]  # by batch size

    def best(self, other: Figures | None) -> Figures:
        if other is None:
            return self
        decode = {b: max(v, other.decode_tok_s[b]) for b, v in self.decode_tok_s.items()}
        return Figures(max(self.prefill_tok_s, other.prefill_tok_s), decode)


@dataclass(slots=True)
class Bandwidth:
    """The CPU cores' memory rates (GB/s), the floor of a NumPy decode step."""

    copy_gbs: float
    read_gbs: float

    def best(self, other: Bandwidth | None) -> Bandwidth:
        if other is None:
            return self
        return Bandwidth(max(self.copy_gbs, other.copy_gbs), max(self.read_gbs, other.read_gbs))


@dataclass(slots=True)
class Loaded:
    """A model on one device and the memory its load took."""

    device: str
    model: Model
    rss_bytes: int | None  # the RSS the load added; None without /proc (macOS)
    mlx_bytes: int | None  # MLX's active memory the load added; None off MLX


def best_of(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """llama.cpp's figures of two rounds: the higher rates, the shorter times."""
    if not a:
        return b
    return {k: (max if k.endswith("tok_s") else min)(v, b[k]) for k, v in a.items()}


def measure_bandwidth() -> Bandwidth:
    log("measuring memory bandwidth")
    return Bandwidth(copy_bandwidth_gbs(), read_bandwidth_gbs())


def measure(model: Model, work: Workload) -> Figures:
    """The prefill of the workload's prompt and decode at each of its batch sizes, once."""
    log(f"{model.device}: prefill")
    prefill = bench_prefill(model, work.prompt_ids, 1)
    decode: dict[int, float] = {}
    for b in work.batches:
        log(f"{model.device}: decode, batch {b}")
        decode[b] = bench_decode(model, work.prompt_ids, b, work.decode_tokens, 1)
    return Figures(prefill, decode)


def measure_reference(path: Path, work: Workload, threads: int) -> dict[str, float]:
    """llama.cpp's figures on the same file; empty when llama-cpp-python is not installed."""
    if not llamacpp_available():
        return {}
    log("llama.cpp on the same file")
    return measure_llamacpp(str(path), work.prompt_ids, work.decode_tokens, threads, 1)


def rss_bytes() -> int | None:
    """This process's resident memory now; None where there is no /proc (macOS)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except FileNotFoundError:
        return None


def peak_rss_mib() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes there, KiB here


def mlx_active_bytes(device: str) -> int | None:
    if device != "mlx":
        return None
    import mlx.core as mx

    return int(mx.get_active_memory())


def load(path: Path, device: str, weights: str) -> Loaded:
    log(f"loading {path.name} on {device} (weights {weights})")
    rss_before, mlx_before = rss_bytes(), mlx_active_bytes(device)
    model = Model.load(path, device=device, weights=weights)
    rss_after, mlx_after = rss_bytes(), mlx_active_bytes(device)
    return Loaded(
        device,
        model,
        None if rss_before is None or rss_after is None else rss_after - rss_before,
        None if mlx_before is None or mlx_after is None else mlx_after - mlx_before,
    )
