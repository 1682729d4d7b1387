"""MLX's weights (engine/mlx_backend/weights.py) on MLX's CPU build: the packing against
MLX's own quantization, every GGUF type's matrix against gguf's dequantization and a
float64 product.

The product bound: the weights MLX holds are exact (scale * code is exact in float32 for
every type, formats.py), so the only error is float32 summation. A kernel may sum
x * (s * q + b) over the K weights, or s * (x . q) + b * sum(x) per group of 32 and then the
groups (MLX's Metal kernels). Either order makes at most K + 3 roundings on each path to a
result, so |y - y64| <= gamma_{K+3} * sum_k |x_k| (|s q_k| + |b|) with u = 2^-24 (dense
parts: b = 0, s q = w); the tests use 2 K u, above gamma_{K+3} for K >= 4. The errors seen
are under 2% of it; a wrong bit, row or scale is off by far more.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import mlx.core as mx
import numpy as np
import pytest

from engine.loader.weights import rope_halves_order
from engine.mlx_backend.weights import GROUP, MLXMatrix, MLXQuant, pack
from engine.model import Model
from engine.ops.quant.formats import decode
from tests.tiny_gguf import (
    VOCAB_SIZE,
    add_integer_keys,
    add_tokenizer,
    random_tensors,
    write_and_close,
)
from tests.unit.test_quant_kernels import K_QUANTS, random_blocks

T = gguf.GGMLQuantizationType
U = 2.0**-24
MLX_BITS = {T.Q4_0: 4, T.Q4_1: 4, T.Q5_0: 5, T.Q5_1: 5, T.Q8_0: 8, T.Q4_K: 4, T.Q5_K: 5}
EXPANDED = (T.Q6_K, T.F16, T.BF16)  # expanded to float32 at load
ROW_COUNTS = (1, 7, 33)  # one row (MLX's vector kernel), a few, more than SMALL_ROWS


# 1. pack: MLX's bit layout


def group_values(codes: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """scale * code + bias in float32, one scale and bias per GROUP weights."""
    s, b = (np.repeat(a, GROUP, axis=1) for a in (scale, bias))
    return s * codes.astype(np.float32) + b


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_packed_codes_dequantize_to_scale_times_code_plus_bias(bits: int) -> None:
    rng = np.random.default_rng(bits)
    n, k = 5, 4 * GROUP
    codes = rng.integers(0, 2**bits, (n, k), dtype=np.uint8)
    scale = rng.uniform(0.01, 1.0, (n, k // GROUP)).astype(np.float32)
    bias = rng.uniform(-1.0, 1.0, (n, k // GROUP)).astype(np.float32)
    packed = pack(codes, bits)
    assert packed.dtype == np.uint32 and packed.shape == (n, k * bits // 32)
    got = mx.dequantize(mx.array(packed), mx.array(scale), mx.array(bias),
                        group_size=GROUP, bits=bits)  # fmt: skip
    assert np.array_equal(np.array(got), group_values(codes, scale, bias))


@pytest.mark.parametrize("bits", [4, 5, 8])
def test_pack_equals_mlx_quantize_on_weights_it_represents_exactly(bits: int) -> None:
    """Groups of the symmetric form (bias -2^(bits-1) s, as Q4_0/Q8_0) holding codes 0 and
    2^bits - 1: mx.quantize finds the same scale and bias, so its words must be ours."""
    rng = np.random.default_rng(10 + bits)
    n, k = 6, 3 * GROUP
    codes = rng.integers(0, 2**bits, (n, k), dtype=np.uint8)
    codes[:, ::GROUP], codes[:, 1::GROUP] = 0, 2**bits - 1
    scale = (2.0 ** rng.integers(-8, 0, (n, k // GROUP))).astype(np.float32)
    bias = -(2 ** (bits - 1)) * scale
    wq, scales, biases = mx.quantize(mx.array(group_values(codes, scale, bias)),
                                     group_size=GROUP, bits=bits)  # fmt: skip
    assert np.array_equal(np.array(scales), scale) and np.array_equal(np.array(biases), bias)
    assert np.array_equal(np.array(wq), pack(codes, bits))


# 2. every GGUF type's matrices as the loader builds them

TYPED_DIMS = {"dim": 256, "num_heads": 4, "num_kv_heads": 2, "ffn_dim": 256}  # K-quants: K % 256


def write_typed_llama(path: Path, qtype: T, kinds: dict[str, T] | None = None) -> Path:
    """A one-layer llama whose matrices (and embedding) are `qtype` but for the kinds named
    in `kinds` (e.g. {"attn_v": T.Q6_K}): quantized by gguf-py where it can, random valid
    blocks for the K-quants."""
    rng = np.random.default_rng(int(qtype))
    dim, heads, kv_heads, ffn = (TYPED_DIMS[k] for k in ("dim", "num_heads", "num_kv_heads",
                                                         "ffn_dim"))  # fmt: skip
    w = gguf.GGUFWriter(path, "llama")
    sizes = {"block_count": 1, "context_length": 256, "embedding_length": dim,
             "feed_forward_length": ffn, "attention.head_count": heads,
             "attention.head_count_kv": kv_heads, "rope.dimension_count": dim // heads,
             "vocab_size": VOCAB_SIZE}  # fmt: skip
    add_integer_keys(w, "llama", sizes, None)
    add_tokenizer(w, "gpt2")
    for name, a in random_tensors(rng, 1, dim, kv_heads * dim // heads, ffn, False).items():
        if a.ndim == 1:
            w.add_tensor(name, a)
            continue
        t = (kinds or {}).get(name.split(".")[-2], qtype)
        data = random_blocks(rng, t, *a.shape) if t in K_QUANTS else gguf.quants.quantize(a, t)
        w.add_tensor(name, data, raw_dtype=t)
    write_and_close(w)
    return path


def host_matrix(
    reader: gguf.GGUFReader, names: list[str], orders: list[np.ndarray | None]
) -> tuple[np.ndarray, np.ndarray]:
    """gguf's float32 dequantization of the named tensors' rows (reordered) stacked, and the
    magnitude each weight adds to the error bound: |s q| + |b| (|w| where not quantized)."""
    by_name = {t.name: t for t in reader.tensors}
    weights, sizes = [], []
    for name, order in zip(names, orders, strict=True):
        t = by_name[name]
        raw = np.asarray(t.data).reshape(int(t.shape[1]), -1)  # GGUF shape: [in, out]
        w = np.asarray(gguf.quants.dequantize(raw, t.tensor_type), dtype=np.float32)
        size = np.abs(w)
        if t.tensor_type in MLX_BITS:
            bias = np.repeat(decode(raw, t.tensor_type).offset, GROUP, axis=1)
            size = np.abs(w - bias) + np.abs(bias)
        keep = slice(None) if order is None else order
        weights.append(w[keep])
        sizes.append(size[keep])
    return np.concatenate(weights), np.concatenate(sizes)


MatrixCase = tuple[MLXMatrix, list[str], list[np.ndarray | None]]


def layer_matrices(model: Model) -> dict[str, MatrixCase]:
    """Each product matrix of the one-layer model, with the GGUF tensors it holds and the
    row order the loader applies to each (split-half rope order for Q and K)."""
    c, lw, p = model.config, model.weights.layers[0], "blk.0."
    q_order = rope_halves_order(c.num_heads, c.head_dim)
    k_order = rope_halves_order(c.num_kv_heads, c.head_dim)
    return {
        "wqkv": (lw.wqkv, [p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"],
                 [q_order, k_order, None]),
        "wo": (lw.wo, [p + "attn_output.weight"], [None]),
        "w_gate_up": (lw.w_gate_up, [p + "ffn_gate.weight", p + "ffn_up.weight"], [None, None]),
        "w_down": (lw.w_down, [p + "ffn_down.weight"], [None]),
        "output": (model.weights.output, ["output.weight"], [None]),
    }  # fmt: skip


def part_forms(matrix: MLXMatrix) -> list[tuple[int | None, int]]:
    """(bits, or None where dense float32; rows) of each part, in order."""
    forms: list[tuple[int | None, int]] = []
    for part in matrix.parts:
        if isinstance(part, MLXQuant):
            forms.append((part.bits, int(part.wq.shape[0])))
        else:
            assert part.dtype == mx.float32
            forms.append((None, int(part.shape[0])))
    return forms


def assert_products_within_bound(model: Model, path: Path) -> None:
    """Every matrix times 1, 7 and 33 random rows against the float64 product of gguf's
    dequantized weights, within the bound of the module docstring; the embedding's rows
    exactly gguf's."""
    reader = gguf.GGUFReader(path)
    rng = np.random.default_rng(99)
    for matrix, names, orders in layer_matrices(model).values():
        w, size = host_matrix(reader, names, orders)
        k = w.shape[1]
        for rows in ROW_COUNTS:
            x = rng.standard_normal((rows, k)).astype(np.float32)
            got = np.array(matrix.matmul(mx.array(x)))
            assert got.shape == (rows, w.shape[0]) and got.dtype == np.float32
            exact = x.astype(np.float64) @ w.T.astype(np.float64)
            bound = 2 * k * U * (np.abs(x).astype(np.float64) @ size.T.astype(np.float64))
            assert (np.abs(got - exact) <= bound).all(), f"{names[0]}, {rows} rows"
    ids = np.array([0, 5, VOCAB_SIZE - 1, 5, 77], dtype=np.int32)
    embed, _ = host_matrix(reader, ["token_embd.weight"], [None])
    assert np.array_equal(np.array(model.weights.embed.rows(mx.array(ids))), embed[ids])


