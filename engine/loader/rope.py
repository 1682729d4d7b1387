"""How a GGUF file adjusts RoPE's rotation frequencies: Llama 3.1's per-frequency factors
(the `rope_freqs.weight` tensor) and linear position scaling; anything else is refused."""

from __future__ import annotations

import gguf
import numpy as np

from common.errors import UnsupportedModelError
from engine.text.gguf_file import GGUFFile
from engine.text.model_config import ModelConfig

FACTORS_TENSOR = "rope_freqs.weight"
SUPPORTED_SCALING = ("none", "linear")


def frequency_divisors(reader: GGUFFile, config: ModelConfig) -> np.ndarray | None:
    """What each of the head's head_dim / 2 rotation frequencies is divided by, in float64:
    the file's frequency factors (as llama.cpp applies them: the angle of frequency i is
    position * base^(-2i / head_dim) / factor[i]) times a linear scaling's factor (positions
    divided by it); None when the file asks neither. UnsupportedModelError for a scaling
    this engine does not do (YaRN, LongRoPE) or factors of the wrong shape."""
    arch, meta = config.architecture, reader.metadata
    kind = meta.get(f"{arch}.rope.scaling.type", "none")
    if kind not in SUPPORTED_SCALING:
        raise UnsupportedModelError(
            f"{arch}.rope.scaling.type={kind!r} is not supported "
            f"(supported: {', '.join(SUPPORTED_SCALING)}, and rope_freqs factors)"
        )
    half = config.head_dim // 2
    divisors = np.ones(half, dtype=np.float64)
    if kind == "linear":
        factor = float(meta.get(f"{arch}.rope.scaling.factor", 1.0))
        if not factor > 0:
            raise UnsupportedModelError(f"{arch}.rope.scaling.factor={factor} is not positive")
        divisors *= factor
    tensor = next((t for t in reader.tensors if t.name == FACTORS_TENSOR), None)
    if tensor is not None:
        factors = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64)
        if factors.shape != (half,) or not (factors > 0).all():
            raise UnsupportedModelError(
                f"tensor {FACTORS_TENSOR} must hold {half} positive factors "
                f"(head_dim {config.head_dim} / 2); it has shape {factors.shape}"
            )
        divisors *= factors
    return None if (divisors == 1.0).all() else divisors
