"""Dequantize a GGUF llama model into the compute dtype, in the layout the forward pass wants."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import gguf
import numpy as np

from common.errors import UnsupportedModelError
from engine.config import ModelConfig

Array = Any  # numpy.ndarray or cupy.ndarray


@dataclass(slots=True)
class LayerWeights:
    attn_norm: Array  # [dim]
    wqkv: Array  # [dim + 2 * kv_dim, dim]; q/k rows of each head in split-half rope order
    wo: Array  # [dim, dim]
    ffn_norm: Array  # [dim]
    w_gate_up: Array  # [2 * ffn_dim, dim]
    w_down: Array  # [dim, ffn_dim]


@dataclass(slots=True)
class Weights:
    embed: Array  # [vocab, dim]
    layers: list[LayerWeights]
    out_norm: Array  # [dim]
    output: Array  # [vocab, dim]; the same array as embed when the model ties them

    @property
    def nbytes(self) -> int:
        arrays = [self.embed, self.out_norm]
        if self.output is not self.embed:
            arrays.append(self.output)
        for layer in self.layers:
            arrays += [layer.attn_norm, layer.wqkv, layer.wo, layer.ffn_norm]
            arrays += [layer.w_gate_up, layer.w_down]
        return sum(int(a.nbytes) for a in arrays)


def rope_halves_order(num_heads: int, head_dim: int) -> np.ndarray:
    """Row order that turns GGUF's adjacent-pair rope layout into split halves, per head.

    q.k is unchanged by permuting q and k alike; split halves let rope use contiguous slices.
    """
    per_head = np.concatenate([np.arange(0, head_dim, 2), np.arange(1, head_dim, 2)])
    return (np.arange(num_heads)[:, None] * head_dim + per_head[None, :]).reshape(-1)


def fingerprint(reader: gguf.GGUFReader, config: ModelConfig) -> str:
    """A digest of the config and every tensor's name, type, shape and bytes."""
    digest = hashlib.blake2b(repr(config).encode(), digest_size=16)
    for t in reader.tensors:
        digest.update(f"{t.name}:{t.tensor_type.name}:{list(t.shape)}".encode())
        digest.update(np.ascontiguousarray(t.data).tobytes())
    return digest.hexdigest()


def _shapes(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The numpy shape (rows = outputs) of every tensor kind, from the config."""
    return {
        "attn_norm": (c.dim,),
        "ffn_norm": (c.dim,),
        "attn_q": (c.dim, c.dim),
        "attn_k": (c.kv_dim, c.dim),
        "attn_v": (c.kv_dim, c.dim),
        "attn_output": (c.dim, c.dim),
        "ffn_gate": (c.ffn_dim, c.dim),
        "ffn_up": (c.ffn_dim, c.dim),
        "ffn_down": (c.dim, c.ffn_dim),
        "token_embd": (c.vocab_size, c.dim),
        "output": (c.vocab_size, c.dim),
        "output_norm": (c.dim,),
    }


class _Tensors:
    """The file's tensors, dequantized to float32 on the host and checked one by one."""

    def __init__(self, reader: gguf.GGUFReader, config: ModelConfig) -> None:
        self.by_name = {t.name: t for t in reader.tensors}
        self.shapes = _shapes(config)

    def host(self, name: str) -> np.ndarray:
        t = self.by_name.get(name)
        if t is None:
            raise UnsupportedModelError(f"tensor {name} is missing from the GGUF file")
        try:
            out = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError as e:
            raise UnsupportedModelError(
                f"tensor {name}: type {t.tensor_type.name} is not supported"
            ) from e
        expected = self.shapes[name.split(".")[-2]]
        if tuple(out.shape) != expected:
            raise UnsupportedModelError(
                f"tensor {name} has shape {tuple(out.shape)}, the metadata implies {expected}"
            )
        return np.asarray(out, dtype=np.float32)


def load_weights(
    reader: gguf.GGUFReader, config: ModelConfig, dtype: np.dtype[Any], xp: ModuleType
) -> Weights:
    """Every tensor dequantized to `dtype` and placed on `xp`'s device."""
    tensors = _Tensors(reader, config)
    host = tensors.host

    def dev(a: np.ndarray) -> Array:
        return xp.asarray(np.ascontiguousarray(a, dtype=dtype))

    q_order = rope_halves_order(config.num_heads, config.head_dim)
    k_order = rope_halves_order(config.num_kv_heads, config.head_dim)
    layers = []
    for i in range(config.num_layers):
        p = f"blk.{i}."
        wq = host(p + "attn_q.weight")[q_order]
        wk = host(p + "attn_k.weight")[k_order]
        wv = host(p + "attn_v.weight")
        gate, up = host(p + "ffn_gate.weight"), host(p + "ffn_up.weight")
        layers.append(
            LayerWeights(
                attn_norm=dev(host(p + "attn_norm.weight")),
                wqkv=dev(np.concatenate([wq, wk, wv])),
                wo=dev(host(p + "attn_output.weight")),
                ffn_norm=dev(host(p + "ffn_norm.weight")),
                w_gate_up=dev(np.concatenate([gate, up])),
                w_down=dev(host(p + "ffn_down.weight")),
            )
        )
    embed = dev(host("token_embd.weight"))
    output = dev(host("output.weight")) if "output.weight" in tensors.by_name else embed
    return Weights(
        embed=embed, layers=layers, out_norm=dev(host("output_norm.weight")), output=output
    )
