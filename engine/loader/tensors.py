"""A GGUF file's tensors, each checked against the shape the model's metadata implies and
read as float32 or as the quantized kernels' blocks (engine/loader/weights.py places them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gguf
import numpy as np

from common.errors import UnsupportedModelError
from engine.loader.experts import expert_matrix, expert_shapes, packed_from_file
from engine.ops.quant.experts import ExpertMatrix, GptOssExperts, MoEWeights
from engine.ops.quant.experts_native import moe_kernel
from engine.ops.quant.formats import decode
from engine.ops.quant.matrix import QuantMatrix, is_supported
from engine.text.gguf_file import GGUFFile
from engine.text.model_config import ModelConfig


@dataclass(frozen=True, slots=True)
class LayerTensors:
    """How a family's file lays out its layer's tensors beyond Llama's (engine/models)."""

    rope_in_pairs: bool  # q and k rows rotate adjacent pairs: reordered to halves at load
    qkv_bias: bool  # blk.N.attn_{q,k,v}.bias
    qk_norm: bool  # blk.N.attn_{q,k}_norm.weight, [head_dim] each
    experts: bool = False  # a router and 3-D expert tensors instead of ffn_{gate,up,down}
    # gpt-oss: a bias on the attention's output, a learned sink logit per head
    # (blk.N.attn_sinks.weight), biases on the router and experts, and the FFN's norm under
    # another name; every `window_every`-th layer from the first attends to a sliding window
    out_bias: bool = False
    sinks: bool = False
    expert_biases: bool = False
    ffn_norm: str = "ffn_norm"
    window_every: int = 0


MATRIX_KINDS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def _shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The numpy shape (rows = outputs) of every tensor kind, from the config."""
    return {
        "attn_norm": (c.dim,),
        "ffn_norm": (c.dim,),
        "post_attention_norm": (c.dim,),
        "attn_sinks": (c.num_heads,),
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
    } | expert_shapes(c)


class Tensors:
    """The file's tensors, dequantized to float32 on the host and checked one by one."""

    def __init__(self, reader: GGUFFile, config: ModelConfig) -> None:
        self.by_name = {t.name: t for t in reader.tensors}
        self.config = config
        self.shapes = _shapes(config)

    def shape(self, name: str) -> tuple[int, ...]:
        """The numpy shape the metadata implies for tensor `name` (e.g. "blk.3.attn_q.weight");
        a bias has one value per row of its matrix (of each expert's, for experts)."""
        shape = self.shapes[name.split(".")[-2]]
        return shape[:-1] if name.endswith(".bias") else shape

    def extras(
        self, prefix: str, spec: LayerTensors, orders: tuple[np.ndarray | None, np.ndarray | None]
    ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]:
        """Layer `prefix`'s tensors beyond Llama's where its family's layer has them (`spec`),
        each in its matrix's row order (`orders`: q's and k's): the q, k and v biases in one
        vector, the q and k norm weights; None for those it has not."""
        self._refuse_unused(prefix, spec)
        q_order, k_order = orders
        bias = self._qkv_bias(prefix, [q_order, k_order, None]) if spec.qkv_bias else None
        if not spec.qk_norm:
            return bias, None, None
        return (bias, *self._head_norms(prefix, orders))

    def experts(
        self,
        prefix: str,
        top_k: int,
        stats: np.ndarray | None = None,
        biases: bool = False,
        pack: bool = False,
        native: bool = True,
    ) -> MoEWeights:
        """Layer `prefix`'s router (float32) and expert tensors (in the file's map; with
        `pack`, repacked where the C kernels pack them), their reads counted in `stats` where
        given (see MoEWeights; a model's layers share one); with `biases`, gpt-oss's router
        and expert biases (GptOssExperts); bound to the C kernels unless not `native` (a
        GPU's experts: the kernels are not built for them)."""
        kinds = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
        gate, up, down = (self.in_file(f"{prefix}{k}.weight", pack) for k in kinds)
        router = np.ascontiguousarray(self.host(f"{prefix}ffn_gate_inp.weight"))
        stats = np.zeros(3, dtype=np.int64) if stats is None else stats
        extra = None
        if biases:
            extra = GptOssExperts(
                *(self.host(f"{prefix}{k}.bias") for k in ("ffn_gate_inp", *kinds))
            )
        kernel = moe_kernel(router, top_k, gate, up, down, extra) if native else None
        return MoEWeights(router, gate, up, down, top_k, stats, kernel, extra)

    def in_file(self, name: str, pack: bool = False) -> ExpertMatrix:
        """The 3-D tensor's blocks in the file's map or, with `pack`, repacked where the C
        kernels pack them, its pages in the map then dropped at once (a load's peak memory
        one tensor above the file's, not twice it)."""
        tensor = self.tensor(name)
        m = expert_matrix(tensor, self.shape(name))
        return packed_from_file(m, tensor.data) if pack else m

    def _refuse_unused(self, prefix: str, spec: LayerTensors) -> None:
        """A file holding a tensor its family's layer has not is refused: left out, it would
        make the output wrong."""
        for has, names in (
            (spec.qkv_bias, [f"{prefix}attn_{x}.bias" for x in "qkv"]),
            (spec.qk_norm, [f"{prefix}attn_{x}_norm.weight" for x in "qk"]),
            (spec.out_bias, [f"{prefix}attn_output.bias"]),
            (spec.sinks, [f"{prefix}attn_sinks.weight"]),
        ):
            found = next((n for n in names if n in self.by_name), None)
            if found is not None and not has:
                raise UnsupportedModelError(
                    f"tensor {found}: the {self.config.architecture} layer has no such tensor"
                )

    def _qkv_bias(self, prefix: str, orders: list[np.ndarray | None]) -> np.ndarray:
        """The q, k and v biases of layer `prefix` in one float32 vector, each in its
        matrix's row order (`orders`); an error names a missing one."""
        parts = [self.host(f"{prefix}attn_{x}.bias") for x in "qkv"]
        return np.concatenate(
            [p if o is None else p[o] for p, o in zip(parts, orders, strict=True)]
        )

    def _head_norms(
        self, prefix: str, orders: tuple[np.ndarray | None, np.ndarray | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Layer `prefix`'s q and k norm weights [head_dim], each in its matrix's row order
        (`orders`): a head's is the first head's."""
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
        return [
            f"{name} ({t.tensor_type.name})"
            for name, t in self.by_name.items()
            if name.endswith(".weight")
            and name.split(".")[-2] in matrices
            and t.tensor_type != gguf.GGMLQuantizationType.F32
            and not is_supported(t.tensor_type, self.shape(name)[1])
        ]
