"""What a model family tells the engine, and the operations its layer is composed of.

A family module (llama.py, qwen2.py, ...) defines FAMILY: the GGUF architectures it runs;
how its file lays out q and k for rope and which tensors its layer has beyond Llama's (the
loader reads and checks them, and refuses them in a file of a family whose layer has none);
whether the all-layers C call (engine/ops/native_layers.py) runs its layer; and the layer,
written against LayerOps so that every backend runs the same composition: engine/forward.py
binds the operations on NumPy and CuPy, engine/mlx_backend/forward.py on MLX.

Shapes: N tokens in the step, H heads, D head_dim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from engine.loader.tensors import LayerTensors
from engine.loader.weights import Experts, LayerWeights

Array = Any  # the backend's array: numpy, cupy or mlx
Matrix = Any  # a weight matrix as the backend holds it (dense or quantized)


class LayerOps(Protocol):
    """The operations of one step on one backend; the step's positions, pool and plan are
    bound in them."""

    def norm(self, x: Array, weight: Array) -> Array:
        """Each row of x [N, C] RMS-normed and scaled by weight [C]."""
        ...

    def matmul(self, x: Array, w: Matrix) -> Array:
        """x @ w.T for x [N, K] and w [M, K]."""
        ...

    def add_bias(self, qkv: Array, bias: Array) -> Array:
        """qkv [N, C] + bias [C] (the array given may be changed in place)."""
        ...

    def head_norms(self, qkv: Array, q_norm: Array, k_norm: Array) -> Array:
        """Each head's q and k in qkv RMS-normed with q_norm, k_norm [D] (the array given
        may be changed in place)."""
        ...

    def attend(self, qkv: Array, layer: int, window: int = 0, sinks: Array | None = None) -> Array:
        """q and k rotated at the step's positions, this step's k and v written into the
        pool's `layer`, and every row's causal attention over its sequence: [N, H * D].
        With a window, each row attends to its last `window` positions only; with sinks
        [H], each head's learned logit joins its softmax's denominator (gpt-oss)."""
        ...

    def silu_mul(self, gate_up: Array) -> Array:
        """SiLU(gate) * up of gate_up [N, 2 * ffn]: [N, ffn]."""
        ...

    def residual(self, x: Array, y: Array) -> Array:
        """x + y: the residual stream x [N, dim] plus a block's output."""
        ...

    def experts(self, x: Array, moe: Experts) -> Array:
        """The mixture-of-experts FFN of x [N, dim] (normed), without the residual: each
        row through its top-k experts, their outputs weighted and added in the row's own
        ranking order (a row's bits independent of the other rows): [N, dim]."""
        ...


# layer(x [N, dim], its weights, its index, the step's ops) -> x after the layer [N, dim]
Layer = Callable[[Array, LayerWeights, int, LayerOps], Array]


@dataclass(frozen=True, slots=True)
class Family:
    architectures: tuple[str, ...]  # the files' general.architecture it runs
    tensors: LayerTensors  # what the loader reads for its layer beyond Llama's, and how
    native_layers: bool  # engine/ops/csrc/layers.c runs this layer (all layers in one call)
    layer: Layer
