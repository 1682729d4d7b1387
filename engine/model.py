"""A loaded model: config, family, weights on the device, rope tables, tokenizer and
fingerprint."""

from __future__ import annotations

import contextlib
import ctypes
import gc
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from common.errors import InvalidRequestError, UnsupportedModelError
from engine.device import array_module, compute_dtype, device_name, on_mlx, to_host
from engine.forward import forward
from engine.graph_steps import GraphSteps, decode_only
from engine.kv.kv_pool import KVPool
from engine.kv_files.kv_dtypes import fits, kv_dtype_named, token_bytes, values_per_item
from engine.loader.experts import refuse_unbuilt
from engine.loader.fingerprint import fingerprint
from engine.loader.rope import rope_scaling
from engine.loader.weights import Weights, load_weights, release_copied
from engine.models.families import family_for
from engine.models.family import Family
from engine.step import RopeTables, Segment, StepLayout
from engine.text.gguf_file import open_gguf, read_metadata
from engine.text.model_config import ModelConfig
from engine.text.tokenizer import Tokenizer


def release_freed_memory() -> None:
    """Give the heap's free pages back to the system (glibc; a no-op elsewhere)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


@dataclass(slots=True)
class Model:
    path: Path
    config: ModelConfig
    family: Family  # the architecture's layer and what it loads (engine/models)
    weights: Weights
    rope: RopeTables
    tokenizer: Tokenizer
    fingerprint: str  # changes whenever the weights or the shape change
    dtype: np.dtype[Any]
    xp: ModuleType
    kv_dtype: np.dtype[Any]  # what the KV pool holds (kv_dtype_for)
    graphs: GraphSteps | None = None  # decode steps replayed (WARMFLEET_DECODE_GRAPHS=1)

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        device: str = "auto",
        dtype: str = "float32",
        weights: str = "auto",
        kv_dtype: str = "auto",
    ) -> Model:
        """Read and check a GGUF file of a family the engine runs (engine/models); its
        matrices kept quantized or dequantized as `weights` says (auto|quantized|float32),
        its KV pool in `kv_dtype` (see kv_dtype_for); named errors on bad input."""
        xp, np_dtype = array_module(device), compute_dtype(dtype)
        pool_dtype = kv_dtype_for(kv_dtype, np_dtype, xp)
        reader = open_gguf(path)
        meta = read_metadata(reader)
        family = family_for(meta.get("general.architecture"))
        names, spec = [t.name for t in reader.tensors], family.tensors
        refuse_unbuilt(meta, names, spec.experts, spec.expert_biases)
        config = ModelConfig.from_metadata(meta)
        refuse_unfit_kv(config.head_dim, pool_dtype, kv_dtype)
        tokenizer = Tokenizer.from_metadata(meta)
        scaling = rope_scaling(reader, config)
        if on_mlx(xp):
            from engine.mlx_backend.forward import rope_tables
            from engine.mlx_backend.weights import load_mlx_weights

            loaded = load_mlx_weights(reader, config, family.tensors, np_dtype, weights)
            rope = rope_tables(config, np_dtype, scaling)
        else:
            loaded = load_weights(reader, config, family.tensors, np_dtype, xp, weights)
            rope = RopeTables.build(config, np_dtype, xp, scaling)
        model = cls(
            path=Path(path),
            config=config,
            family=family,
            weights=loaded,
            rope=rope,
            tokenizer=tokenizer,
            fingerprint=fingerprint(reader, config, Path(path)),
            dtype=np_dtype,
            xp=xp,
            kv_dtype=pool_dtype,
            graphs=GraphSteps.asked(loaded, config, family, rope, xp),
        )
        release_copied(reader, loaded)  # the map stays open where experts are read in place
        del reader, meta  # the header's values and the file mapping
        gc.collect()  # the reader's fields hold cycles: freed now, not at some later pass
        release_freed_memory()  # the load's temporaries: tens of MB the heap would keep
        return model

    @property
    def device(self) -> str:
        return device_name(self.xp)

    def new_pool(self, pool_bytes: int) -> KVPool:
        """A KV pool on this model's device of as many blocks as fit `pool_bytes`."""
        kind: type[KVPool] = KVPool
        if on_mlx(self.xp):
            from engine.mlx_backend.kv_pool import MLXKVPool

            kind = MLXKVPool
        windows = [lw.window for lw in self.weights.layers]  # windowed layers: their own blocks
        return kind.sized(
            self.config, pool_bytes, self.kv_dtype, self.xp, self.fingerprint, windows=windows
        )

    def run(
        self, pool: KVPool, tokens: list[int], positions: list[int], segments: list[Segment]
    ) -> np.ndarray:
        """One forward pass (engine/forward.py; engine/mlx_backend on MLX): the new keys
        and values written into `pool`, and the logits [segments wanting them, vocab] as
        host float32."""
        if on_mlx(self.xp):
            from engine.mlx_backend.forward import forward as mlx_forward
            from engine.mlx_backend.kv_pool import MLXKVPool

            assert isinstance(pool, MLXKVPool)
            w, c, f = self.weights, self.config, self.family
            return mlx_forward(w, c, f, self.rope, pool, tokens, positions, segments, self.dtype)
        xp = self.xp
        ids, at = xp.asarray(tokens, dtype=xp.int64), xp.asarray(positions, dtype=xp.int64)
        layout = None
        if self.graphs is not None and decode_only(segments):
            layout = StepLayout.build(pool, segments, self.weights.in_place)
            replayed = self.graphs.logits(pool, ids, at, layout, len(segments))
            if replayed is not None:  # a view of the bucket's buffer: copied here
                return np.array(to_host(replayed), dtype=np.float32)
        w, c, f = self.weights, self.config, self.family
        logits = forward(w, c, f, self.rope, pool, ids, at, segments, xp, layout)
        return to_host(logits).astype(np.float32, copy=False)

    @property
    def weights_mode(self) -> str:
        """How the matrices are held: "quantized", or the compute dtype they were expanded to."""
        return "quantized" if self.weights.quantized else str(self.dtype)

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights take in memory (on the device for CuPy)."""
        return self.weights.nbytes

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one position (keys and values of every layer)."""
        c = self.config
        return token_bytes(c.num_layers, c.num_kv_heads, c.head_dim, self.kv_dtype)


