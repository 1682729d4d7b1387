"""Spill files across devices, on the real default model: a session's KV that a NumPy (CPU)
worker evicts and spills restores on an MLX worker, and the other way round. The bytes go
to disk and back through the worker's own Spiller and SpillStore; they come back bit for
bit, turn 2 reuses all of them, and its tokens are those of the whole conversation computed
from scratch on the CPU."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from broker.keys import cache_key
from common.errors import SpillFileError
from common.sampling import SamplingParams
from engine.engine import Engine, StepOutput
from engine.kv.kv_pool import PagedKV
from engine.kv_files.spill_file import FileSummary, SpilledKV, SpillStore, read_summary
from engine.model import Model
from engine.sequence import Request
from tests.cluster_helpers import prompt_ids
from worker.spiller import Spiller

pytestmark = pytest.mark.slow

TENANT = "acme"
KEY = cache_key(TENANT, "chat-1")
GREEDY = SamplingParams(max_tokens=6)
TURN1 = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a color."},
]
TOLERANCE = 1e-3  # MLX and NumPy keys and values differ by ~3e-5 (values up to ~20)


@pytest.fixture(scope="module")
def mlx_model(default_model_path: Path) -> Model:
    """The default model on MLX (its CPU build here), matrices kept quantized, KV in float32
    (in float16 each device's roundings feed the next layer: 1e-2 apart after 22)."""
    return Model.load(default_model_path, device="mlx", kv_dtype="float32")


@pytest.fixture(scope="module")
def models(model_kv_float32: Model, mlx_model: Model) -> dict[str, Model]:
    model = model_kv_float32  # MLX's pool holds float32: the same bits both ways
    assert (model.device, mlx_model.device) == ("cpu", "mlx")
    # one file, one fingerprint: a spill file of either is the other's
    assert model.fingerprint == mlx_model.fingerprint and model.dtype == mlx_model.dtype
    return {"cpu": model, "mlx": mlx_model}


@dataclass(frozen=True)
class Turn1:
    prompt: list[int]
    ids: list[int]  # the tokens sampled
    text: str
    kv: SpilledKV  # the session's KV as the engine evicted it: what a worker spills
    block_size: int  # the engine's pool's (the worker's SpillStore uses it)


def ids_of(outputs: list[StepOutput]) -> list[int]:
    return [t for out in outputs for t in out.token_ids]


@pytest.fixture(scope="module")
def turn1(models: dict[str, Model]) -> dict[str, Turn1]:
    """Turn 1 of the session on each device; then its budget cut to nothing, so the engine
    evicts the session (copied out of the pool) as it does under a worker."""
    done = {}
    for device, model in models.items():
        engine = Engine(model)
        prompt = prompt_ids(model, TURN1)
        request = Request("t1", prompt, GREEDY, cache_key=KEY, scope=TENANT)
        outputs = engine.generate([request])["t1"]
        engine.set_session_budget(0)
        [(key, kv)] = engine.evicted_sessions
        assert key == KEY and engine.pool.alloc.num_held == 0
        text = "".join(o.text for o in outputs)
        done[device] = Turn1(prompt, ids_of(outputs), text, kv, engine.pool.block_size)
    return done


def spill(model: Model, kv: SpilledKV, directory: Path, block_size: int) -> FileSummary:
    """Write the session as the source worker does: its Spiller, on its I/O thread."""
    spiller = Spiller(SpillStore(directory, model.fingerprint, block_size), model)
    spiller.spill(KEY, kv)
    spiller.close()  # waits for the write
    [done] = spiller.completed()
    assert done.key == KEY and done.file is not None, done.error
    assert spiller.stats.num_spilled == 1
    return done.file


def read_back(model: Model, directory: Path, block_size: int) -> SpilledKV:
    """Read the session back as the restoring worker does (its model's shape and dtype)."""
    spiller = Spiller(SpillStore(directory, model.fingerprint, block_size), model)
    assert spiller.has_file(KEY)
    kv, found = spiller.take_back(KEY)
    spiller.close()
    assert found == "disk" and kv is not None
    assert not spiller.has_file(KEY)  # deleted once back in memory
    assert spiller.stats.num_restored == 1 and spiller.stats.num_rejected == 0
    return kv


def assert_same_bits(got: tuple[np.ndarray, np.ndarray], want: SpilledKV) -> None:
    k, v = (np.asarray(a) for a in got)
    assert k.dtype == want.k.dtype and v.dtype == want.v.dtype
    np.testing.assert_array_equal(k, want.k, strict=True)
    np.testing.assert_array_equal(v, want.v, strict=True)


def run_turn2(engine: Engine, prompt: list[int], restored: PagedKV) -> list[int]:
    """Turn 2 on `engine` using the restored KV; checks that none of it is recomputed."""
    restored_n = restored.offset
    request = Request("t2", prompt, GREEDY, cache_key=KEY, scope=TENANT)
    seq = engine.add(request, restored)
    assert seq.cache is restored and seq.num_cached == seq.num_computed == restored_n
    outputs: list[StepOutput] = []
    while engine.has_work:
        outputs += engine.step()
    done = outputs[-1].completion
    assert done is not None and done.cached_tokens == restored_n
    assert engine.stats.num_prefill_tokens == len(prompt) - restored_n
    return ids_of(outputs)


def cold(model: Model, prompt: list[int]) -> list[int]:
    """The reference: the whole prompt computed from scratch, no session."""
    return ids_of(Engine(model).generate([Request("cold", prompt, GREEDY)])["cold"])


@pytest.mark.parametrize(("src", "dst"), [("cpu", "mlx"), ("mlx", "cpu")])
def test_a_session_spilled_on_one_device_restores_on_the_other(
    models: dict[str, Model], turn1: dict[str, Turn1], tmp_path: Path, src: str, dst: str
) -> None:
    first, theirs = turn1[src], turn1[dst]
    assert first.ids == theirs.ids  # both devices answer turn 1 alike
    held = first.prompt + first.ids[:-1]  # the last token sampled was never fed back
    assert first.kv.token_ids == held and first.kv.scope == TENANT
    written = spill(models[src], first.kv, tmp_path, first.block_size)
    path = SpillStore(tmp_path, models[src].fingerprint).path_for(KEY)
    on_disk = read_summary(path)
    assert on_disk is not None and on_disk.key == KEY and on_disk.num_tokens == len(held)
    assert len(written.blocks) == len(held) // first.block_size >= 1  # blocks and a tail

    engine = Engine(models[dst])  # a fresh worker: its pool shares no block with the file
    back = read_back(models[dst], tmp_path, engine.pool.block_size)
    assert back.token_ids == held and back.scope == TENANT and not back.incomplete
    assert_same_bits((back.k, back.v), first.kv)
    restored = engine.load_kv(TENANT, back)  # as WorkerState.load
    k, v, ids = restored.state()
    assert ids == held
    assert_same_bits((k, v), first.kv)  # through the other device's pool, unchanged
    own = theirs.kv  # what this device computes itself for the same tokens
    np.testing.assert_allclose(np.asarray(k), own.k, rtol=TOLERANCE, atol=TOLERANCE)
    np.testing.assert_allclose(np.asarray(v), own.v, rtol=TOLERANCE, atol=TOLERANCE)

    turn2 = [
        *TURN1,
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": "And another one?"},
    ]
    prompt = prompt_ids(models[dst], turn2)
    assert prompt[: len(held)] == held  # the chat so far continues the session's tokens
    got = run_turn2(engine, prompt, restored)
    assert len(got) == GREEDY.max_tokens
    assert got == cold(models["cpu"], prompt)


@pytest.mark.parametrize("device", ["cpu", "mlx"])
def test_a_spill_file_of_another_model_is_rejected(
    models: dict[str, Model], turn1: dict[str, Turn1], tmp_path: Path, device: str
) -> None:
    model, kv = models[device], turn1["cpu"].kv
    foreign = SpillStore(tmp_path, "another-model")
    store = SpillStore(tmp_path, model.fingerprint)
    foreign.write(KEY, kv)
    shape = (model.config.num_layers, model.config.num_kv_heads, model.config.head_dim)
    with pytest.raises(SpillFileError, match="another model"):
        store.read(KEY, like=shape, dtype=model.dtype)
    assert not store.path_for(KEY).exists() and store.num_rejected == 1

    foreign.write(KEY, kv)  # and as a worker meets it: rejected, deleted, counted
    spiller = Spiller(SpillStore(tmp_path, model.fingerprint), model)
    assert spiller.has_file(KEY)
    assert spiller.take_back(KEY) == (None, "rejected")
    spiller.close()
    assert spiller.stats.num_rejected == 1 and spiller.stats.num_restored == 0
    assert not spiller.has_file(KEY)
