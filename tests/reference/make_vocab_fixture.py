"""Make tests/fixtures/llama3_vocab.json.xz and qwen2_vocab.json.xz from llama.cpp's
vocabulary test files.

llama.cpp keeps, for each tokenizer family it supports, a GGUF holding only the vocabulary
(`models/ggml-vocab-llama-bpe.gguf`: Meta Llama 3's 128,256 tokens and 280,147 merges;
`ggml-vocab-qwen2.gguf`: Qwen 2's 151,936 and 151,387) and
the token ids its own tokenizer must give for a set of texts (`.gguf.inp`, the texts
separated by a `__ggml_vocab_test__` line; `.gguf.out`, one line of ids per text, no BOS).
Each fixture holds a file's `tokenizer.*` metadata and those cases, xz-compressed (1.3 MB).
The files ship in llama-cpp-python's source archive on PyPI::

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d /tmp/lcp
    tar xzf /tmp/lcp/llama_cpp_python-0.3.36.tar.gz -C /tmp/lcp
    .venv/bin/python tests/reference/make_vocab_fixture.py \\
        /tmp/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/models
"""

from __future__ import annotations

import argparse
import json
import lzma
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from engine.text.gguf_file import open_gguf, read_metadata  # noqa: E402

SEPARATOR = "\n__ggml_vocab_test__\n"
FIXTURES = {"llama-bpe": "llama3_vocab.json.xz", "qwen2": "qwen2_vocab.json.xz"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", type=Path, help="llama.cpp's models/ folder")
    parser.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures")
    args = parser.parse_args()
    for name, fixture in FIXTURES.items():
        write(args.models / f"ggml-vocab-{name}.gguf", args.out / fixture)


def write(vocab: Path, out: Path) -> None:
    """The fixture `out` from the vocabulary GGUF `vocab` and its test files beside it."""
    meta = read_metadata(open_gguf(vocab))
    texts = Path(f"{vocab}.inp").read_text(encoding="utf-8").split(SEPARATOR)
    ids = Path(f"{vocab}.out").read_text(encoding="utf-8").split("\n")
    assert len(ids) >= len(texts), f"{len(texts)} texts but {len(ids)} lines of ids"
    fixture = {
        "source": f"llama.cpp models/{vocab.name} (llama-cpp-python 0.3.36)",
        "metadata": {k: v for k, v in meta.items() if k.startswith("tokenizer.")},
        "cases": [
            [t, [int(i) for i in line.split()]]
            for t, line in zip(texts, ids[: len(texts)], strict=True)
        ],
    }
    out.write_bytes(lzma.compress(json.dumps(fixture, ensure_ascii=False).encode(), preset=9))
    print(f"{out}: {len(fixture['cases'])} cases, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main()
