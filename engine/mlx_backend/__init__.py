"""The model on MLX (`--device mlx`): Apple's array framework, on the GPU through Metal on
a Mac and on the CPU elsewhere (MLX's CPU build, which CI runs).

`quant` maps GGUF blocks onto MLX's affine quantization, `weights` places a model's
tensors in it, `experts` holds a mixture-of-experts layer's experts and runs them,
`kv_pool` keeps the paged KV pool in MLX arrays, `forward` runs the model family's layers
(engine/models) lazily and evaluates them once per step. Spill files are the same as on
the other devices (the pool's keys and values pass through host memory), so a session
spilled by one kind of worker restores on another.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np

MX_DTYPES = {np.dtype(np.float32): mx.float32, np.dtype(np.float16): mx.float16}


def mx_dtype(dtype: np.dtype[Any]) -> Any:
    """MLX's dtype for a NumPy compute dtype."""
    return MX_DTYPES[np.dtype(dtype)]
