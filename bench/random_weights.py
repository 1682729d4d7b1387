"""Random quantized weights for the benchmark models (bench.random_model): the types
llama.cpp's quantizer gives each matrix, and random matrices of a chosen root mean square as
those types' bytes.

Types (src/llama-quant.cpp in llama-cpp-python 0.3.36's sources, llama_tensor_get_type_impl):
under LLAMA_FTYPE_MOSTLY_Q4_K_M every matrix is Q4_K except attn_v and ffn_down (the
experts' ffn_down_exps too), which are Q6_K on the layers use_more_bits picks; output.weight,
or the embedding when the output is tied to it, is Q6_K; an untied embedding stays Q4_K.
Where a row is not a multiple of 256 its fallbacks replace them: Q5_0 for Q4_K, Q8_0 for Q6_K.
Its rules for 8-expert models (Mixtral: attn_k and attn_v in Q8_0) do not apply to others.
Norms and routers (ffn_gate_inp) are never quantized: F32.
"""

from __future__ import annotations

import gguf
import numpy as np

T = gguf.GGMLQuantizationType
# a block's float16 d (and dmin) offsets and the mean of its codes: dmin = d * mean makes
# each K-quant sub-block's weights d * (sc * q - mean * m), zero on average
BLOCK_SCALES = {
    T.Q4_K: (0, 2, 7.5),
    T.Q5_K: (0, 2, 15.5),
    T.Q6_K: (208, None, 0.0),
    T.Q8_0: (0, None, 0.0),
}
K_QUANTS = (T.Q4_K, T.Q5_K, T.Q6_K)
FALLBACK = {T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}  # llama.cpp's, for rows not a multiple of 256
MORE_BITS = ("attn_v", "ffn_down", "ffn_down_exps")
CHUNK_ROWS = 8192  # rows quantized at once (the embedding has 151,936)


def use_more_bits(i: int, layers: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get more bits."""
    return i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2


def matrix_type(mix: str, kind: str, i: int, layers: int, k: int, tied: bool = True) -> T:
    """The type of layer i's matrix `kind` (or `token_embd`, `output`) with rows of k weights
    in a file of `layers` layers whose output is (or is not) `tied` to the embedding."""
    if mix == "q8_0":
        return T.Q8_0
    more_bits = kind in MORE_BITS and use_more_bits(i, layers)
    output = kind == "output" or (kind == "token_embd" and tied)
    qtype = T.Q6_K if output or more_bits else T.Q4_K
    return FALLBACK[qtype] if k % 256 else qtype


def set_scales(raw: np.ndarray, qtype: T, d: np.ndarray) -> None:
    """Write the blocks' d [..., blocks] (and dmin) into `raw` [..., blocks, bytes]."""
    d_at, dmin_at, mean = BLOCK_SCALES[qtype]
    for at, value in ((d_at, d), (dmin_at, d * mean)):
        if at is not None:
            half = value.astype(np.float16)
            raw[..., at : at + 2] = half.view(np.uint8).reshape(*half.shape, 2)


MXFP4_RMS = 5.85  # of the 16 E2M1 codes' doubled values, each code equally likely


def random_blocks(rng: np.random.Generator, qtype: T, rows: int, k: int, std: float) -> np.ndarray:
    """[rows, row bytes] of random valid blocks of `qtype` (a K-quant, Q8_0 or MXFP4: random
    codes, float16 scales or an E8M0 exponent) whose weights' root mean square is `std`."""
    block, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, (rows, k // block, block_bytes), dtype=np.uint8)
    if qtype == T.MXFP4:  # w = value * 2^(e - 128): the exponent nearest to std's
        raw[..., 0] = 128 + round(float(np.log2(std / MXFP4_RMS)))
        return raw.reshape(rows, -1)
    d = rng.uniform(0.5, 1.5, raw.shape[:2]).astype(np.float32)
    set_scales(raw, qtype, d)
    sample = gguf.quants.dequantize(raw[:16].reshape(min(rows, 16), -1), qtype)
    set_scales(raw, qtype, d * (std / float(np.sqrt(np.mean(sample**2)))))
    return raw.reshape(rows, -1)


def quantized(rng: np.random.Generator, qtype: T, rows: int, k: int, std: float) -> np.ndarray:
    """A random [rows, k] matrix of weights of root mean square `std`, as `qtype`'s bytes:
    random K-quant blocks, or normal values quantized (gguf.quants.quantize)."""
    if qtype in K_QUANTS:
        return random_blocks(rng, qtype, rows, k, std)
    parts = []
    for start in range(0, rows, CHUNK_ROWS):
        values = rng.standard_normal((min(CHUNK_ROWS, rows - start), k), dtype=np.float32)
        values *= np.float32(std)
        parts.append(gguf.quants.quantize(values, qtype))
    return np.concatenate(parts)
