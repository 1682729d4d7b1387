"""Same tokens whatever the KV path, for each KV dtype, on the real model: a session's KV
kept warm (its prompt prefilled, then decoded one token a step), restored from its spill
file and recomputed from its tokens in one prefill hold the same bytes, and the greedy
continuation from each gives the same logits, bit for bit. A value's bytes depend on its own
position's inputs only (a q8_0 block's on its own 32 values), so this holds in float16 and
q8_0 as in float32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.kv.kv_pool import PagedKV, detach
from engine.kv_files.kv_dtypes import kv_name
from engine.kv_files.spill_file import SpillStore
from engine.model import Model
from tests.paged import new_kv, pool_of, run_segments
from worker.spiller import Spiller

pytestmark = pytest.mark.slow
PROMPT = "Three agents share one box. The first asks for a poem about the sea, and the second"
NEW_TOKENS = 24  # decoded one a step into the warm KV
MORE_TOKENS = 8  # then greedy from each of the three


def held_bytes(kv: PagedKV) -> tuple[bytes, bytes, list[int]]:
    k, v, ids = kv.state()
    return np.asarray(k).tobytes(), np.asarray(v).tobytes(), list(ids)


def greedy(model: Model, kv: PagedKV, token: int, count: int) -> tuple[list[int], np.ndarray]:
    tokens, rows = [], []
    for _ in range(count):
        logits = run_segments(model, [(kv, [token])])[0]
        token = int(np.argmax(logits))
        tokens.append(token)
        rows.append(logits)
    return tokens, np.stack(rows)


KV_DTYPES = {"model": "float16", "model_kv_float32": "float32", "model_kv_q8": "q8_0"}


@pytest.mark.parametrize("which", list(KV_DTYPES), ids=list(KV_DTYPES.values()))
def test_warm_restored_and_recomputed_kv_hold_the_same_bytes_and_tokens(
    request: pytest.FixtureRequest, which: str, tmp_path: Path
) -> None:
    model: Model = request.getfixturevalue(which)
    assert kv_name(model.kv_dtype) == KV_DTYPES[which]
    prompt = model.tokenizer.encode(PROMPT)
    warm = new_kv(model, scope="local")
    token = int(np.argmax(run_segments(model, [(warm, prompt)])[0]))
    decoded, _ = greedy(model, warm, token, NEW_TOKENS)
    history = [*prompt, token, *decoded[:-1]]  # the last token sampled is not in the KV yet
    assert warm.token_ids == history

    recomputed = new_kv(model, scope="local")
    run_segments(model, [(recomputed, history)])  # one prefill

    store = SpillStore(tmp_path, model.fingerprint)
    store.write("local/s", detach(warm.fork()))
    spiller = Spiller(SpillStore(tmp_path, model.fingerprint), model)
    back, where = spiller.take_back("local/s")
    spiller.close()
    assert where == "disk" and back is not None and back.converted_from == ""
    assert back.k.dtype == model.kv_dtype
    restored = pool_of(model).load(back.scope, back.k, back.v, back.token_ids)

    expected = held_bytes(warm)
    assert len(expected[0]) == len(history) * model.bytes_per_token // 2  # the keys' half
    assert held_bytes(recomputed) == expected
    assert held_bytes(restored) == expected
    runs = [greedy(model, kv, decoded[-1], MORE_TOKENS) for kv in (warm, recomputed, restored)]
    assert runs[1][0] == runs[0][0] and runs[2][0] == runs[0][0]
    assert np.array_equal(runs[1][1], runs[0][1]) and np.array_equal(runs[2][1], runs[0][1])
    for kv in (warm, recomputed, restored):
        kv.release()