KV_DTYPES = ("auto", "float32", "float16", "q8_0")


def kv_dtype_for(name: str, compute: np.dtype[Any], xp: ModuleType) -> np.dtype[Any]:
    """The KV pool's dtype `--kv-dtype name` asks. With float32 compute (on the CPU, CUDA
    or MLX) and on MLX with float16 compute too: float32, float16 or q8_0 (the kernels
    widen each value as they load it; MLX widens the rows attention reads). auto is float16
    on the CPU and MLX, and float32 on CUDA until a GPU has checked the others there (the
    GPU issue). On CUDA and the CPU with float16 compute the pool holds the compute dtype
    only, and auto is that."""
    if name not in KV_DTYPES:
        choices = ", ".join(KV_DTYPES)
        raise InvalidRequestError("kv_dtype", f"must be one of {choices}, got {name!r}")
    any_dtype = on_mlx(xp) or compute == np.float32
    if name == "auto":
        host_or_mlx = xp is np or on_mlx(xp)
        return np.dtype(np.float16) if any_dtype and host_or_mlx else compute
    wanted = kv_dtype_named(name)
    if wanted != compute and not any_dtype:
        where = "the CPU with --dtype float16" if xp is np else "this device"
        raise UnsupportedModelError(
            f"--kv-dtype {name}: {where} keeps the KV in the compute dtype ({compute}); "
            f"use --kv-dtype auto"
        )
    return wanted


def refuse_unfit_kv(head_dim: int, dtype: np.dtype[Any], name: str) -> None:
    """UnsupportedModelError where heads of head_dim values do not fill whole elements of
    the KV dtype (q8_0's blocks of 32)."""
    if not fits(head_dim, dtype):
        raise UnsupportedModelError(
            f"--kv-dtype {name}: heads of {head_dim} values do not split into "
            f"its blocks of {values_per_item(dtype)}"
        )