@pytest.fixture(scope="module")
def typed_files(tmp_path_factory: pytest.TempPathFactory) -> dict[T, Path]:
    folder = tmp_path_factory.mktemp("typed")
    return {t: write_typed_llama(folder / f"{t.name}.gguf", t) for t in (*MLX_BITS, *EXPANDED)}


@pytest.mark.parametrize("qtype", [*MLX_BITS, *EXPANDED], ids=lambda t: t.name)
def test_each_type_is_held_as_mlx_reads_it_and_multiplies_within_the_bound(
    typed_files: dict[T, Path], qtype: T
) -> None:
    model = Model.load(typed_files[qtype], device="mlx")
    bits = MLX_BITS.get(qtype)
    assert model.weights.quantized == (bits is not None)
    assert model.weights_mode == ("quantized" if bits else "float32")
    c = model.config
    qkv_rows, ffn2 = c.dim + 2 * c.kv_dim, 2 * c.ffn_dim
    # neighbouring parts of one form are merged: Q, K and V make one product
    expected = {"wqkv": qkv_rows, "wo": c.dim, "w_gate_up": ffn2, "w_down": c.dim,
                "output": c.vocab_size}  # fmt: skip
    matrices = layer_matrices(model)
    for name, rows in expected.items():
        assert matrices[name][0].source == qtype.name
        assert part_forms(matrices[name][0]) == [(bits, rows)], name
    assert part_forms(model.weights.embed) == [(bits, c.vocab_size)]
    assert_products_within_bound(model, typed_files[qtype])


