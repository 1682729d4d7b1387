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

# ruff: noqa: RUF001  (the tokenizer corpus is full of look-alike characters on purpose)
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from tokenizers import Tokenizer
from tokenizers import pre_tokenizers as pre_tok
from transformers import AutoModelForCausalLM, AutoTokenizer

DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
EOS_ID = 2
COL_STRIDE = 16  # every 16th vocab id goes into the stored logit columns
TOP_COLS = 32  # plus the top-32 ids of every position
MAX_NEW_TOKENS = 32
MIN_MARGIN = 0.05  # greedy chats whose smallest top-1/top-2 gap is below this are dropped
MIN_CHATS = 6

DIGITS_FIRST_NOTE = (
    "transformers builds the GGUF tokenizer with a bare ByteLevel(use_regex=True) pre-tokenizer "
    "(the GPT-2 regex). llama.cpp's 'smollm' pre-tokenizer (and SmolLM2's own tokenizer.json) "
    "first splits every number character on its own (\\p{N}; tokenizers' "
    "Digits(individual_digits=True)) and then applies the GPT-2 regex. The vocabulary has no "
    "token joining a number character to anything else, so the two agree except where the GPT-2 "
    "regex glues a space to a number character: a whitespace run before digits ('   42': "
    "ByteLevel-only gives 'ĠĠ','Ġ','4','2', digits-first gives 'ĠĠĠ','4','2') and a space "
    "before a non-ASCII number (' ²' -> 'ĠÂ','²' vs 'Ġ','Â²'). "
    "'ids' is what transformers gives; 'ids_digits_first' is the same tokenizer with "
    "Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)] as its pre-tokenizer."
)


def default_model() -> Path:
    env = os.environ.get("WARMFLEET_MODEL_DIR")
    base = Path(env).expanduser() if env else Path.home() / ".cache" / "warmfleet" / "models"
    return base / DEFAULT_MODEL_FILE


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# ---------------------------------------------------------------------------------------------
# Tokenizer corpus

PY_CODE = '''def fib(n: int) -> int:
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    a, b = 0, 1
    for _ in range(n - 1):
        a, b = b, a + b
    return b


class Stack:
\tdef __init__(self):
\t\tself.items = []  # tabs, not spaces
'''

JS_CODE = """const fetchAll = async (urls) => {
  const res = await Promise.all(urls.map((u) => fetch(u)));
  return res.filter((r) => r.ok && r.status !== 204);
};
export default { fetchAll };  // ES module
"""

C_CODE = """#include <stdio.h>

int main(int argc, char **argv) {
    for (int i = 0; i < argc; ++i) {
        printf("%d: %s\\n", i, argv[i]);
    }
    return 0;
}
"""

LONG_PARAGRAPH = (
    "The history of computing is a story of layers. Early machines were programmed by rewiring "
    "panels; then came stored programs, assemblers, and compilers. Each layer hid the details "
    "below it, so that people could think about larger problems. In the 1970s, operating systems "
    "such as Unix made it possible to share a computer between many users, and the C language "
    "made programs portable across hardware. By the 1990s, the web connected millions of "
    "machines, and by 2020 the cloud rented out computation by the second. Today, large language "
    "models are yet another layer: they turn natural language into actions, code, and answers. "
    "Whether this layer will be as durable as the others remains to be seen, but it's clear that "
    "we'll keep building on top of what came before - as we always have."
)


