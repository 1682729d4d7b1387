"""GGUF weight blocks turned into the kernels' form: codes plus a float32 scale and offset
per group of 16 or 32 weights, w = scale * code + offset, or half-precision values as they
are (matrix.py keeps the scales and offsets as float16 where they are exactly float16).

The product scale * code is exact in float32 for every type here (an f16 scale has 11
significant bits, a K-quant's sub-scale 6 or 8 more, a code at most 8), so one rounding of
scale * code + offset gives gguf's own float32 dequantization bit for bit; the tests check
it. Shapes: N rows (outputs), K weights per row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gguf
import numpy as np

T = gguf.GGMLQuantizationType

KIND_Q4, KIND_Q8, KIND_F16, KIND_BF16 = 0, 1, 2, 3  # as in qmatmul.c
HALF_GROUPS = 4  # qmatmul.c's kind of the same codes with float16 scales: Q4H = Q4 + 4
KIND_NAMES = {KIND_Q4: "4-bit codes", KIND_Q8: "8-bit codes", KIND_F16: "f16", KIND_BF16: "bf16"}


@dataclass(frozen=True, slots=True)
class Decoded:
    kind: int
    group: int  # weights per scale (16 or 32); 32 for F16/BF16, whose scales are empty
    codes: np.ndarray  # [N, K] uint8 code per weight, or [N, 2K] uint8 bytes of f16/bf16
    scale: np.ndarray  # [N, K / group] float32
    offset: np.ndarray  # [N, K / group] float32


def _f16(b: np.ndarray) -> np.ndarray:
    """[..., 2] uint8 -> [...] float32."""
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _blocks(raw: np.ndarray, qtype: T) -> np.ndarray:
    """[N, row bytes] uint8 -> [N, blocks per row, block bytes]."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    return raw.reshape(raw.shape[0], -1, size)


def _rows(a: np.ndarray, n: int) -> np.ndarray:
    return np.ascontiguousarray(a.reshape(n, -1))


def _q4_0(raw: np.ndarray) -> Decoded:
    b = _blocks(raw, T.Q4_0)
    n = b.shape[0]
    d = _f16(b[..., 0:2])
    return Decoded(KIND_Q4, 32, _unpack_32(b[..., 2:]), _rows(d, n), _rows(-8 * d, n))


def _q4_1(raw: np.ndarray) -> Decoded:
    b = _blocks(raw, T.Q4_1)
    n = b.shape[0]
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    return Decoded(KIND_Q4, 32, _unpack_32(b[..., 4:]), _rows(d, n), _rows(m, n))


def _q5_codes(b: np.ndarray) -> np.ndarray:
    """[N, nb, block bytes] Q5_0/Q5_1 blocks -> [N, nb * 32] 5-bit codes: the low nibbles
    as Q4_0's (the block's last 16 bytes), bit j of the 32-bit word before them on top of
    weight j."""
    n = b.shape[0]
    qh = np.ascontiguousarray(b[..., -20:-16]).view("<u4")  # [N, nb, 1]
    high = (qh >> np.arange(32, dtype=np.uint32)) & 1  # [N, nb, 32]
    return _unpack_32(b[..., -16:]) | _rows(high.astype(np.uint8) << 4, n)


def _q5_0(raw: np.ndarray) -> Decoded:
    b = _blocks(raw, T.Q5_0)
    n = b.shape[0]
    d = _f16(b[..., 0:2])
    return Decoded(KIND_Q8, 32, _q5_codes(b), _rows(d, n), _rows(-16 * d, n))


def _q5_1(raw: np.ndarray) -> Decoded:
    b = _blocks(raw, T.Q5_1)
    n = b.shape[0]
    d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
    return Decoded(KIND_Q8, 32, _q5_codes(b), _rows(d, n), _rows(m, n))


def _q8_0(raw: np.ndarray) -> Decoded:
    b = _blocks(raw, T.Q8_0)
    n = b.shape[0]
    d = _f16(b[..., 0:2])
    codes = b[..., 2:] ^ np.uint8(0x80)  # int8 + 128
    return Decoded(KIND_Q8, 32, _rows(codes, n), _rows(d, n), _rows(-128 * d, n))


