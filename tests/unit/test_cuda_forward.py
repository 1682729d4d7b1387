"""The forward pass on the GPU with the weights kept quantized (engine/ops/quant/cuda.py) and the
layer kernels (engine/ops/gpu_ops.py) against the float64 NumPy reference of
test_forward_tiny.py, on tiny random models of two types and three head sizes.
Where no CUDA GPU is found (CI) the kernels run on the CPU (tests/cuda_emu); `warmfleet
doctor --device cuda` checks the real model on a GPU."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from engine.kv.kv_pool import detach
from engine.kv_files.spill_file import SpillStore
from engine.model import Model
from engine.ops import gpu_ops
from engine.ops.quant.cuda import GpuQuantMatrix
from tests.paged import new_kv, pool_of, run_segments
from tests.tiny_gguf import write_tiny_llama
from tests.unit.test_forward_tiny import ATOL, PROMPT, Reference, read_reference, reference_logits

pytestmark = pytest.mark.usefixtures("cuda_module")
T = gguf.GGMLQuantizationType
VARIANTS: dict[str, dict[str, Any]] = {  # head_dim 16: attention takes the gather path
    "q8-tied-d16": {"matrix_type": T.Q8_0, "tie_embeddings": True},
    "q8-tied-d32": {"matrix_type": T.Q8_0, "tie_embeddings": True, "dim": 128, "ffn_dim": 256},
    "q4_1-untied-d64-g4": {"matrix_type": T.Q4_1, "seed": 5, "dim": 256, "num_kv_heads": 1},
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def case(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    path: Path = write_tiny_llama(
        tmp_path_factory.mktemp("gpu") / "m.gguf", **VARIANTS[request.param]
    )
    return Model.load(path, device="cuda"), read_reference(path)


def test_the_matrices_stay_quantized_in_gpu_memory(case: tuple[Model, Reference]) -> None:
    model, _ = case
    assert (model.device, model.weights_mode) == ("cuda", "quantized")
    layer = model.weights.layers[0]
    for m in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down, model.weights.embed):
        assert isinstance(m, GpuQuantMatrix)
        assert type(m.codes).__module__.startswith("cupy")


def test_decode_and_prefill_match_the_reference(case: tuple[Model, Reference]) -> None:
    model, ref = case
    expected = reference_logits(ref, PROMPT)
    cache = new_kv(model)
    decoded = np.concatenate([run_segments(model, [(cache, [t])]) for t in PROMPT])
    assert np.abs(decoded - expected).max() < ATOL
    assert np.array_equal(decoded.argmax(-1), expected.argmax(-1))
    parts = [(new_kv(model), PROMPT[:n]) for n in range(1, len(PROMPT) + 1)]
    prefixes = run_segments(model, parts)  # every prefix in one step, each its own sequence
    assert np.abs(prefixes - expected).max() < ATOL


def test_mixed_batch_agrees_with_separate_runs(case: tuple[Model, Reference]) -> None:
    model, _ = case
    a, b = PROMPT[:9], PROMPT[4:15]
    solo_a, solo_b = new_kv(model), new_kv(model)
    run_segments(model, [(solo_a, a[:-1])])
    alone = np.stack(
        [run_segments(model, [(solo_a, a[-1:])])[0], run_segments(model, [(solo_b, b)])[0]]
    )
    cache_a, cache_b = new_kv(model), new_kv(model)
    run_segments(model, [(cache_a, a[:-1])])
    together = run_segments(model, [(cache_a, a[-1:]), (cache_b, b)])
    assert np.abs(together - alone).max() < 1e-5
    assert cache_a.token_ids == a and cache_b.token_ids == b


def test_every_layer_runs_the_gpu_kernels(
    case: tuple[Model, Reference], monkeypatch: pytest.MonkeyPatch
) -> None:
    model, _ = case
    calls: Counter[str] = Counter()
    for name in ("rms_norm", "rope_into_pool", "silu_mul", "paged_attention"):
        real = getattr(gpu_ops, name)

        def counted(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls[_name] += 1
            return _real(*args)

        monkeypatch.setattr(gpu_ops, name, counted)
    run_segments(model, [(new_kv(model), PROMPT[:5]), (new_kv(model), PROMPT[:1])])
    layers = model.config.num_layers
    attention = layers if gpu_ops.attention_fits(model.config.head_dim) else 0
    assert calls == Counter(rms_norm=2 * layers + 1, rope_into_pool=layers, silu_mul=layers,
                            paged_attention=attention)  # fmt: skip


def test_a_session_spills_to_disk_and_comes_back(
    case: tuple[Model, Reference], tmp_path: Path
) -> None:
    """The pool's keys and values come to host memory for the spill file, and go back to
    the GPU's pool when read: the next token's logits are the ones it gets unspilled."""
    model, _ = case
    c = model.config
    kept = new_kv(model)
    run_segments(model, [(kept, PROMPT[:-1])])
    expected = run_segments(model, [(kept, PROMPT[-1:])])
    spilled_kv = new_kv(model)
    run_segments(model, [(spilled_kv, PROMPT[:-1])])
    kv = detach(spilled_kv)
    assert type(kv.k) is np.ndarray and kv.k.shape == (c.num_layers, c.num_kv_heads,
                                                       len(PROMPT) - 1, c.head_dim)  # fmt: skip
    store = SpillStore(tmp_path, fingerprint=model.fingerprint)
    store.write("local/s", kv)
    back = store.read("local/s", like=(c.num_layers, c.num_kv_heads, c.head_dim),
                      dtype=model.dtype)  # fmt: skip
    assert back is not None and back.token_ids == PROMPT[:-1]
    restored = pool_of(model).load("", back.k, back.v, back.token_ids)
    assert np.array_equal(run_segments(model, [(restored, PROMPT[-1:])]), expected)


@pytest.mark.parametrize(("kv_dtype", "held"), [("float16", np.float16), ("q8_0", np.uint8)])
def test_a_smaller_pool_beside_float32_compute_gives_the_cpus_logits(
    tmp_path: Path, kv_dtype: str, held: type
) -> None:
    """--kv-dtype float16 or q8_0 on CUDA: the rope kernel rounds each key and value into a
    float16 pool (KVPool.write_layer quantizes a q8_0 one's, held as its blocks' bytes), the
    attention kernel widens them; the CPU's pool of the same dtype is the reference (both
    round alike, so the pools differ only where the float32 keys do)."""
    path = write_tiny_llama(tmp_path / "m.gguf", **VARIANTS["q8-tied-d32"])
    gpu = Model.load(path, device="cuda", kv_dtype=kv_dtype)
    cpu = Model.load(path, device="cpu", kv_dtype=kv_dtype)
    assert pool_of(gpu).k.dtype == held and gpu.dtype == np.float32
    cache_gpu, cache_cpu = new_kv(gpu), new_kv(cpu)
    got = np.concatenate([run_segments(gpu, [(cache_gpu, [t])]) for t in PROMPT])
    want = np.concatenate([run_segments(cpu, [(cache_cpu, [t])]) for t in PROMPT])
    assert np.abs(got - want).max() < 10 * ATOL
    assert np.array_equal(got.argmax(-1), want.argmax(-1))
    prompt = run_segments(gpu, [(new_kv(gpu), PROMPT)])  # one prefill: the last position
    assert np.abs(prompt[0] - want[-1]).max() < 10 * ATOL