def tokenizer_corpus(control_tokens: list[str]) -> list[str]:
    chatml = (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n2+2 equals 4.<|im_end|>\n"
        "<|im_start|>user\nAnd 3*3?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    texts = [
        # empty and tiny
        "",
        " ",
        "a",
        "Hello",
        "Hello, world!",
        "hello world",
        " Hello world",
        # code
        PY_CODE,
        JS_CODE,
        C_CODE,
        "    return x  # four-space indent",
        "if (x) {\n\tdo_it();\n}\n",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;",
        '{"key": [1, 2.5, null, true], "nested": {"a": "b"}}',
        # unicode
        "café naïve résumé façade Ångström",
        "Straße größer Übung ÄÖÜ",
        "日本語のテキストです。東京は大きい。",
        "中文分词测试：你好，世界！",
        "한국어 문장입니다.",
        "مرحبا بالعالم، كيف حالك؟",
        "नमस्ते दुनिया, आप कैसे हैं?",
        "Привет, мир! Ёжик в тумане.",
        "e\u0301 a\u0300 n\u0303 o\u0308 (combining marks) vs é à ñ ö",
        "Ελληνικά: αβγδε ΑΒΓΔΕ",
        "math: ∑ ∫ √ ∞ ≤ ≥ ≠ ± × ÷ → ⇒ ∀x ∈ ℝ",
        # emoji
        "I love pizza 🍕🍕 and cats 🐱!",
        "family: 👨\u200d👩\u200d👧\u200d👦 and 👩🏽\u200d💻 technologist",
        "flags: 🇫🇷 🇯🇵 🇺🇸 🏳️\u200d🌈",
        "thumbs 👍🏻👍🏿 ❤️ ✨",
        # whitespace runs
        "a  b   c    d",
        "tab\tseparated\t\tvalues",
        "line1\nline2\n\nline4\n\n\n\nline8",
        "   leading spaces",
        "trailing spaces   ",
        "\n\nleading newlines",
        "trailing newline\n",
        " \t \n mixed \r\n whitespace \t\t\n",
        "        ",
        "\n",
        "\t\t\t",
        # digits
        "1234567890",
        "The year 2024 had 366 days.",
        "pi = 3.14159265358979, e = 2.71828",
        "Date: 2024-01-15T10:30:00Z",
        "123abc abc123 a1b2c3",
        "$1,234,567.89 and -42 and +7 and 1e-10",
        "Call 555-0123 or +1 (800) 555-0199.",
        # where the pre-tokenizers differ (see DIGITS_FIRST_NOTE): a whitespace run before digits,
        # a space before a non-ASCII number character
        "   42",
        "x =    1000",
        "col1\t  2\n    3",
        " ² x²³ E=mc² ½ ¼ ⅓ ①",
        " ٣٤٥ ४५६ ３４５",
        # contractions
        "it's don't they're we've I'm you'll he'd",
        "IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D",
        "It's John's book; it'd be nice if you'd've known.",
        "rock 'n' roll, 'quoted' and ’curly’ apostrophes",
        # punctuation
        "Wait... what?!?! No way!!!",
        "----====****####",
        "((a + b) * [c - d]) / {e % f}",
        "a->b; c=>d; x::y; p != q; r <= s; t >>= 2;",
        "\"double\" 'single' `backtick` «guillemets» „low“",
        # URLs and paths
        "https://example.com/path/to/page?query=1&lang=en#section",
        "email: someone.name+tag@example.org",
        "C:\\Users\\name\\Documents\\file.txt and /usr/local/bin/python3",
        # special tokens as literal text
        "<|im_start|>",
        "<|im_end|>",
        "<|endoftext|>",
        "text<|endoftext|>more text",
        "<|im_start|>user\nhi<|im_end|>",
        " <|im_start|> spaced <|im_end|> ",
        "<|im_start|><|im_end|><|endoftext|>",
        "<|im_start",
        "im_end|>",
        " ".join(control_tokens),
        "".join(control_tokens),
        chatml,
        # long paragraph
        LONG_PARAGRAPH,
        # mixes
        "Mixed: café 123 🍕 <|im_end|> 日本 don't\n\tend",
        "CamelCaseIdentifier snake_case_name kebab-case-name SCREAMING_CASE",
        "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    ]
    for t in control_tokens:
        texts.append(f"before {t} after")
    return texts


# ---------------------------------------------------------------------------------------------
# Logits prompts and chats

CODE_PROMPT = (
    "def is_prime(n):\n"
    "    if n < 2:\n"
    "        return False\n"
    "    for i in range(2, int(n ** 0.5) + 1):\n"
    "        if n % i == 0:\n"
    "            return"
)

LOGIT_CHAT = [
    {
        "role": "system",
        "content": (
            "You are a concise assistant that answers questions about computer "
            "science in one or two clear sentences."
        ),
    },
    {
        "role": "user",
        "content": (
            "Explain what a hash table is, and why looking up a key in it is usually "
            "fast even when it holds millions of entries."
        ),
    },
]

CHATS: list[tuple[str, list[dict[str, str]]]] = [
    (
        "capital_no_system",
        [
            {"role": "user", "content": "What is the capital of France?"},
        ],
    ),
    (
        "capital_with_system",
        [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "What is the capital of Japan?"},
        ],
    ),
    (
        "python_square",
        [
            {
                "role": "user",
                "content": "Write a Python function that returns the square of a number.",
            },
        ],
    ),
    (
        "python_is_even",
        [
            {"role": "user", "content": "Write a Python function to check if a number is even."},
        ],
    ),
    (
        "c_hello_system",
        [
            {"role": "system", "content": "You are a coding assistant."},
            {"role": "user", "content": "Write a hello world program in C."},
        ],
    ),
    (
        "fix_code",
        [
            {
                "role": "user",
                "content": (
                    "Fix this Python code:\n\n```python\ndef add(a, b)\n    return a + b\n```"
                ),
            },
        ],
    ),
    (
        "multi_turn",
        [
            {"role": "user", "content": "Hi! What's your name?"},
            {
                "role": "assistant",
                "content": "Hello! I'm SmolLM, an AI assistant. How can I help you today?",
            },
            {"role": "user", "content": "Can you tell me a fun fact about octopuses?"},
        ],
    ),
    (
        "multi_turn_system",
        [
            {"role": "system", "content": "You are a math tutor."},
            {"role": "user", "content": "What is 12 times 12?"},
            {"role": "assistant", "content": "12 times 12 is 144."},
            {"role": "user", "content": "And what is 144 divided by 3?"},
        ],
    ),
    (
        "color_sky",
        [
            {"role": "user", "content": "Why is the sky blue?"},
        ],
    ),
    (
        "long_question",
        [
            {
                "role": "system",
                "content": "You are a helpful assistant who gives practical advice.",
            },
            {
                "role": "user",
                "content": (
                    "I am planning a trip to Italy next spring with my family. We have two "
                    "children, aged seven and ten, and we would like to visit Rome, Florence and "
                    "Venice in about ten days. We enjoy history, food and walking, but the kids "
                    "get tired easily. Could you suggest how we should split our time between the "
                    "three cities, and what we should not miss?"
                ),
            },
        ],
    ),
    (
        "photosynthesis",
        [
            {"role": "user", "content": "Explain photosynthesis to a ten-year-old."},
        ],
    ),
    (
        "git_status",
        [
            {"role": "user", "content": "What does the `git status` command do?"},
        ],
    ),
]