def _k_scales(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K super-block header -> per 32-weight sub-block scale and offset."""
    n, nb = b.shape[:2]
    d, dmin = _f16(b[..., 0:2])[..., None], _f16(b[..., 2:4])[..., None]
    sc, m = gguf.quants.Q4_K.get_scale_min(b[..., 4:16].reshape(n * nb, 12))
    scale = d * sc.reshape(n, nb, 8).astype(np.float32)
    return _rows(scale, n), _rows(-(dmin * m.reshape(n, nb, 8).astype(np.float32)), n)


def _q4_k(raw: np.ndarray) -> Decoded:
    b = _blocks(raw, T.Q4_K)
    n = b.shape[0]
    qs = b[..., 16:].reshape(n, -1, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 2, 1)
    scale, offset = _k_scales(b)
    return Decoded(KIND_Q4, 32, _rows(qs & 0x0F, n), scale, offset)


def _q5_k(raw: np.ndarray) -> Decoded:
    b = _blocks(raw, T.Q5_K)
    n, nb = b.shape[:2]
    qh = b[..., 16:48].reshape(n, nb, 1, 32) >> np.arange(8, dtype=np.uint8).reshape(1, 1, 8, 1)
    ql = b[..., 48:].reshape(n, nb, 4, 1, 32) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    q = (ql.reshape(n, nb, 8, 32) & 0x0F) | ((qh.reshape(n, nb, 8, 32) & 0x01) << 4)
    scale, offset = _k_scales(b)
    return Decoded(KIND_Q8, 32, _rows(q, n), scale, offset)


def _q6_k(raw: np.ndarray) -> Decoded:
    b = _blocks(raw, T.Q6_K)
    n, nb = b.shape[:2]
    ql = b[..., :128].reshape(n, nb, 2, 1, 64) >> np.array([0, 4], np.uint8).reshape(1, 1, 1, 2, 1)
    qh = b[..., 128:192].reshape(n, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(
        1, 1, 1, 4, 1
    )
    q = (ql.reshape(n, nb, 8, 32) & 0x0F) | ((qh.reshape(n, nb, 8, 32) & 0x03) << 4)
    sc = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(np.float32)
    scale = _f16(b[..., 208:210])[..., None] * sc  # [N, nb, 16]
    return Decoded(KIND_Q8, 16, _rows(q, n), _rows(scale, n), _rows(-32 * scale, n))


MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int16)


def _mxfp4(raw: np.ndarray) -> Decoded:
    """gpt-oss's experts: an E8M0 exponent e and 32 E2M1 values (low nibbles first), w =
    v * 2^(e - 127) for v in MXFP4_VALUES / 2: here code v + 12 (0..24), scale 2^(e - 128),
    offset -12 * scale, all exact."""
    b = _blocks(raw, T.MXFP4)
    n = b.shape[0]
    e = b[..., 0].astype(np.int32)
    scale = np.ldexp(np.float32(1), e - 128).astype(np.float32)
    codes = (MXFP4_VALUES[_unpack_32(b[..., 1:])] + 12).astype(np.uint8)
    return Decoded(KIND_Q8, 32, codes, _rows(scale, n), _rows(-12 * scale, n))


Decoder = Callable[[np.ndarray], Decoded]


def _half(kind: int) -> Decoder:
    def decode(raw: np.ndarray) -> Decoded:
        empty = np.zeros((raw.shape[0], 0), np.float32)
        return Decoded(kind, 32, np.ascontiguousarray(raw.view(np.uint8)), empty, empty)

    return decode


DECODERS: dict[T, Decoder] = {
    T.Q4_0: _q4_0,
    T.Q4_1: _q4_1,
    T.Q5_0: _q5_0,
    T.Q5_1: _q5_1,
    T.Q8_0: _q8_0,
    T.Q4_K: _q4_k,
    T.Q5_K: _q5_k,
    T.Q6_K: _q6_k,
    T.MXFP4: _mxfp4,
    T.F16: _half(KIND_F16),
    T.BF16: _half(KIND_BF16),
}
SUPPORTED = tuple(t.name for t in DECODERS)  # F32 matrices stay float32 arrays


def _unpack_32(qs: np.ndarray) -> np.ndarray:
    """[N, nb, 16] bytes of Q4_0/Q4_1 blocks -> [N, nb * 32] codes (low nibbles first)."""
    n = qs.shape[0]
    return _rows(np.stack([qs & 0x0F, qs >> 4], axis=2), n)


def decode(raw: np.ndarray, qtype: T) -> Decoded:
    """The tensor's rows [N, row bytes] (as gguf's reader gives them) in the kernels' form."""
    return DECODERS[qtype](raw)


def pack_nibbles(codes: np.ndarray) -> np.ndarray:
    """[N, K] 4-bit codes -> [N, K/2] bytes: byte j of each 32-weight group holds weight j
    in its low nibble and weight j + 16 in its high one."""
    g = codes.reshape(codes.shape[0], -1, 2, 16)
    return _rows(g[:, :, 0] | (g[:, :, 1] << 4), codes.shape[0])


def reconstruct(d: Decoded) -> np.ndarray:
    """[N, K] float32 weights from the decoded form, as the kernels compute them."""
    if d.kind == KIND_F16:
        return d.codes.view(np.float16).astype(np.float32)
    if d.kind == KIND_BF16:
        return (d.codes.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    scale = np.repeat(d.scale, d.group, axis=1)
    offset = np.repeat(d.offset, d.group, axis=1)
    return scale * d.codes.astype(np.float32) + offset
