"""A model's shape, read from its GGUF metadata: what the gateway needs to check a prompt
against the model, and what the engine sizes its arrays by. Which architectures the engine
runs is the model families' word (engine/models), not this reader's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import InvalidRequestError, PromptTooLongError, UnsupportedModelError


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A decoder model's shape, read from GGUF metadata under its `{architecture}.` keys."""

    architecture: str
    num_layers: int
    dim: int
    ffn_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float
    rope_base: float
    context_length: int
    vocab_size: int
    num_experts: int = 0  # mixture of experts: experts per layer (0: a dense FFN)
    num_experts_used: int = 0  # experts each token goes through
    expert_ffn_dim: int = 0  # each expert's FFN width
    sliding_window: int = 0  # the window of the layers that attend to one (0: none has)

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "dim",
            "ffn_dim",
            "num_heads",
            "num_kv_heads",
            "context_length",
            "vocab_size",
        ):
            if getattr(self, name) < 1:
                raise UnsupportedModelError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"head_count {self.num_heads} is not a multiple of head_count_kv "
                f"{self.num_kv_heads}"
            )
        if self.num_experts and not 0 < self.num_experts_used <= self.num_experts:
            raise UnsupportedModelError(
                f"expert_used_count {self.num_experts_used} is not in [1, expert_count "
                f"{self.num_experts}]"
            )
        if self.num_experts and self.expert_ffn_dim < 1:
            raise UnsupportedModelError("an expert's feed_forward_length must be >= 1")
        # heads x head_dim need not be dim (Qwen 3 0.6B: 16 heads of 128 on a 1024-wide model)
        if self.head_dim < 2 or self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim {self.head_dim} is not a positive even number")

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    def check_prompt(self, ids: Sequence[int], field: str = "token_ids") -> None:
        """A prompt this model can run: not empty, every id in the vocabulary, room in the
        context for it and one generated token. The gateway checks it to answer precisely;
        the engine checks it again because its arrays depend on it."""
        if not ids:
            raise InvalidRequestError("prompt", "is empty")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequestError(
                field, f"id {bad} is outside the vocabulary [0, {self.vocab_size})"
            )
        if len(ids) + 1 > self.context_length:
            raise PromptTooLongError(len(ids), self.context_length)

    @classmethod
    def from_metadata(cls, meta: dict[str, Any]) -> ModelConfig:
        arch = meta.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise UnsupportedModelError("GGUF metadata lacks general.architecture")

        def get(key: str, default: Any = None) -> Any:
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise UnsupportedModelError(f"GGUF metadata lacks {arch}.{key}")
            return value

        dim = int(get("embedding_length"))
        num_heads = int(get("attention.head_count"))
        vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        head_dim = _head_dim(meta, arch, dim, num_heads)
        return cls(
            architecture=arch,
            num_layers=int(get("block_count")),
            dim=dim,
            ffn_dim=int(get("feed_forward_length")),
            num_heads=num_heads,
            num_kv_heads=int(get("attention.head_count_kv", num_heads)),
            head_dim=head_dim,
            rms_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_base=float(get("rope.freq_base", 10000.0)),
            context_length=int(get("context_length")),
            vocab_size=int(vocab),
            num_experts=int(get("expert_count", 0)),
            num_experts_used=int(get("expert_used_count", 0)),
            expert_ffn_dim=int(get("expert_feed_forward_length", 0)),
            sliding_window=int(get("attention.sliding_window", 0)),
        )


def _head_dim(meta: dict[str, Any], arch: str, dim: int, num_heads: int) -> int:
    """The file's head size: attention.key_length where it gives one (as llama.cpp reads
    it), else dim / heads; values and rope must span the same size (no partial rope)."""
    key_length = meta.get(f"{arch}.attention.key_length")
    if key_length is None and num_heads > 0 and dim % num_heads:
        raise UnsupportedModelError(
            f"embedding_length {dim} is not a multiple of head_count {num_heads} and the file "
            f"gives no {arch}.attention.key_length"
        )
    head_dim = int(key_length if key_length is not None else dim // max(num_heads, 1))
    for key, what in (("attention.value_length", "value heads"), ("rope.dimension_count", "rope")):
        value = meta.get(f"{arch}.{key}")
        if value is not None and int(value) != head_dim:
            raise UnsupportedModelError(
                f"{arch}.{key}={value}: {what} of another size than the head_dim {head_dim} "
                "is not supported"
            )
    return head_dim
