"""How a GGUF file adjusts RoPE's rotations: Llama 3.1's per-frequency factors (the
`rope_freqs.weight` tensor), linear position scaling and YaRN (gpt-oss); anything else is
refused by name."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from common.errors import UnsupportedModelError
from engine.text.gguf_file import GGUFFile
from engine.text.model_config import ModelConfig

FACTORS_TENSOR = "rope_freqs.weight"
SUPPORTED_SCALING = ("none", "linear", "yarn")
# YaRN's defaults where the file gives none (llama.cpp's)
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0


@dataclass(frozen=True, slots=True)
class RopeScaling:
    """What each of the head's head_dim / 2 rotation frequencies is divided by (float64;
    None: by nothing), and the factor cos and sin are multiplied by (YaRN's magnitude)."""

    divisors: np.ndarray | None = None
    magnitude: float = 1.0


def rope_scaling(reader: GGUFFile, config: ModelConfig) -> RopeScaling:
    """The file's rope scaling, as llama.cpp applies it: the angle of frequency i is
    position * base^(-2i / head_dim) / divisor[i], the divisor the file's frequency factor
    times a linear scaling's factor (positions divided by it) or YaRN's blend (below).
    UnsupportedModelError for a scaling this engine does not do (LongRoPE, YaRN's log
    multiplier) or factors of the wrong shape."""
    arch, meta = config.architecture, reader.metadata
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind not in SUPPORTED_SCALING:
        raise UnsupportedModelError(
            f"{arch}.rope.scaling.type={kind!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_SCALING)}, and rope_freqs factors)"
        )
    half = config.head_dim // 2
    divisors, magnitude = np.ones(half, dtype=np.float64), 1.0
    if kind != "none":
        factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0))
        if not factor > 0:
            raise UnsupportedModelError(f"{arch}.rope.scaling.factor={factor} is not positive")
        if kind == "linear":
            divisors *= factor
        elif factor > 1:
            divisors, magnitude = _yarn(meta, config, factor)
    tensor = next((t for t in reader.tensors if t.name == FACTORS_TENSOR), None)
    if tensor is not None:
        factors = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
        if factors.shape != (half,) or not (factors > 0).all():
            raise UnsupportedModelError(
                f"tensor {FACTORS_TENSOR} must hold {half} positive factors "
                f"(head_dim {config.head_dim} / 2); it has shape {factors.shape}"
            )
        divisors *= factors
    return RopeScaling(None if (divisors == 1.0).all() else divisors, magnitude)


def _yarn(meta: dict[str, Any], config: ModelConfig, factor: float) -> tuple[np.ndarray, float]:
    """YaRN (as llama.cpp's rope computes it): frequency i keeps its angle (extrapolates)
    below the correction range [low, high] of the original context, is divided by `factor`
    (interpolates) above it, and blends linearly between; cos and sin are scaled by
    attn_factor * (1 + 0.1 ln factor)."""
    arch = config.architecture

    def key(name: str, default: float) -> float:
        return float(meta.get(f"{arch}.rope.scaling.{name}", default))

    if key("yarn_log_multiplier", 0.0) != 0.0:
        raise UnsupportedModelError(f"{arch}: YaRN with yarn_log_multiplier is not supported")
    original = key("original_context_length", config.context_length)
    ext = key("yarn_ext_factor", 1.0)
    d, base = config.head_dim, config.rope_base

    def corr_dim(rotations: float) -> float:  # the frequency turning `rotations` times
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(0.0, math.floor(corr_dim(key("yarn_beta_fast", YARN_BETA_FAST))))
    high = min(d - 1.0, math.ceil(corr_dim(key("yarn_beta_slow", YARN_BETA_SLOW))))
    i = np.arange(d // 2, dtype=np.float64)
    ramp = 1 - np.clip((i - low) / max(0.001, high - low), 0, 1)  # 1: extrapolate
    mix = ramp * ext
    scale = 1.0 / factor  # the angle's multiplier: 1/factor interpolated, 1 extrapolated
    divisors = 1.0 / (scale * (1 - mix) + mix)
    magnitude = key("attn_factor", 1.0) * (1 + 0.1 * math.log(factor)) if ext else 1.0
    return divisors, magnitude
