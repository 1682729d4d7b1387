"""Make tests/fixtures/tiny_{family}_llamacpp.npz: llama.cpp's logits for the tiny models of
tests/tiny_families.py (llama3, qwen2, qwen3, qwen3moe) and tests/tiny_gpt_oss.py
(gpt-oss), the reference for warmfleet's paths for those families (tokenizer, RoPE
frequency factors and YaRN, q/k/v biases, per-head q/k norms, a head size other than dim /
heads, grouped-query attention, tied output, experts, sliding windows and sinks).

llama.cpp runs them through llama-cpp-python (`pip install '.[bench]'`, built with the flags
in DESIGN.md) with float32 weights and a float32 KV cache, flash attention off, so no
product of its rounds through float16 or 8 bits: its logits are a float32 computation of
the same model, as transformers' are for the default model. From the repository root::

    .venv/bin/python tests/reference/make_family_fixtures.py [FAMILY ...]

(all families when none is named; a fixture made again on another CPU may differ in its
last bits, so name only the one that changed).

For each text: the token ids llama.cpp gives (BOS where the family has one), its logits at
every position on a column subset (every 128th id and each position's top 8), and 8 greedy
tokens after it; and the sha256 of the model file it ran.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import llama_cpp  # noqa: E402

from tests import tiny_gpt_oss as gpt_oss_model  # noqa: E402
from tests.tiny_families import FAMILIES, write_tiny  # noqa: E402
from tests.tiny_gpt_oss import write_tiny_gpt_oss  # noqa: E402

GREEDY_TOKENS = 8
F32 = 0  # GGML_TYPE_F32


def run(path: Path, texts: tuple[str, ...], add_bos: bool) -> dict[str, Any]:
    """llama.cpp's ids, logits and greedy tokens for each of `texts` on the model `path`."""
    llm = llama_cpp.Llama(
        model_path=str(path), n_ctx=512, n_batch=512, n_threads=2, logits_all=True,
        type_k=F32, type_v=F32, flash_attn=False, verbose=False,
    )  # fmt: skip
    out: dict[str, Any] = {"model_sha256": np.array(hashlib.sha256(path.read_bytes()).hexdigest())}
    for n, text in enumerate(texts):
        ids = llm.tokenize(text.encode(), add_bos=add_bos, special=True)
        llm.reset()
        llm.eval(ids)
        logits = np.array(llm.scores[: len(ids)], dtype=np.float32)
        greedy = []
        for _ in range(GREEDY_TOKENS):
            greedy.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([greedy[-1]])
        top = np.argsort(-logits, axis=1)[:, :8]
        cols = np.union1d(np.arange(0, logits.shape[1], 128), top.ravel())
        out[f"ids_{n}"] = np.array(ids, dtype=np.int64)
        out[f"cols_{n}"] = cols.astype(np.int64)
        out[f"logits_{n}"] = logits[:, cols]
        out[f"greedy_{n}"] = np.array(greedy, dtype=np.int64)
        print(f"  text {n}: {len(ids)} tokens, greedy {greedy}")
    return out


def tokenizer_cases(path: Path, texts: tuple[str, ...]) -> dict[str, Any]:
    """llama.cpp's ids for each of `texts` (no BOS, special tokens parsed)."""
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    ids = [llm.tokenize(t.encode(), add_bos=False, special=True) for t in texts]
    return {f"tok_{n}": np.array(i, dtype=np.int64) for n, i in enumerate(ids)}


def gpt_oss() -> dict[str, Any]:
    """The tiny gpt-oss model's reference: llama.cpp runs the twin whose experts hold the
    MXFP4 values in F32 (its MXFP4 products would quantize activations); the sha256 kept
    is the MXFP4 file's, the one the tests load."""
    with tempfile.TemporaryDirectory() as tmp:
        path = write_tiny_gpt_oss(Path(tmp) / "tiny-gpt-oss.gguf")
        twin = write_tiny_gpt_oss(Path(tmp) / "tiny-gpt-oss-f32.gguf", experts_f32=True)
        out = run(twin, gpt_oss_model.TEXTS, add_bos=False)
        out |= tokenizer_cases(path, gpt_oss_model.TOKENIZER_TEXTS)
        out["model_sha256"] = np.array(hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def main() -> None:
    for name in sys.argv[1:] or [*FAMILIES, "gpt-oss"]:
        print(name)
        if name == "gpt-oss":
            out = gpt_oss()
        else:
            with tempfile.TemporaryDirectory() as tmp:
                path = write_tiny(Path(tmp) / f"tiny-{name}.gguf", name)
                out = run(path, FAMILIES[name].texts, FAMILIES[name].add_bos)
        target = REPO / "tests" / "fixtures" / f"tiny_{name.replace('-', '_')}_llamacpp.npz"
        np.savez_compressed(target, **out)
        print(f"{target}: {target.stat().st_size} bytes, model sha256 {out['model_sha256']}")


if __name__ == "__main__":
    main()
