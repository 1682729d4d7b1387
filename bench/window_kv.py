"""What sliding-window layers save and what resuming inside their history costs.

    .venv/bin/python -m bench.window_kv [--model PATH] [--context 2000] [--reply 64]

First table: the KV bytes one session holds at 4k and 32k tokens on gpt-oss-20b's and
gpt-oss-120b's attention shapes (64 query and 8 KV heads of 64, every other layer on a
128-position window), windowed layers keeping only their window's blocks (this server)
against every block (a full-attention model of the same shape), in float16 and q8_0 KV.
Counted by the pool's own bookkeeping (PagedKV.nbytes): tables filled as prefill chunks do,
no forward pass.

Second table (with --model, a gpt-oss file such as bench.random_model gpt-oss-20b's): a
session of --context random tokens and a --reply token reply, then a turn that keeps the
prompt and rewrites the reply (as gpt-oss's template drops the reasoning of a turn). The
windowed layers released the blocks of the prompt's last window while the reply ran; they
take them back by hash from the pool (where they stay until their room is needed) and the
turn resumes at the prompt's end. The same turn after those blocks were reused for others
recomputes from the start. Tokens computed and time to first token, one Engine, every core.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from bench.table import print_table
from common.sampling import SamplingParams
from engine.engine import Engine
from engine.kv.kv_pool import BLOCK_TOKENS, KVPool
from engine.kv_files.kv_dtypes import kv_dtype_named
from engine.model import Model
from engine.sequence import Request
from engine.text.model_config import ModelConfig

SHAPES = {"gpt-oss-20b": 24, "gpt-oss-120b": 36}  # layers; the attention is the same
WINDOW, CHUNK = 128, 256


def shape(layers: int) -> ModelConfig:
    """gpt-oss's shape with this many layers (32 experts of 2880, 4 a token: unread here)."""
    return ModelConfig(
        architecture="gpt-oss",
        num_layers=layers,
        dim=2880,
        ffn_dim=2880,
        num_heads=64,
        num_kv_heads=8,
        head_dim=64,
        rms_eps=1e-5,
        rope_base=150000.0,
        context_length=131072,
        vocab_size=201088,
        num_experts=32,
        num_experts_used=4,
        expert_ffn_dim=2880,
        sliding_window=WINDOW,
    )


def held_bytes(config: ModelConfig, tokens: int, kv_dtype: str, windowed: bool) -> int:
    """Bytes one session of `tokens` positions holds, filled a prefill chunk at a time."""
    windows = [WINDOW if i % 2 == 0 and windowed else 0 for i in range(config.num_layers)]
    blocks = -(-tokens // BLOCK_TOKENS) + 1
    pool = KVPool(config, blocks, kv_dtype_named(kv_dtype), np, windows=windows)
    kv = pool.new_kv()
    for start in range(0, tokens, CHUNK):
        n = min(CHUNK, tokens - start)
        kv.prepare_write(start, n)
        kv.commit(list(range(start, start + n)))
    return kv.nbytes


def bytes_table() -> None:
    rows = []
    for name, layers in SHAPES.items():
        config = shape(layers)
        for kv_dtype in ("float16", "q8_0"):
            for tokens in (4096, 32768):
                full = held_bytes(config, tokens, kv_dtype, windowed=False)
                win = held_bytes(config, tokens, kv_dtype, windowed=True)
                mib = (f"{full / 2**20:.0f}", f"{win / 2**20:.0f}", f"{full / win:.2f}x")
                rows.append([name, kv_dtype, str(tokens), *mib])
    print_table(["shape", "KV", "tokens", "every block MiB", "window's MiB", "saved"], rows)


def turn(engine: Engine, ids: list[int], max_tokens: int, rid: str) -> tuple[int, float]:
    """Run one turn of session "s"; (tokens reused, seconds to its first token)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    t0 = time.perf_counter()
    seq = engine.add(Request(rid, ids, params, cache_key="s"))
    first = None
    while engine.has_work:
        for out in engine.step():
            if out.request_id == rid and first is None:
                first = time.perf_counter() - t0
    return seq.num_cached, first or 0.0


def resume_table(path: str, context: int, reply: int) -> None:
    model = Model.load(path, device="cpu")
    if not model.config.sliding_window:
        sys.exit(f"{path}: no sliding window in this model")
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, model.config.vocab_size, context)]
    rows = []
    for reused in (False, True):
        engine = Engine(model)
        turn(engine, prompt, reply, "1")
        if reused:  # every block the windows released given to others (hashes forgotten)
            for alloc in engine.pool.allocs[1:]:
                alloc.unref([alloc.allocate() for _ in range(alloc.num_free)])
        rewritten = [*prompt, *(int(t) for t in rng.integers(0, 1000, 32))]
        cached, ttft = turn(engine, rewritten, 4, "2")
        kept = "reused by others" if reused else "kept in the pool"
        rows.append(
            [kept, *map(str, (len(rewritten), cached, len(rewritten) - cached)), f"{ttft:.2f}"]
        )
    print_table(["released window blocks", "prompt", "reused", "computed", "TTFT s"], rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a gpt-oss GGUF file for the resume table")
    ap.add_argument("--context", type=int, default=2000)
    ap.add_argument("--reply", type=int, default=64)
    args = ap.parse_args()
    bytes_table()
    if args.model:
        resume_table(args.model, args.context, args.reply)


if __name__ == "__main__":
    main()
