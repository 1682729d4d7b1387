"""Byte-level BPE tokenizer built from a GGUF file's metadata with the `tokenizers` library.

It reproduces the tokenizer that transformers builds from the same file
(`AutoTokenizer.from_pretrained(dir, gguf_file=name)`), which is the reference for token ids.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, pre_tokenizers

from common.errors import UnsupportedModelError

_CONTROL = 3  # llama.cpp token types
_USER_DEFINED = 4

# Pre-tokenizers that transformers builds as plain GPT-2 byte-level splitting. llama.cpp's
# "smollm" also splits every digit on its own first; transformers does not, so runs of spaces
# before a digit differ ("x  1": transformers Ġ,Ġ1 pieces, llama.cpp ĠĠ,1). This vocab has no
# merges with digits, so digits themselves come out one per token either way.
_GPT2_STYLE_PRE = frozenset({"default", "gpt2", "smollm"})
# Llama 3's split (its tokenizer.json's, which llama.cpp's names below also use): letters with
# one leading non-letter, digits in threes, punctuation runs with their line ends; and its
# vocabulary's whole words are taken before any merge (ignore_merges)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_PRE = frozenset({"llama-bpe", "llama3", "llama-v3"})
# Qwen 2's: Llama 3's with every digit on its own, merges applied to whole words too
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
# GPT-4o's (o200k; gpt-oss's vocabulary is pre-split by it, as are Llama 4's): a word is
# upper-case letters then lower-case ones (or an all-upper run), with one leading
# non-letter and its contraction; digits in threes; punctuation runs with line ends and /
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_PRE = frozenset({"gpt-4o", "llama4"})
_SPLITS = {
    **dict.fromkeys(_LLAMA3_PRE, _LLAMA3_SPLIT),
    "qwen2": _QWEN2_SPLIT,
    **dict.fromkeys(_GPT4O_PRE, _GPT4O_SPLIT),
}
_SUPPORTED_PRE = _GPT2_STYLE_PRE | set(_SPLITS)
_TURN_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|eom_id|>")
_TURN_END_KEYS = ("eos_token_id", "eot_token_id", "eom_token_id")
# harmony (gpt-oss): a reply is messages, each header and end marked by control tokens that
# the reply's text keeps (the gateway reads them: gateway/harmony.py); it ends at <|return|>
# or at a tool call's <|call|>, while <|end|> only closes a message (as llama.cpp's
# o200k_harmony workaround has it)
_HARMONY_MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|constrain|>")
_HARMONY_ENDS = ("<|return|>", "<|call|>")


def _byte_to_char() -> dict[int, str]:
    """GPT-2's map from each byte to the printable character that spells it in the vocab."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    mapping = {b: chr(b) for b in printable}
    others = [b for b in range(256) if b not in mapping]
    mapping.update({b: chr(256 + n) for n, b in enumerate(others)})
    return mapping


_BYTE_TO_CHAR = _byte_to_char()
_CHAR_TO_BYTE = {c: b for b, c in _BYTE_TO_CHAR.items()}


def _spell(token: str) -> str:
    """The token in the byte alphabet; tokens stored as raw text are respelled from their UTF-8."""
    if all(c in _CHAR_TO_BYTE for c in token):
        return token
    return "".join(_BYTE_TO_CHAR[b] for b in token.encode("utf-8"))


def _pre_tokenizer(pattern: str | None) -> pre_tokenizers.PreTokenizer:
    """GPT-2's byte-level split, or a family's own split (`pattern`) ahead of the byte-level
    alphabet."""
    if pattern is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    split = pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated")
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    return pre_tokenizers.Sequence([split, byte_level])


def _turn_ends(meta: dict[str, Any], tokens: list[str], ids: dict[str, int]) -> frozenset[int]:
    """The tokens that end a turn: the known end-of-turn spellings and the file's EOS, EOT and
    EOM ids (Llama 3: end_of_text and eot_id)."""
    ends = {i for i, t in enumerate(tokens) if t in _TURN_END_TOKENS}
    ends.update(
        meta[f"tokenizer.ggml.{k}"] for k in _TURN_END_KEYS if f"tokenizer.ggml.{k}" in meta
    )
    if _harmony(ids):
        ends |= {ids[t] for t in _HARMONY_ENDS}
        ends.discard(ids["<|end|>"])
    return frozenset(ends)


def _harmony(ids: dict[str, int]) -> bool:
    """Whether a vocabulary (its ids by token) is harmony's: its markers and both ends."""
    return all(t in ids for t in (*_HARMONY_MARKERS, *_HARMONY_ENDS))


