"""Greedy references in the test process: cold runs on one engine per model, kept.

A new engine's pool is new memory, and NumPy asks for huge pages for it: a prefill's first
step faults in a 2 MB page for each layer's keys and each layer's values (~60 for the
default model), which took 0.5-1 s on a VM's cores. With an engine made per reference,
that was most of some cluster tests' time. Each call here runs in a KV scope of its own, so
no block an earlier call computed is reused: every call still computes from nothing, and the
requests of one call share prefixes as on a new engine."""

from __future__ import annotations

import dataclasses
import itertools

from engine.engine import Engine, StepOutput
from engine.model import Model
from engine.sequence import Request

KEPT = 2  # engines kept, the most recently used: a test file's model and the odd other
_engines: list[Engine] = []
_calls = itertools.count()


def cold_outputs(model: Model, requests: list[Request]) -> dict[str, list[StepOutput]]:
    """Every step's outputs of `requests` run together to their end, by request id."""
    engine = _engine(model)
    scope = f"cold-{next(_calls)}"
    return engine.generate([dataclasses.replace(r, scope=scope) for r in requests])


def cold_ids(model: Model, request: Request) -> list[int]:
    """The tokens `request` generates, run alone."""
    return [t for o in cold_outputs(model, [request])[request.request_id] for t in o.token_ids]


def _engine(model: Model) -> Engine:
    for engine in _engines:
        if engine.model is model:
            _engines.remove(engine)
            break
    else:
        engine = Engine(model)
    if engine.has_work or engine.sequences:  # a run that raised midway: start afresh
        engine = Engine(model)
    _engines.insert(0, engine)
    del _engines[KEPT:]
    return engine
