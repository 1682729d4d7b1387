"""A q8_0 pool as CUDA holds it (engine/kv/kv_pool.py's `device_bytes`: each row its blocks'
bytes, CuPy having no structured dtype), on the CPU stand-in for CuPy (tests/cuda_emu): the
bytes written for a step's keys and values, a session loaded from the host and taken back,
and what a spill takes to the host are the CPU q8_0 pool's, byte for byte. The attention
kernel that reads these bytes runs in tests/unit/test_cuda_forward.py."""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.kv.kv_pool import KVPool, detach
from engine.kv_files.kv_dtypes import Q8_0, quantize, quantize_bytes
from engine.model import Model
from tests.cuda_emu import cupy_module

cp: Any = cupy_module.module()


def test_the_bytes_quantized_on_the_device_are_each_blocks_d_then_its_codes() -> None:
    x = (np.random.default_rng(0).standard_normal((7, 3, 64)) * 4).astype(np.float32)
    x[0, 0, :32] = 0  # a block of zeros: d 0, codes 0
    got = quantize_bytes(cp.asarray(x), cp).get()
    assert got.dtype == np.uint8 and got.shape == (7, 3, 68)
    blocks, parts = x.reshape(7, 3, 2, 32), got.reshape(7, 3, 2, 34)
    d = np.abs(blocks).max(axis=-1, keepdims=True) / np.float32(127)
    half = np.ascontiguousarray(parts[..., :2]).view("<f2")
    assert np.array_equal(half, d.astype(np.float16))
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d > 0)
    codes = np.ascontiguousarray(parts[..., 2:]).view(np.int8)
    assert np.array_equal(codes, np.rint(blocks * inverse).astype(np.int8))
    assert got.tobytes() == quantize(x).tobytes()  # what the CPU's q8_0 pool holds


def test_a_device_pool_holds_and_gives_back_the_host_pools_q8_0(model_kv_q8: Model) -> None:
    c = model_kv_q8.config
    host = KVPool(c, 8, Q8_0, np)
    dev = KVPool(c, 8, Q8_0, cp)
    assert dev.device_bytes and not host.device_bytes
    assert dev.k.dtype == np.uint8 and dev.k.shape[-1] == c.head_dim // 32 * 34
    assert dev.bytes_per_token == host.bytes_per_token
    rng = np.random.default_rng(1)
    ids = list(range(40))  # two whole blocks and a part
    shape = (c.num_layers, c.num_kv_heads, len(ids), c.head_dim)
    k, v = (quantize(rng.standard_normal(shape).astype(np.float32)) for _ in "kv")
    tables = [pool.load("", k, v, ids) for pool in (host, dev)]  # from the host: put
    step = rng.standard_normal((2, c.num_kv_heads, c.head_dim)).astype(np.float32)
    for pool, kv in zip((host, dev), tables, strict=True):  # a step's two new positions
        kv.prepare_write(kv.offset, 2)
        rows = pool.flat_rows(*kv.slots(kv.offset, 2))
        for layer in range(c.num_layers):
            pool.write_layer(layer, *(pool.xp.asarray(a) for a in (rows, step, step * 2)))
        kv.commit([7, 8])
    assert np.array_equal(dev.k.get(), host.k.view(np.uint8).reshape(dev.k.shape))
    assert np.array_equal(dev.v.get(), host.v.view(np.uint8).reshape(dev.v.shape))
    spilled = [detach(kv) for kv in tables]  # what a spill file gets: q8_0 on the host
    assert spilled[1].k.dtype == Q8_0 and spilled[1].k.shape == spilled[0].k.shape
    for a, b in ((spilled[0].k, spilled[1].k), (spilled[0].v, spilled[1].v)):
        assert a.tobytes() == b.tobytes()
    assert spilled[1].k[:, :, : len(ids)].tobytes() == k.tobytes()