def chat_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys") and "input_ids" in out:  # transformers >= 5 returns a BatchEncoding
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    return [int(i) for i in out]


def describe_tokenizer(tok: Any) -> dict[str, Any]:
    spec = json.loads(tok.backend_tokenizer.to_str())
    info = {
        "class": type(tok).__name__,
        "normalizer": spec.get("normalizer"),
        "pre_tokenizer": spec.get("pre_tokenizer"),
        "decoder": spec.get("decoder"),
        "post_processor": spec.get("post_processor"),
        "model": {k: v for k, v in spec["model"].items() if k not in ("vocab", "merges")},
        "n_merges": len(spec["model"].get("merges", [])),
        "added_tokens": spec.get("added_tokens"),
        "special_tokens": tok.all_special_tokens,
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "pad_token": tok.pad_token,
        "unk_token": tok.unk_token,
    }
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=None, help="GGUF file (default: cached SmolLM2)")
    ap.add_argument(
        "--out", type=Path, default=FIXTURES, help=f"output folder (default {FIXTURES})"
    )
    args = ap.parse_args(argv)

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
    sha = sha256_of(model_path)
    meta = {
        "model_file": model_path.name,
        "model_sha256": sha,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
    }
    print(f"model {model_path} sha256 {sha}")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")

    d, name = str(model_path.parent), model_path.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=name)
    try:
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, dtype=torch.float32)
    except TypeError:  # older transformers
        model = AutoModelForCausalLM.from_pretrained(d, gguf_file=name, torch_dtype=torch.float32)
    model.eval()
    print(f"loaded in {time.time() - t0:.1f} s")

    # ---- how transformers built the tokenizer
    info = describe_tokenizer(tok)
    print("\n== tokenizer pipeline built by transformers ==")
    for k in (
        "class",
        "normalizer",
        "pre_tokenizer",
        "decoder",
        "post_processor",
        "model",
        "n_merges",
        "special_tokens",
        "bos_token",
        "eos_token",
        "pad_token",
        "unk_token",
    ):
        print(f"{k}: {json.dumps(info[k])}")
    added = info["added_tokens"] or []
    print(
        "added tokens:",
        [(a["id"], a["content"], "special" if a["special"] else "normal") for a in added],
    )
    vocab = tok.get_vocab()
    multi_digit = sorted(
        t
        for t in vocab
        if len(t) > 1 and any(c in "0123456789" for c in t) and all(c in "0123456789Ġ" for c in t)
    )
    print("vocab tokens made only of ASCII digits (and Ġ), longer than one char:", multi_digit)
    digits = tok.convert_ids_to_tokens(tok.encode("12345 67890 x2024"))
    print("digits split one by one:", digits)
    print(
        "decode keeps special tokens by default:",
        repr(tok.decode(tok.encode("<|im_start|>hi<|im_end|>"))),
        "| skip_special_tokens=True:",
        repr(tok.decode(tok.encode("<|im_start|>hi<|im_end|>"), skip_special_tokens=True)),
    )

    # ---- a) tokenizer cases
    id_to_tok = {i: t for t, i in vocab.items()}
    control = [id_to_tok[i] for i in range(3, 17)]
    digits_first = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    digits_first.pre_tokenizer = pre_tok.Sequence(
        [
            pre_tok.Digits(individual_digits=True),
            pre_tok.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    plain = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    cases = []
    for text in tokenizer_corpus(control):
        ids = [int(i) for i in tok.encode(text, add_special_tokens=True)]
        assert plain.encode(text, add_special_tokens=True).ids == ids, text
        alt = [int(i) for i in digits_first.encode(text, add_special_tokens=True).ids]
        cases.append(
            {"text": text, "ids": ids, "decoded": tok.decode(ids), "ids_digits_first": alt}
        )
    n_roundtrip = sum(c["decoded"] == c["text"] for c in cases)
    n_differ = [c["text"] for c in cases if c["ids"] != c["ids_digits_first"]]
    tok_doc = {
        **meta,
        "tokenizer": {
            k: info[k]
            for k in (
                "class",
                "normalizer",
                "pre_tokenizer",
                "decoder",
                "post_processor",
                "model",
                "n_merges",
            )
        },
        "encode_call": "tok.encode(text, add_special_tokens=True)",
        "decode_call": "tok.decode(ids)  (skip_special_tokens=False)",
        "digits_first_note": DIGITS_FIRST_NOTE,
        "cases": cases,
    }
    (out_dir / "tokenizer_cases.json").write_text(
        json.dumps(tok_doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
    )
    print(f"\n{len(cases)} tokenizer cases, {n_roundtrip} decode back to the same text")
    print(f"{len(n_differ)} cases where the digits-first pre-tokenizer differs: {n_differ!r}")

    # ---- b) reference logits
    logit_prompts = [
        ("capital", [int(i) for i in tok.encode("The capital of France is")]),
        ("code", [int(i) for i in tok.encode(CODE_PROMPT)]),
        ("chat", chat_ids(tok, LOGIT_CHAT)),
    ]
    full = []
    with torch.no_grad():
        for pname, ids in logit_prompts:
            logits = model(torch.tensor([ids])).logits[0].float().numpy()
            full.append(logits)
            print(f"prompt {pname}: {len(ids)} tokens")
    vocab_size = full[0].shape[1]
    colset = set(range(0, vocab_size, COL_STRIDE))
    for lg in full:
        top = np.argsort(-lg, axis=1, kind="stable")[:, :TOP_COLS]
        colset.update(int(c) for c in top.ravel())
    cols = np.array(sorted(colset), dtype=np.int32)
    arrays: dict[str, np.ndarray] = {
        "prompt_names": np.array([p for p, _ in logit_prompts]),
        "cols": cols,
        "model_sha256": np.array(sha),
        "transformers_version": np.array(transformers.__version__),
    }
    for i, ((_, ids), lg) in enumerate(zip(logit_prompts, full, strict=True)):
        top5 = np.argsort(-lg, axis=1, kind="stable")[:, :5]
        arrays[f"ids_{i}"] = np.array(ids, dtype=np.int32)
        arrays[f"logits_{i}"] = np.ascontiguousarray(lg[:, cols], dtype=np.float32)
        arrays[f"top5_ids_{i}"] = top5.astype(np.int32)
        arrays[f"top5_vals_{i}"] = np.take_along_axis(lg, top5, axis=1).astype(np.float32)
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

    # ---- c) greedy chats
    gen_cfg = model.generation_config
    chats_out: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    for cname, messages in CHATS:
        prompt = chat_ids(tok, messages)
        rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert [int(i) for i in tok.encode(rendered)] == prompt, cname
        with torch.no_grad():
            res = model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                do_sample=False,
                max_new_tokens=MAX_NEW_TOKENS,
                eos_token_id=EOS_ID,
                pad_token_id=EOS_ID,
                return_dict_in_generate=True,
                output_logits=True,
                repetition_penalty=1.0,
                num_beams=1,
            )
        completion = [int(i) for i in res.sequences[0, len(prompt) :]]
        if EOS_ID in completion:
            completion = completion[: completion.index(EOS_ID) + 1]
        margins = []
        for step, tok_id in enumerate(completion):
            lg = res.logits[step][0].float()
            v, ix = lg.topk(2)
            assert int(ix[0]) == tok_id, (cname, step)
            margins.append(round(float(v[0] - v[1]), 6))
        # Cross-check: one full forward pass over prompt + completion gives the same argmaxes.
        with torch.no_grad():
            seq = torch.tensor([prompt + completion])
            lg_all = model(seq).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(completion)]
        assert lg_all.argmax(-1).tolist() == completion, cname
        entry = {
            "name": cname,
            "messages": messages,
            "rendered": rendered,
            "prompt_ids": prompt,
            "completion_ids": completion,
            "completion_text": tok.decode(completion),
            "margins": margins,
            "min_margin": min(margins),
        }
        status = "kept" if entry["min_margin"] >= MIN_MARGIN else "dropped"
        print(
            f"chat {cname:22s} prompt {len(prompt):3d} gen {len(completion):2d} "
            f"min_margin {entry['min_margin']:.4f} {status}: {entry['completion_text']!r}"
        )
        (chats_out if status == "kept" else dropped).append(entry)
    if len(chats_out) < MIN_CHATS:  # not enough comfortable ones: fill with the best of the rest
        dropped.sort(key=lambda e: -e["min_margin"])
        while len(chats_out) < MIN_CHATS and dropped:
            e = dropped.pop(0)
            print(f"  keeping {e['name']} anyway (min_margin {e['min_margin']:.4f})")
            chats_out.append(e)
    chat_doc = {
        **meta,
        "generate": {
            "do_sample": False,
            "max_new_tokens": MAX_NEW_TOKENS,
            "eos_token_id": EOS_ID,
            "note": "completion stops after EOS (2) if it comes earlier; it is kept",
        },
        "min_margin_threshold": MIN_MARGIN,
        "generation_config": {
            k: getattr(gen_cfg, k, None)
            for k in ("do_sample", "temperature", "top_k", "top_p", "repetition_penalty")
        },
        "chats": chats_out,
    }
    (out_dir / "greedy_chats.json").write_text(
        json.dumps(chat_doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8"
    )
    print(f"{len(chats_out)} greedy chats kept, {len(dropped)} dropped")

    for f in ("tokenizer_cases.json", "reference_logits.npz", "greedy_chats.json"):
        p = out_dir / f
        print(f"wrote {p} ({p.stat().st_size / 1024:.1f} KiB)")
    print(f"done in {time.time() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