def test_mixed_types_keep_each_part_in_its_own_form(tmp_path: Path) -> None:
    """As in Q4_K_M files, where V and some FFN rows are Q6_K: the rows MLX reads quantized
    at the same width share a part; the others are parts of their own, in row order."""
    kinds = {"attn_k": T.Q4_0, "attn_v": T.Q6_K, "ffn_up": T.Q8_0, "ffn_down": T.F16}
    path = write_typed_llama(tmp_path / "mixed.gguf", T.Q4_K, kinds)
    model = Model.load(path, device="mlx")
    c, matrices = model.config, layer_matrices(model)
    wqkv, gate_up = matrices["wqkv"][0], matrices["w_gate_up"][0]
    assert wqkv.source == "Q4_K+Q4_0+Q6_K" and gate_up.source == "Q4_K+Q8_0"
    assert part_forms(wqkv) == [(4, c.dim + c.kv_dim), (None, c.kv_dim)]
    assert part_forms(gate_up) == [(4, c.ffn_dim), (8, c.ffn_dim)]
    assert part_forms(matrices["w_down"][0]) == [(None, c.dim)]
    assert model.weights.quantized
    assert_products_within_bound(model, path)
    float32 = Model.load(path, device="mlx", weights="float32")
    assert not float32.weights.quantized and float32.weights_mode == "float32"
    assert part_forms(layer_matrices(float32)["wqkv"][0]) == [(None, c.dim + 2 * c.kv_dim)]
    assert_products_within_bound(float32, path)
