"""A gpt-oss model built by hand, not trained, so that the whole system can be shown reading
harmony: greedy decoding writes one of two fixed replies, its reasoning and then a final
answer, or (when the prompt offers tools) its reasoning and then a call of `get_weather`.

How: the tiny gpt-oss shape (tests/tiny_gpt_oss.py) with two layers, everything zero but
this. Each token of the replies has an embedding dimension of its own, and the output
matrix maps it to the token that follows it (a bigram table), so the reply is a chain. Two
tokens are followed by different tokens in different places (`<|channel|>`: analysis,
final or commentary; `<|message|>`: the thought, the answer or the arguments). For those
the second layer's attention (full, not windowed) adds two features to every position:
whether the thought's first token came before (one head attends to it wherever it is,
its score 30 against 0 for every other key) and whether the prompt offers tools (another
head, on `namespace`, which gpt-oss's template writes only for tools). Rope cannot move
those scores: queries and keys use the head's slowest frequency only, a turn of 1e-6 a
position. The branching rows of the output matrix read the features (`_branch_row`).

The vocabulary is Qwen 2's with harmony's control tokens added, marked with GPT-4o's
pre-split; the chat template is gpt-oss's own (tests/fixtures/templates)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from engine.text.tokenizer import Tokenizer
from tests.tiny_gguf import write_and_close
from tests.tiny_gpt_oss import ARCH, DIM, EXPERTS, HEAD_DIM, HEADS, KV_HEADS, MXFP4, add_keys, vocab

TEMPLATE = Path(__file__).parent / "fixtures" / "templates" / "openai-gpt-oss-120b.jinja"
MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>")
ENDS = ("<|return|>", "<|call|>")
THOUGHT = "Pondering carefully."  # its first token marks that the reasoning was written
ANSWER = "Sunny and warm"
ARGUMENTS = {"city": "Paris"}
REASONED = "<|channel|>analysis<|message|>" + THOUGHT + "<|end|><|start|>assistant<|channel|>"
REPLY = REASONED + "final<|message|>" + ANSWER + "<|return|>"
CALL = (
    REASONED
    + 'commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>'
)
TOOLS_MARK = "namespace"  # in the prompt only where tools are offered
LAYERS = 2
F_THOUGHT, F_TOOLS = DIM - 2, DIM - 1  # the features' dimensions
A, DELTA, BETA = 10.0, 1.5, 2.0  # a bigram's weight; a branch's cost per condition, its pull


def harmony_meta() -> dict[str, Any]:
    """Qwen 2's vocabulary with harmony's control tokens added (as o200k_harmony has them),
    marked with GPT-4o's pre-split."""
    meta = dict(vocab())
    added = [*MARKERS, *ENDS]
    meta["tokenizer.ggml.tokens"] = [*meta["tokenizer.ggml.tokens"], *added]
    meta["tokenizer.ggml.token_type"] = [*meta["tokenizer.ggml.token_type"], *[3] * len(added)]
    meta["tokenizer.ggml.pre"] = "gpt-4o"
    return meta


def transitions(tokenizer: Tokenizer) -> dict[int, dict[int, tuple[bool, bool]]]:
    """Each reply token's successors, with what each needs: (the thought written, tools
    offered); the replies follow the prompt's last token, "assistant"."""
    out: dict[int, dict[int, tuple[bool, bool]]] = {}
    trigger = tokenizer.encode(THOUGHT)[0]
    for reply, tools in ((REPLY, False), (CALL, True)):
        ids = tokenizer.encode("assistant" + reply)
        seen = False
        for t, nxt in itertools.pairwise(ids):
            seen = seen or t == trigger
            out.setdefault(t, {})[nxt] = (seen, tools)
    for t, nexts in out.items():  # each branch as the output rows can tell apart
        if len(nexts) > 1:
            assert len(nexts) == 3 and set(nexts.values()) == {
                (False, False) if (False, False) in nexts.values() else (False, True),
                (True, False),
                (True, True),
            }, (t, nexts)
    return out


def _branch_row(seen: bool, tools: bool, first: bool) -> tuple[float, float, float]:
    """The output row of a branch's successor: its weight on the branching token, on the
    thought feature and on the tools feature. The first (needs no thought) cares not for
    tools; each condition costs DELTA and pulls BETA its way."""
    if first:
        return A, -BETA, 0.0
    needs = 1 + int(tools)
    return A - DELTA * needs, BETA, BETA if tools else -BETA


