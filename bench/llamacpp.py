"""llama.cpp (llama-cpp-python) side of the engine benchmark."""

from __future__ import annotations

import ctypes
import importlib.util
import time
from typing import Any

# what one round times, in seconds; measure_llamacpp keeps the best of each
_TIMINGS = ("prefill", "save", "restore", "raw_save", "raw_restore", "decode")


def llamacpp_available() -> bool:
    """True when the llama_cpp package can be imported."""
    return importlib.util.find_spec("llama_cpp") is not None


def _greedy_next(llm: Any, llama_cpp: Any, np: Any) -> int:
    # eval() with logits_all=False keeps no logits in llm.scores: read the last row directly.
    ptr = llama_cpp.llama_get_logits_ith(llm.ctx, -1)
    return int(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)).argmax())


def measure_llamacpp(
    model_path: str,
    prompt_ids: list[int],
    decode_tokens: int = 128,
    threads: int = 2,
    repeats: int = 3,
) -> dict[str, float]:
    """Measure a GGUF model under llama.cpp; every timing is the best of `repeats`.

    - prefill_tok_s: len(prompt_ids) / time to evaluate the whole prompt from an empty cache.
    - decode_tok_s: decode_tokens / time of a single-stream greedy loop (one token per eval
      call) after a 16-token prompt; the short prompt's prefill is not counted.
    - state_save_ms / state_restore_ms: Llama.save_state() / load_state() of the state after
      the full prompt (KV cache plus the wrapper's token and logit bookkeeping).
      The wrapper also copies its n_batch x n_vocab logit buffer (~100 MB here) each way.
    - raw_state_save_ms / raw_state_restore_ms: the same state through llama.cpp's own
      llama_state_get_data / llama_state_set_data, without the wrapper's copies.
    - state_bytes: size of the serialized llama.cpp state after the full prompt.
    """
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=model_path,
        n_ctx=2048,
        n_threads=threads,
        n_threads_batch=threads,
        n_batch=512,
        verbose=False,
        logits_all=False,
    )
    try:
        best = dict.fromkeys(_TIMINGS, float("inf"))
        state_bytes = 0
        for _ in range(repeats):
            times, state_bytes = _one_round(llm, llama_cpp, prompt_ids, decode_tokens)
            best = {name: min(best[name], times[name]) for name in _TIMINGS}
    finally:
        llm.close()
    return {
        "prefill_tok_s": len(prompt_ids) / best["prefill"],
        "decode_tok_s": decode_tokens / best["decode"],
        "state_save_ms": best["save"] * 1e3,
        "state_restore_ms": best["restore"] * 1e3,
        "raw_state_save_ms": best["raw_save"] * 1e3,
        "raw_state_restore_ms": best["raw_restore"] * 1e3,
        "state_bytes": float(state_bytes),
    }


def _one_round(
    llm: Any, llama_cpp: Any, prompt_ids: list[int], decode_tokens: int
) -> tuple[dict[str, float], int]:
    """One timing (seconds) of each of _TIMINGS, and the wrapper's state size in bytes: the
    prompt from an empty cache, its state saved and restored both ways, then the decode."""
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt_ids)
    prefill = time.perf_counter() - t0
    save, restore, state_bytes = _time_wrapper_state(llm)
    raw_save, raw_restore = _time_raw_state(llm, llama_cpp)
    decode = _time_decode(llm, llama_cpp, prompt_ids[:16], decode_tokens)
    times = {
        "prefill": prefill,
        "save": save,
        "restore": restore,
        "raw_save": raw_save,
        "raw_restore": raw_restore,
        "decode": decode,
    }
    return times, state_bytes


def _time_wrapper_state(llm: Any) -> tuple[float, float, int]:
    """Seconds of Llama.save_state() and of load_state() of the current state, and its size."""
    t0 = time.perf_counter()
    state = llm.save_state()
    save = time.perf_counter() - t0
    state_bytes = int(state.llama_state_size)
    t0 = time.perf_counter()
    llm.load_state(state)
    return save, time.perf_counter() - t0, state_bytes


def _time_raw_state(llm: Any, llama_cpp: Any) -> tuple[float, float]:
    """Seconds of llama_state_get_data and of llama_state_set_data of the current state."""
    t0 = time.perf_counter()
    buf = (ctypes.c_uint8 * llama_cpp.llama_state_get_size(llm.ctx))()
    n = llama_cpp.llama_state_get_data(llm.ctx, buf, len(buf))
    save = time.perf_counter() - t0
    t0 = time.perf_counter()
    if llama_cpp.llama_state_set_data(llm.ctx, buf, n) != n:
        raise RuntimeError("llama_state_set_data failed")
    return save, time.perf_counter() - t0


def _time_decode(llm: Any, llama_cpp: Any, prompt_ids: list[int], decode_tokens: int) -> float:
    """Seconds of `decode_tokens` greedy steps, one token per eval, after `prompt_ids`
    (whose prefill is not timed) from an empty cache."""
    import numpy as np

    llm.reset()
    llm.eval(prompt_ids)
    tok = _greedy_next(llm, llama_cpp, np)
    t0 = time.perf_counter()
    for _ in range(decode_tokens):
        llm.eval([tok])
        tok = _greedy_next(llm, llama_cpp, np)
    return time.perf_counter() - t0


def decode_rate_at(model_path: str, prompt_ids: list[int], steps: int, threads: int) -> float:
    """llama.cpp's single-stream greedy decode tokens/s after `prompt_ids` (its prefill not
    timed): how a context's length slows one stream's steps."""
    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=model_path, n_ctx=len(prompt_ids) + steps + 16, n_threads=threads,
        n_threads_batch=threads, n_batch=512, verbose=False, logits_all=False,
    )  # fmt: skip
    try:
        return steps / _time_decode(llm, llama_cpp, prompt_ids, steps)
    finally:
        llm.close()
