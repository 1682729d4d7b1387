"""What a mixture-of-experts decode step reads, against its floor (bench.moe): the distinct
experts each layer touched (from the kernels' own counts, MoEWeights.stats), the bytes of
weights a step reads (the touched experts, plus every other matrix once: attention, routers,
the output), and the time those bytes take at the machine's measured read bandwidth."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.model import Model


@dataclass(frozen=True, slots=True)
class StepReads:
    experts_per_layer: float  # distinct experts a layer's step touched, on average
    expert_bytes: float  # a step's, all layers
    other_bytes: int  # every matrix but the experts, read once a step

    @property
    def total_bytes(self) -> float:
        return self.expert_bytes + self.other_bytes

    def floor_ms(self, read_gbs: float) -> float:
        """The step's time were it bound by reading its weights once at `read_gbs`."""
        return self.total_bytes / (read_gbs * 1e9) * 1e3


def counts(model: Model) -> np.ndarray | None:
    """The model's expert-kernel counts (calls, experts touched, bytes), shared by its layers;
    None for a dense model or off the C kernels."""
    moe = model.weights.layers[0].moe
    return None if moe is None or moe.native is None else moe.stats


def other_bytes(model: Model) -> int:
    """Bytes of every matrix but the experts (norms are too small to count)."""
    w = model.weights
    total = int(w.output.nbytes)
    for lw in w.layers:
        total += int(lw.wqkv.nbytes) + int(lw.wo.nbytes)
        if lw.moe is not None:
            total += int(lw.moe.router.nbytes)
        else:
            total += int(lw.w_gate_up.nbytes) + int(lw.w_down.nbytes)
    return total


def step_reads(model: Model, before: np.ndarray, after: np.ndarray, steps: int) -> StepReads:
    """The reads of `steps` steps between two snapshots of `counts(model)`."""
    calls, touched, read = (int(a - b) for a, b in zip(after, before, strict=True))
    return StepReads(touched / max(calls, 1), read / steps, other_bytes(model))
