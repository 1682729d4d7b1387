"""A GGUF file's tensors, each checked against the shape the model's metadata implies and
read as float32 or as the quantized kernels' blocks (engine/weights.py places them)."""

from __future__ import annotations

from typing import Any

import gguf
import numpy as np

from common.errors import UnsupportedModelError
from engine.config import ModelConfig
from engine.gguf_file import GGUFFile
from engine.quant.formats import decode
from engine.quant.matrix import QuantMatrix, is_supported

MATRIX_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The numpy shape (rows = outputs) of every tensor kind, from the config."""
    return {
        "attn_norm": (c.dim,),
        "ffn_norm": (c.dim,),
        "attn_q": (c.q_dim, c.dim),
        "attn_k": (c.kv_dim, c.dim),
        "attn_v": (c.kv_dim, c.dim),
        "attn_output": (c.dim, c.q_dim),
        "attn_q_norm": (c.head_dim,),
        "attn_k_norm": (c.head_dim,),
        "ffn_gate": (c.ffn_dim, c.dim),
        "ffn_up": (c.ffn_dim, c.dim),
        "ffn_down": (c.dim, c.ffn_dim),
        "token_embd": (c.vocab_size, c.dim),
        "output": (c.vocab_size, c.dim),
        "output_norm": (c.dim,),
    }


class Tensors:
    """The file's tensors, dequantized to float32 on the host and checked one by one."""

    def __init__(self, reader: GGUFFile, config: ModelConfig) -> None:
        self.by_name = {t.name: t for t in reader.tensors}
        self.config = config
        self.shapes = _shapes(config)

    def shape(self, name: str) -> tuple[int, ...]:
        """The numpy shape the metadata implies for tensor `name` (e.g. "blk.3.attn_q.weight");
        a bias has one value per row of its matrix."""
        shape = self.shapes[name.split(".")[-2]]
        return shape[:1] if name.endswith(".bias") else shape

    def qkv_bias(self, prefix: str, orders: list[np.ndarray | None]) -> np.ndarray | None:
        """The q, k and v biases of layer `prefix` in one float32 vector, each in its
        matrix's row order (`orders`); None when the file has none (Llama), an error naming
        the missing one when it has only some."""
        names = [f"{prefix}attn_{x}.bias" for x in "qkv"]
        if not any(n in self.by_name for n in names):
            return None
        parts = [self.host(n) for n in names]
        return np.concatenate(
            [p if o is None else p[o] for p, o in zip(parts, orders, strict=True)]
        )

    def head_norms(
        self, prefix: str, orders: tuple[np.ndarray | None, np.ndarray | None]
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Layer `prefix`'s q and k norm weights [head_dim] where the architecture has them
        (Qwen 3), each in its matrix's row order (`orders`): a head's is the first head's."""
        if not self.config.qk_norm:
            return None, None
        d, out = self.config.head_dim, []
        for x, order in zip("qk", orders, strict=True):
            w = self.host(f"{prefix}attn_{x}_norm.weight")
            out.append(w if order is None else w[order[:d]])
        return out[0], out[1]

    def tensor(self, name: str) -> Any:
        """The named tensor, checked to be there with the shape the metadata implies."""
        t = self.by_name.get(name)
        if t is None:
            raise UnsupportedModelError(f"tensor {name} is missing from the GGUF file")
        expected = self.shape(name)
        shape = tuple(int(n) for n in reversed(t.shape))  # GGUF lists the fastest axis first
        if shape != expected:
            raise UnsupportedModelError(
                f"tensor {name} has shape {shape}, the metadata implies {expected}"
            )
        return t

    def host(self, name: str) -> np.ndarray:
        """The tensor dequantized to float32."""
        t = self.tensor(name)
        try:
            out = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise UnsupportedModelError(
                f"tensor {name}: type {t.tensor_type.name} is not supported"
            ) from e
        # a copy: a view would keep the whole file mapped (and its read pages resident)
        return np.array(out, dtype=np.float32).reshape(self.shape(name))

    def quant(self, name: str) -> QuantMatrix | np.ndarray:
        """The tensor in the kernels' form, or float32 where it is stored as F32."""
        t = self.tensor(name)
        if t.tensor_type == gguf.GGMLQuantizationType.F32:
            return self.host(name)
        raw = np.asarray(t.data).reshape(self.shape(name)[0], -1)
        return QuantMatrix.from_decoded(decode(raw, t.tensor_type), t.tensor_type.name)

    def without_kernel(self) -> list[str]:
        """The matrices no quantized kernel reads, as "name (TYPE)"."""
        matrices = (*MATRIX_KINDS, "token_embd", "output")
        return [f"{name} ({t.tensor_type.name})" for name, t in self.by_name.items()
                if name.endswith(".weight") and name.split(".")[-2] in matrices
                and t.tensor_type != gguf.GGMLQuantizationType.F32
                and not is_supported(t.tensor_type, self.shape(name)[1])]  # fmt: skip
