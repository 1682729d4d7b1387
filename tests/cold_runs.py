"""Greedy references in the test process: cold runs on one engine per model, kept.

A new engine's pool is new memory, and NumPy asks for huge pages for it: a prefill's first
step faults in a 2 MB page for each layer's keys and each layer's values (~60 for the
default model), which took 0.5-1 s on a VM's cores. With an engine made per reference,
that was most of some cluster tests' time. The kept engine's pool holds POOL_TOKENS
positions (more where one call needs more), so what it touches stays small. Each call runs
in a KV scope of its own, so no block an earlier call computed is reused: every call still
computes from nothing, and the requests of one call share prefixes as on a new engine."""

from __future__ import annotations

import dataclasses
import itertools

from engine.config import EngineConfig
from engine.engine import Engine, StepOutput
from engine.kv.kv_pool import BLOCK_TOKENS
from engine.model import Model
from engine.sequence import Request

KEPT = 2  # engines kept, the most recently used: a test file's model and the odd other
POOL_TOKENS = 8192  # ~190 MB of float16 KV for the default model
_engines: list[Engine] = []
_calls = itertools.count()


def cold_outputs(model: Model, requests: list[Request]) -> dict[str, list[StepOutput]]:
    """Every step's outputs of `requests` run together to their end, by request id."""
    engine = _engine(model, max(POOL_TOKENS, _positions(model, requests)))
    scope = f"cold-{next(_calls)}"
    return engine.generate([dataclasses.replace(r, scope=scope) for r in requests])


def cold_ids(model: Model, request: Request) -> list[int]:
    """The tokens `request` generates, run alone."""
    return [t for o in cold_outputs(model, [request])[request.request_id] for t in o.token_ids]


def _positions(model: Model, requests: list[Request]) -> int:
    """The most positions the requests can hold at once, each to its last block."""
    context = model.config.context_length
    ends = (len(r.prompt_ids) + len(r.generated) + r.sampling.max_tokens for r in requests)
    return sum(min(end, context) + BLOCK_TOKENS for end in ends)


def _engine(model: Model, positions: int) -> Engine:
    """The model's kept engine if it is idle and its pool holds `positions`, else a new one
    (kept in its place)."""
    found = next((e for e in _engines if e.model is model), None)
    if found is not None:
        _engines.remove(found)
    fits = found is not None and found.pool.alloc.num_blocks * BLOCK_TOKENS >= positions
    if found is None or not fits or found.has_work:  # has_work: a run that raised midway
        config = EngineConfig(kv_pool_bytes=positions * model.bytes_per_token)
        found = Engine(model, config)
    _engines.insert(0, found)
    del _engines[KEPT:]
    return found
