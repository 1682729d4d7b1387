"""llama.cpp (llama-cpp-python) side of the engine benchmark."""

from __future__ import annotations

import ctypes
import importlib.util
import time
from typing import Any


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
    import numpy as np

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
        prefill = decode = save = restore = raw_save = raw_restore = float("inf")
        state_bytes = 0
        for _ in range(repeats):
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(prompt_ids)
            prefill = min(prefill, time.perf_counter() - t0)

            t0 = time.perf_counter()
            state = llm.save_state()
            save = min(save, time.perf_counter() - t0)
            state_bytes = int(state.llama_state_size)
            t0 = time.perf_counter()
            llm.load_state(state)
            restore = min(restore, time.perf_counter() - t0)
            t0 = time.perf_counter()
            buf = (ctypes.c_uint8 * llama_cpp.llama_state_get_size(llm.ctx))()
            n = llama_cpp.llama_state_get_data(llm.ctx, buf, len(buf))
            raw_save = min(raw_save, time.perf_counter() - t0)
            t0 = time.perf_counter()
            if llama_cpp.llama_state_set_data(llm.ctx, buf, n) != n:
                raise RuntimeError("llama_state_set_data failed")
            raw_restore = min(raw_restore, time.perf_counter() - t0)

            llm.reset()
            llm.eval(prompt_ids[:16])
            tok = _greedy_next(llm, llama_cpp, np)
            t0 = time.perf_counter()
            for _ in range(decode_tokens):
                llm.eval([tok])
                tok = _greedy_next(llm, llama_cpp, np)
            decode = min(decode, time.perf_counter() - t0)
    finally:
        llm.close()
    return {
        "prefill_tok_s": len(prompt_ids) / prefill,
        "decode_tok_s": decode_tokens / decode,
        "state_save_ms": save * 1e3,
        "state_restore_ms": restore * 1e3,
        "raw_state_save_ms": raw_save * 1e3,
        "raw_state_restore_ms": raw_restore * 1e3,
        "state_bytes": float(state_bytes),
    }
