"""The reference_logits.npz fixture: transformers' logits at every position of a few prompts,
on a fixed subset of columns, and the full top-5 of every position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from fixture_prompts import CODE_PROMPT, LOGIT_CHAT
from fixture_tokenizer import chat_ids

COL_STRIDE = 16  # every 16th vocab id goes into the stored logit columns
TOP_COLS = 32  # plus the top-32 ids of every position


def logit_prompts(tok: Any) -> list[tuple[str, list[int]]]:
    """The named prompts, as ids: plain text, code, and a chat."""
    return [
        ("capital", [int(i) for i in tok.encode("The capital of France is")]),
        ("code", [int(i) for i in tok.encode(CODE_PROMPT)]),
        ("chat", chat_ids(tok, LOGIT_CHAT)),
    ]


def prompt_logits(model: Any, prompts: list[tuple[str, list[int]]]) -> list[np.ndarray]:
    """The [positions, vocab] float32 logits of each prompt, from one forward pass each."""
    full = []
    with torch.no_grad():
        for pname, ids in prompts:
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
            full.append(logits)
            print(f"prompt {pname}: {len(ids)} tokens")
    return full


def stored_columns(full: list[np.ndarray]) -> np.ndarray:
    """Every COL_STRIDE-th vocab id and the top TOP_COLS ids of every position, sorted."""
    vocab_size = full[0].shape[1]
    colset = set(range(0, vocab_size, COL_STRIDE))
    for lg in full:
        top = np.argsort(-lg, axis=1, kind="stable")[:, :TOP_COLS]
        colset.update(int(c) for c in top.ravel())
    return np.array(sorted(colset), dtype=np.int32)


def logit_arrays(
    prompts: list[tuple[str, list[int]]],
    full: list[np.ndarray],
    cols: np.ndarray,
    meta: dict[str, str],
) -> dict[str, np.ndarray]:
    """The arrays of the .npz: per prompt its ids, its logits on `cols` and its top-5."""
    arrays: dict[str, np.ndarray] = {
        "prompt_names": np.array([p for p, _ in prompts]),
        "cols": cols,
        "model_sha256": np.array(meta["model_sha256"]),
        "transformers_version": np.array(meta["transformers_version"]),
    }
    for i, ((_, ids), lg) in enumerate(zip(prompts, full, strict=True)):
        top5 = np.argsort(-lg, axis=1, kind="stable")[:, :5]
        arrays[f"ids_{i}"] = np.array(ids, dtype=np.int32)
        arrays[f"logits_{i}"] = np.ascontiguousarray(lg[:, cols], dtype=np.float32)
        arrays[f"top5_ids_{i}"] = top5.astype(np.int32)
        arrays[f"top5_vals_{i}"] = np.take_along_axis(lg, top5, axis=1).astype(np.float32)
    return arrays


def write_reference_logits(tok: Any, model: Any, meta: dict[str, str], out_dir: Path) -> None:
    """Write reference_logits.npz to `out_dir`, and print the first prompt's last top-5 next to
    the values DESIGN.md expects."""
    prompts = logit_prompts(tok)
    full = prompt_logits(model, prompts)
    cols = stored_columns(full)
    arrays = logit_arrays(prompts, full, cols, meta)
    np.savez_compressed(out_dir / "reference_logits.npz", **arrays)  # type: ignore[arg-type]
    last = full[0][-1]
    t5 = np.argsort(-last, kind="stable")[:5]
    print(
        "sanity 'The capital of France is' top-5:", ", ".join(f"{int(i)}:{last[i]:.4f}" for i in t5)
    )
    print(
        "expected (DESIGN.md):            "
        "7042:17.371, 260:14.889, 4528:13.245, 2250:13.010, 1315:12.952"
    )
    print(f"{len(cols)} stored logit columns")