def write_harmony_model(path: Path) -> Path:
    """Write the model to `path` (~155 MB: its embedding and output are float32)."""
    meta = harmony_meta()
    tokenizer = Tokenizer.from_metadata(meta)
    steps = transitions(tokenizer)
    trigger, tools_mark = tokenizer.encode(THOUGHT)[0], tokenizer.encode(TOOLS_MARK)[0]
    slots = {t: i for i, t in enumerate(sorted({*steps, *(n for s in steps.values() for n in s)}))}
    slots.setdefault(tools_mark, len(slots))
    assert len(slots) < F_THOUGHT
    n_vocab = len(meta["tokenizer.ggml.tokens"])
    embed = np.zeros((n_vocab, DIM), np.float32)
    for t, slot in slots.items():
        embed[t, slot] = 1.0
    output = np.zeros((n_vocab, DIM), np.float32)
    for t, nexts in steps.items():
        for nxt, (seen, tools) in nexts.items():
            if len(nexts) == 1:
                output[nxt, slots[t]] = A
            else:
                weights = _branch_row(seen, tools, first=not seen)
                output[nxt, [slots[t], F_THOUGHT, F_TOOLS]] = weights
    w = gguf.GGUFWriter(path, ARCH)
    add_keys(w, meta, TEMPLATE.read_text(), layers=LAYERS)
    w.add_tensor("token_embd.weight", embed)
    for i in range(LAYERS):
        for name, array in _layer(i, slots[trigger], slots[tools_mark]).items():
            if name.endswith("_exps.weight"):
                w.add_tensor(name, gguf.quants.quantize(array, MXFP4), raw_dtype=MXFP4)
            else:
                w.add_tensor(name, array)
    w.add_tensor("output_norm.weight", np.ones(DIM, np.float32))
    w.add_tensor("output.weight", output)
    write_and_close(w)
    return path


def _layer(i: int, trigger_slot: int, tools_slot: int) -> dict[str, np.ndarray]:
    """Layer i: zero, but in the last layer the two heads that see the trigger tokens."""
    p, q_dim, kv_dim = f"blk.{i}.", HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    count, _, ffn = EXPERTS
    wq, wk, wv = (np.zeros((rows, DIM), np.float32) for rows in (q_dim, kv_dim, kv_dim))
    bq = np.zeros(q_dim, np.float32)
    wo = np.zeros((DIM, q_dim), np.float32)
    slow = HEAD_DIM // 2 - 1  # the slowest rope frequency's first dimension
    if i == LAYERS - 1:
        group = HEADS // KV_HEADS
        for kv, (slot, feature) in enumerate(((trigger_slot, F_THOUGHT), (tools_slot, F_TOOLS))):
            head = kv * group  # the KV head's first query head; the others stay zero
            bq[head * HEAD_DIM + slow] = 1.0  # the same query at every position
            wk[kv * HEAD_DIM + slow, slot] = 12.0  # score ~30 on a trigger, 0 elsewhere
            wv[kv * HEAD_DIM, slot] = 1.0
            wo[feature, head * HEAD_DIM] = 1.0 / np.sqrt(DIM)  # normed: the one-hot's size
    zeros = {
        "attn_q.bias": bq,
        "attn_k.bias": np.zeros(kv_dim, np.float32),
        "attn_v.bias": np.zeros(kv_dim, np.float32),
        "attn_output.bias": np.zeros(DIM, np.float32),
        "attn_sinks.weight": np.zeros(HEADS, np.float32),
        "ffn_gate_inp.weight": np.zeros((count, DIM), np.float32),
        "ffn_gate_inp.bias": np.zeros(count, np.float32),
        "ffn_gate_exps.weight": np.zeros((count, ffn, DIM), np.float32),
        "ffn_up_exps.weight": np.zeros((count, ffn, DIM), np.float32),
        "ffn_down_exps.weight": np.zeros((count, DIM, ffn), np.float32),
        "ffn_gate_exps.bias": np.zeros((count, ffn), np.float32),
        "ffn_up_exps.bias": np.zeros((count, ffn), np.float32),
        "ffn_down_exps.bias": np.zeros((count, DIM), np.float32),
    }
    layer = {
        "attn_norm.weight": np.ones(DIM, np.float32),
        "attn_q.weight": wq,
        "attn_k.weight": wk,
        "attn_v.weight": wv,
        "attn_output.weight": wo,
        "post_attention_norm.weight": np.ones(DIM, np.float32),
    }
    return {p + k: v for k, v in (layer | zeros).items()}
