"""How transformers tokenizes: its tokenizer pipeline (printed) and the tokenizer_cases.json
fixture, the ids and decoded text of every corpus text, also under a digits-first
pre-tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fixture_corpus import tokenizer_corpus
from tokenizers import Tokenizer
from tokenizers import pre_tokenizers as pre_tok

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
# the pipeline keys that tokenizer_cases.json records, and the ones printed besides
PIPELINE_KEYS = (
    "class",
    "normalizer",
    "pre_tokenizer",
    "decoder",
    "post_processor",
    "model",
    "n_merges",
)
PRINTED_KEYS = (
    *PIPELINE_KEYS,
    "special_tokens",
    "bos_token",
    "eos_token",
    "pad_token",
    "unk_token",
)


def chat_ids(tok: Any, messages: list[dict[str, str]]) -> list[int]:
    """The ids of `messages` rendered with the chat template, generation prompt included."""
    out = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if hasattr(out, "keys") and "input_ids" in out:  # transformers >= 5 returns a BatchEncoding
        out = out["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    return [int(i) for i in out]


def describe_tokenizer(tok: Any) -> dict[str, Any]:
    """The tokenizer's pipeline, model settings (without vocab and merges) and special tokens."""
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


def print_tokenizer_pipeline(tok: Any, info: dict[str, Any]) -> None:
    """Print how transformers built the tokenizer (`info` from describe_tokenizer), and how it
    treats digits and special tokens."""
    print("\n== tokenizer pipeline built by transformers ==")
    for k in PRINTED_KEYS:
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


def digits_first_tokenizer(tok: Any) -> Tokenizer:
    """`tok`'s backend with Digits(individual_digits=True) before its ByteLevel pre-tokenizer
    (see DIGITS_FIRST_NOTE)."""
    digits_first = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    digits_first.pre_tokenizer = pre_tok.Sequence(
        [
            pre_tok.Digits(individual_digits=True),
            pre_tok.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return digits_first


def tokenizer_cases(tok: Any) -> list[dict[str, Any]]:
    """One case per corpus text: its ids, their decoding, and the digits-first ids. Asserts that
    the bare backend tokenizer gives the same ids as transformers."""
    id_to_tok = {i: t for t, i in tok.get_vocab().items()}
    control = [id_to_tok[i] for i in range(3, 17)]
    digits_first = digits_first_tokenizer(tok)
    plain = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    cases = []
    for text in tokenizer_corpus(control):
        ids = [int(i) for i in tok.encode(text, add_special_tokens=True)]
        assert plain.encode(text, add_special_tokens=True).ids == ids, text
        alt = [int(i) for i in digits_first.encode(text, add_special_tokens=True).ids]
        cases.append(
            {"text": text, "ids": ids, "decoded": tok.decode(ids), "ids_digits_first": alt}
        )
    return cases


def write_tokenizer_cases(
    tok: Any, info: dict[str, Any], meta: dict[str, str], out_dir: Path
) -> None:
    """Write tokenizer_cases.json (`meta` and the pipeline in `info` on top) to `out_dir`."""
    cases = tokenizer_cases(tok)
    n_roundtrip = sum(c["decoded"] == c["text"] for c in cases)
    n_differ = [c["text"] for c in cases if c["ids"] != c["ids_digits_first"]]
    tok_doc = {
        **meta,
        "tokenizer": {k: info[k] for k in PIPELINE_KEYS},
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
