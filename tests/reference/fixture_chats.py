"""The greedy_chats.json fixture: chats rendered with the model's chat template, with
MAX_NEW_TOKENS greedy tokens each and the top-1/top-2 logit margin of every generated step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from fixture_prompts import CHATS
from fixture_tokenizer import chat_ids

EOS_ID = 2
MAX_NEW_TOKENS = 32
MIN_MARGIN = 0.05  # greedy chats whose smallest top-1/top-2 gap is below this are dropped
MIN_CHATS = 6


def greedy_completion(model: Any, prompt: list[int], name: str) -> tuple[list[int], list[float]]:
    """Up to MAX_NEW_TOKENS greedy tokens after `prompt` (an EOS ends them and is kept), and the
    top-1/top-2 logit margin of each step."""
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
        assert int(ix[0]) == tok_id, (name, step)
        margins.append(round(float(v[0] - v[1]), 6))
    return completion, margins


def assert_one_pass_agrees(model: Any, prompt: list[int], completion: list[int], name: str) -> None:
    """Cross-check: one full forward pass over prompt + completion gives the same argmaxes."""
    with torch.no_grad():
        seq = torch.tensor([prompt + completion])
        lg_all = model(seq).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(completion)]
    assert lg_all.argmax(-1).tolist() == completion, name


def greedy_chat(tok: Any, model: Any, name: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    """The fixture entry of one chat, printed with whether its margin keeps it."""
    prompt = chat_ids(tok, messages)
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert [int(i) for i in tok.encode(rendered)] == prompt, name
    completion, margins = greedy_completion(model, prompt, name)
    assert_one_pass_agrees(model, prompt, completion, name)
    entry = {
        "name": name,
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
        f"chat {name:22s} prompt {len(prompt):3d} gen {len(completion):2d} "
        f"min_margin {entry['min_margin']:.4f} {status}: {entry['completion_text']!r}"
    )
    return entry


def keep_confident(
    entries: list[dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The kept and the dropped entries: kept are those with a margin of at least MIN_MARGIN,
    filled up to MIN_CHATS with the best of the rest."""
    kept = [e for e in entries if e["min_margin"] >= MIN_MARGIN]
    dropped = [e for e in entries if e["min_margin"] < MIN_MARGIN]
    if len(kept) < MIN_CHATS:  # not enough comfortable ones: fill with the best of the rest
        dropped.sort(key=lambda e: -e["min_margin"])
        while len(kept) < MIN_CHATS and dropped:
            e = dropped.pop(0)
            print(f"  keeping {e['name']} anyway (min_margin {e['min_margin']:.4f})")
            kept.append(e)
    return kept, dropped


def write_greedy_chats(tok: Any, model: Any, meta: dict[str, str], out_dir: Path) -> None:
    """Write greedy_chats.json (`meta` and the generation settings on top) to `out_dir`."""
    entries = [greedy_chat(tok, model, name, messages) for name, messages in CHATS]
    chats_out, dropped = keep_confident(entries)
    gen_cfg = model.generation_config
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
