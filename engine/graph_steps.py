"""Decode steps from captured graphs in the model's own steps (engine/decode_graphs.py),
where `WARMFLEET_DECODE_GRAPHS=1` asks: on CUDA the bucket's CUDA graph is replayed; on the
CPU the same bookkeeping runs the step again from the bucket's buffers (no speed, but the
path the tests drive through the engine). A step goes this way when every segment is one
token wanting its logits, a bucket holds its rows and its block tables fit the captured
width (the model's context); any other step runs eagerly, as without the setting.

Opt in until a GPU has run it (bench/gpu_check.sh); refused on MLX. A mixture of experts'
step reads nothing back on CUDA either (engine/ops/moe_cuda.py routes on the device), so
its decode steps are captured too, if CuPy's sorts capture (the GPU check says).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from common.errors import UnsupportedModelError
from engine.decode_graphs import Capturer, CudaCapturer, DecodeGraphs, Rerun, StaticStep
from engine.device import device_name
from engine.forward import forward_static
from engine.kv.kv_pool import KVPool
from engine.loader.weights import Weights
from engine.models.family import Family
from engine.step import RopeTables, Segment, StepLayout
from engine.text.model_config import ModelConfig

GRAPHS_ENV = "WARMFLEET_DECODE_GRAPHS"
Array = Any


def graphs_asked(device: str) -> bool:
    """Whether WARMFLEET_DECODE_GRAPHS=1 asks for decode graphs (read at each load);
    UnsupportedModelError on MLX, which has no such graphs."""
    value = os.environ.get(GRAPHS_ENV, "0").strip()
    if value not in ("0", "1", ""):
        raise ValueError(f"{GRAPHS_ENV}={value!r}: expected 0 or 1")
    if value == "1" and device == "mlx":
        raise UnsupportedModelError(f"{GRAPHS_ENV}=1: decode graphs run on CUDA, not MLX")
    return value == "1"


def decode_only(segments: list[Segment]) -> bool:
    return all(s.length == 1 and s.want_logits for s in segments)


class GraphSteps:
    """One model's decode graphs: a DecodeGraphs for each pool it steps, made on first use."""

    def __init__(
        self, weights: Weights, config: ModelConfig, family: Family, rope: RopeTables, xp: Any
    ) -> None:
        self.weights, self.config, self.family = weights, config, family
        self.rope, self.xp = rope, xp
        self.by_pool: dict[int, tuple[KVPool, DecodeGraphs]] = {}

    @classmethod
    def asked(
        cls, weights: Weights, config: ModelConfig, family: Family, rope: RopeTables, xp: Any
    ) -> GraphSteps | None:
        """The model's decode graphs where WARMFLEET_DECODE_GRAPHS=1 asks (graphs_asked);
        None where it does not."""
        return cls(weights, config, family, rope, xp) if graphs_asked(device_name(xp)) else None

    def for_pool(self, pool: KVPool) -> DecodeGraphs:
        held = self.by_pool.get(id(pool))
        if held is None or held[0] is not pool:
            capturer: Capturer = Rerun() if self.xp is np else CudaCapturer(self.xp)
            width = -(-self.config.context_length // pool.block_size)
            graphs = DecodeGraphs(pool, self.config.vocab_size, self._run, capturer, width)
            held = self.by_pool[id(pool)] = (pool, graphs)
        return held[1]

    def logits(
        self, pool: KVPool, tokens: Array, positions: Array, layout: StepLayout, rows: int
    ) -> Array | None:
        """The decode step's logits [rows, vocab] from its bucket's graph (a view of the
        bucket's buffer: copy it before the next step), or None where it does not fit."""
        graphs = self.for_pool(pool)
        if not graphs.fits(layout, rows):
            return None
        return graphs.run(tokens, positions, layout)

    def _run(self, step: StaticStep, layout: StepLayout) -> None:
        w, c, xp = self.weights, self.config, self.xp
        forward_static(
            w, c, self.family, self.rope, step.tokens, step.positions, layout, step.logits, xp
        )
