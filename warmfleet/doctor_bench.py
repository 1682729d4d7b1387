"""`warmfleet doctor`'s short engine benchmark: prefill and decode speed through the engine on
the device under test, a few seconds in all. (bench/engine.py is the full benchmark; it is not
part of the installed package.)"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from common.sampling import SamplingParams
from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv.kv_pool import BLOCK_TOKENS
from engine.model import Model
from engine.ops import blas
from engine.sequence import Request

PREFILL_TOKENS = 256
DECODE_TOKENS = 32  # per sequence, at most
DECODE_PROMPT_TOKENS = 16
BATCHES = (1, 8)
PHASE_BUDGET_S = 4.0  # a decode run stops after this long, whatever it has measured
TEXT = (
    "Warm sessions let many agents share one small model: each keeps its cache, and the "
    "engine batches their steps so the weights are read once for all of them. "
)


def read_bandwidth_gbs(nbytes: int = 512 << 20, repeats: int = 5) -> float:
    """Best rate of streaming a weights-sized buffer through the cores (bytes read/s): a
    BLAS matrix-vector product over it, vectorized and on every thread. (A Numba sum loop
    measured 10 GB/s here, bound by its scalar additions: 30 GB/s on a buffer in cache.
    BLAS reads 52 GB/s; a hand-written C loop of 512-bit adds, 80.) BLAS gets the configured
    threads for it, where the C kernels hold it to one (engine/ops/blas.py)."""
    src = np.ones((nbytes // 4 // 4096, 4096), dtype=np.float32)
    ones = np.ones(4096, dtype=np.float32)
    best = float("inf")
    with threadpool_limits(blas.POOL.configured, user_api="blas"):
        for _ in range(repeats):
            t = time.perf_counter()
            src @ ones
            best = min(best, time.perf_counter() - t)
    return src.nbytes / best / 1e9


@dataclass(frozen=True, slots=True)
class Speed:
    prefill_tok_s: float
    decode_tok_s: dict[int, float]  # aggregate, by batch size
    decode_steps: dict[int, int]  # steps timed, by batch size


def _engine(model: Model) -> Engine:
    """An engine with a KV pool just large enough (the default one takes gigabytes, which a
    GPU would allocate at once)."""
    tokens = max(BATCHES) * (PREFILL_TOKENS + DECODE_TOKENS + BLOCK_TOKENS)
    config = EngineConfig(
        max_running=max(BATCHES), prefill_chunk_tokens=PREFILL_TOKENS,
        step_prefill_tokens=PREFILL_TOKENS, session_budget_bytes=0,
        kv_pool_bytes=tokens * model.bytes_per_token,
    )  # fmt: skip
    return Engine(model, config)


def time_prefill(model: Model, ids: list[int], repeats: int = 2) -> float:
    """Tokens/s of prefilling `ids` in one step from an empty cache (best of `repeats`, or
    of those begun within PHASE_BUDGET_S: a slow device's one step is enough)."""
    best = float("inf")
    deadline = time.perf_counter() + PHASE_BUDGET_S
    for r in range(repeats):
        if r and time.perf_counter() > deadline:
            break
        engine = _engine(model)
        engine.add(Request(f"prefill-{r}", ids, SamplingParams(max_tokens=1)))
        t0 = time.perf_counter()
        engine.step()
        best = min(best, time.perf_counter() - t0)
    return len(ids) / best


def time_decode(model: Model, ids: list[int], batch: int) -> tuple[float, int]:
    """Aggregate tokens/s of `batch` sequences decoding together after their prefill, from
    the median step (a short run on a shared machine has outliers), and the number of steps
    timed (at most DECODE_TOKENS - 1, fewer past PHASE_BUDGET_S)."""
    engine = _engine(model)
    sampling = SamplingParams(max_tokens=DECODE_TOKENS, ignore_eos=True)
    for i in range(batch):  # distinct prompts: shifted by one token each
        engine.add(Request(f"decode-{i}", ids[i : i + DECODE_PROMPT_TOKENS], sampling))
    while engine.scheduler.waiting or any(s.prefilling for s in engine.sequences.values()):
        engine.step()
    steps_s: list[float] = []
    deadline = time.perf_counter() + PHASE_BUDGET_S
    while engine.has_work and time.perf_counter() < deadline:
        t0 = time.perf_counter()
        engine.step()
        steps_s.append(time.perf_counter() - t0)
    for request_id in list(engine.sequences):
        engine.abort(request_id)
    return batch / statistics.median(steps_s), len(steps_s)


def measure(model: Model) -> Speed:
    """Prefill of PREFILL_TOKENS and decode at each of BATCHES, after a warm-up step."""
    _engine(model).warm_up()
    ids = model.tokenizer.encode(TEXT * (PREFILL_TOKENS // 16))[:PREFILL_TOKENS]
    prefill = time_prefill(model, ids)
    decode, steps = {}, {}
    for b in BATCHES:
        decode[b], steps[b] = time_decode(model, ids, b)
    return Speed(prefill, decode, steps)
