"""Make the reference fixtures in tests/fixtures/ from Hugging Face transformers (float32).

The fixtures pin what warmfleet's own tokenizer and engine must reproduce:

- ``tokenizer_cases.json``: ids = ``tok.encode(text, add_special_tokens=True)`` and
  ``tok.decode(ids)`` for a varied corpus (code, unicode, emoji, whitespace runs, digits,
  contractions, special tokens written as literal text, ChatML, ...).
- ``reference_logits.npz``: the logits at every position of a few prompts, on a fixed column
  subset ``cols`` (every 16th vocab id plus the top-32 ids of every position), and the full
  top-5 (ids and values) of every position.
- ``greedy_chats.json``: chat conversations rendered with the model's chat template, with 32
  greedy tokens each and the top-1/top-2 logit margin of every generated step.

This script runs outside the project's own venv, in a separate reference venv that has torch
and transformers (the torch CPU wheel 2.13.0 lies on local disk; pin it, any other version
would download a multi-GB CUDA build)::

    python3 -m venv /work/refenv
    /work/refenv/bin/pip install torch==2.13.0
    /work/refenv/bin/pip install torch==2.13.0 transformers accelerate gguf sentencepiece \
        numpy jinja2

Then, from the repository root::

    /work/refenv/bin/python tests/reference/make_fixtures.py [--model PATH] [--out DIR]

``--model`` defaults to the default model in warmfleet's cache
(``$WARMFLEET_MODEL_DIR`` or ``~/.cache/warmfleet/models``, file
``SmolLM2-135M-Instruct.Q4_1.gguf``; ``warmfleet pull`` or ``warmfleet.models`` fetches it).
It takes about a minute on 2 cores and is deterministic (one thread, fixed seed).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers
from fixture_chats import write_greedy_chats
from fixture_logits import write_reference_logits
from fixture_tokenizer import describe_tokenizer, print_tokenizer_pipeline, write_tokenizer_cases
from transformers import AutoModelForCausalLM, AutoTokenizer

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WRITTEN = ("tokenizer_cases.json", "reference_logits.npz", "greedy_chats.json")


def default_model() -> Path:
    """The default model's path in warmfleet's model cache."""
    env = os.environ.get("WARMFLEET_MODEL_DIR")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "warmfleet" / "models"
    return base / DEFAULT_MODEL_FILE


def sha256_of(path: Path) -> str:
    """The hex SHA-256 of the file at `path`."""
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """--model and --out from `argv` (the command line when None)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF file (default: cached SmolLM2)")
    ap.add_argument(
        "--out", type=Path, default=FIXTURES, help=f"output folder (default {FIXTURES})"
    )
    return ap.parse_args(argv)


def provenance(model_path: Path) -> dict[str, str]:
    """What every fixture records of its making: the model file, its hash, the library
    versions. Printed too."""
    sha = sha256_of(model_path)
    meta = {
        "model_file": model_path.name,
        "model_sha256": sha,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    print(f"model {model_path} sha256 {sha}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    return meta


def load_reference(model_path: Path) -> tuple[Any, Any]:
    """transformers' tokenizer and float32 model (in eval mode) from the GGUF file."""
    d, name = str(model_path.parent), model_path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    try:
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    except TypeError:  # older transformers
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, torch_dtype=torch.float32)
    model.eval()
    return tok, model


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    model_path = (args.model or default_model()).expanduser().resolve()
    if not model_path.is_file():
        print(f"model file not found: {model_path}", file=sys.stderr)
        return 2
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    meta = provenance(model_path)
    tok, model = load_reference(model_path)
    print(f"loaded in {time.time() - t0:.1f} s")

    info = describe_tokenizer(tok)
    print_tokenizer_pipeline(tok, info)
    write_tokenizer_cases(tok, info, meta, out_dir)
    write_reference_logits(tok, model, meta, out_dir)
    write_greedy_chats(tok, model, meta, out_dir)

    for f in WRITTEN:
        p = out_dir / f
        print(f"wrote {p} ({p.stat().st_size / 1024:.1f} KiB)")
    print(f"done in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
