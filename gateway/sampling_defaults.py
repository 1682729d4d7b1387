"""The sampling a request gets for the fields it leaves out. The gRPC API is greedy (same
input, same tokens); the OpenAI and Anthropic faces follow those APIs (temperature 1),
unless the model's family publishes its own recommendation, which then wins."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Defaults(enum.Enum):
    GREEDY = enum.auto()  # the gRPC API's
    API = enum.auto()  # OpenAI's and Anthropic's: temperature 1, or the family's


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    temperature: float
    top_p: float = 1.0
    top_k: int = 0  # 0: off


GREEDY = SamplingDefaults(temperature=0.0)
API = SamplingDefaults(temperature=1.0)
# architecture -> (thinking, not thinking): Qwen 3's model cards (the MoE models' too:
# Qwen3-30B-A3B's; Qwen3-Coder-30B-A3B thinks not and recommends the second)
QWEN3 = (SamplingDefaults(0.6, 0.95, 20), SamplingDefaults(0.7, 0.8, 20))
FAMILIES = {"qwen3": QWEN3, "qwen3moe": QWEN3}


def defaults_for(kind: Defaults, architecture: str, thinking: bool) -> SamplingDefaults:
    """The defaults of a request: `thinking` when the reply may reason (the gateway reads
    think spans, and the request did not turn reasoning off)."""
    if kind == Defaults.GREEDY:
        return GREEDY
    family = FAMILIES.get(architecture)
    if family is None:
        return API
    return family[0] if thinking else family[1]