class Tokenizer:
    """Text to token ids and back, for one model's vocabulary."""

    def __init__(self, meta: dict[str, Any]) -> None:
        """Build from GGUF metadata; prefer `from_metadata`."""
        model = meta.get("tokenizer.ggml.model")
        pre = meta.get("tokenizer.ggml.pre", "default")
        if model != "gpt2":
            raise UnsupportedModelError(
                f"tokenizer.ggml.model={model!r} is not supported (only 'gpt2' byte-level BPE)"
            )
        if pre not in _SUPPORTED_PRE:
            raise UnsupportedModelError(
                f"tokenizer.ggml.pre={pre!r} is not supported "
                f"(supported: {', '.join(sorted(_SUPPORTED_PRE))})"
            )
        tokens: list[str] = meta.get("tokenizer.ggml.tokens") or []
        merges: list[str] = meta.get("tokenizer.ggml.merges") or []
        if not tokens or not merges:
            raise UnsupportedModelError("GGUF lacks tokenizer.ggml.tokens or tokenizer.ggml.merges")
        types: Sequence[int] = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)

        spelled = [_spell(t) for t in tokens]
        pairs = [(a, b) for a, _, b in (m.partition(" ") for m in merges)]
        vocab = {t: i for i, t in enumerate(spelled)}
        whole_words = pre in _LLAMA3_PRE
        backend = tokenizers.Tokenizer(models.BPE(vocab, pairs, ignore_merges=whole_words))
        backend.pre_tokenizer = _pre_tokenizer(_SPLITS.get(pre))
        backend.decoder = decoders.ByteLevel()
        # As transformers does: control tokens outside the byte alphabet are llama.cpp mislabels
        # and stay plain vocab entries; user-defined ones are matched whole but are not special.
        special = [i for i, t in enumerate(tokens) if types[i] == _CONTROL and t == spelled[i]]
        user = [i for i, t in enumerate(tokens) if types[i] == _USER_DEFINED and t == spelled[i]]
        backend.add_special_tokens([AddedToken(tokens[i], normalized=False) for i in special])
        backend.add_tokens([AddedToken(tokens[i], normalized=False) for i in user])

        self._backend = backend
        # harmony's markers are control tokens the reply's text keeps
        kept = set(_HARMONY_MARKERS) if _harmony(vocab) else set()
        self._special_ids = frozenset(i for i in special if tokens[i] not in kept)
        # The ByteLevel decoder's rule, so these agree with decode(); ASCII special tokens give
        # their own text. One buffer and the offsets into it: 0.3 MB, where a bytes object
        # per token took 3.6 MB in every process that holds a tokenizer.
        each = [bytes(_CHAR_TO_BYTE[c] for c in s) for s in spelled]
        self._bytes = b"".join(each)
        self._offsets = array("q", itertools.accumulate((len(b) for b in each), initial=0))
        self.vocab_size: int = len(tokens)
        self.bos_id: int | None = meta.get("tokenizer.ggml.bos_token_id")
        self.eos_id: int | None = meta.get("tokenizer.ggml.eos_token_id")
        self.add_bos: bool = bool(meta.get("tokenizer.ggml.add_bos_token", False))
        self.chat_template: str | None = meta.get("tokenizer.chat_template")
        self.eot_ids: frozenset[int] = _turn_ends(meta, tokens, vocab)

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        """The tokenizer a GGUF header describes; raises UnsupportedModelError if it cannot."""
        return cls(meta)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens written in the text become their ids.

        BOS is prepended only when the file sets tokenizer.ggml.add_bos_token.
        """
        ids: list[int] = self._backend.encode(text, add_special_tokens=False).ids
        if self.add_bos and self.bos_id is not None:
            return [self.bos_id, *ids]
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; bytes that are not valid UTF-8 become U+FFFD. skip_special leaves
        out the control tokens (but harmony's markers, which a reply's text keeps)."""
        kept = [i for i in ids if not (skip_special and self.is_special(i))]
        return self._backend.decode(kept, skip_special_tokens=False)

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (a special token gives its text in UTF-8)."""
        if not 0 <= token_id < self.vocab_size:
            raise IndexError(f"token id {token_id} is not in the vocabulary")
        return self._bytes[self._offsets[token_id] : self._offsets[token_id + 1]]

    def is_special(self, token_id: int) -> bool:
        """Whether `token_id` is a control token such as <|im_start|>."""
        return token_id in self._special_ids
