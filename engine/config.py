"""Typed configuration: the model's shape (read from GGUF) and the engine's limits."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common.errors import InvalidRequestError, PromptTooLongError, UnsupportedModelError

# qwen2: llama with q, k and v biases; qwen3: llama with each head's q and k RMS-normed
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")
# files whose q and k rows rotate in halves (llama.cpp's NEOX rope) as this engine does; a
# llama file's rotate adjacent pairs, its rows reordered at load
HALVES_ROPE_ARCHITECTURES = ("qwen2", "qwen3")
QK_NORM_ARCHITECTURES = ("qwen3",)  # blk.N.attn_q_norm / attn_k_norm, [head_dim] each
RUNNING_TOKENS = 2048  # positions per running sequence the default KV pool makes room for


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of a llama-family model, read from GGUF metadata."""

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
        # heads x head_dim need not be dim (Qwen 3 0.6B: 16 heads of 128 on a 1024-wide model)
        if self.head_dim < 2 or self.head_dim % 2:
            raise UnsupportedModelError(f"head_dim {self.head_dim} is not a positive even number")

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def qk_norm(self) -> bool:
        """Each head's q and k are RMS-normed before rope (Qwen 3)."""
        return self.architecture in QK_NORM_ARCHITECTURES

    @property
    def rope_in_pairs(self) -> bool:
        """The file's q and k rows rotate adjacent pairs (llama), not halves (qwen2)."""
        return self.architecture not in HALVES_ROPE_ARCHITECTURES

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
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"architecture {arch!r} is not supported (supported: "
                f"{', '.join(SUPPORTED_ARCHITECTURES)})"
            )

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


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Limits of one engine: how much work one step may do."""

    max_running: int = 32  # sequences decoding together
    prefill_chunk_tokens: int = 256  # prompt tokens one sequence prefills in one step
    step_prefill_tokens: int = 512  # prompt tokens all sequences prefill in one step
    session_budget_bytes: int = 2 << 30  # KV kept for idle sessions (LRU beyond it)
    # the most session_budget_bytes is raised to while the engine runs (None: itself)
    session_ceiling_bytes: int | None = None
    # the KV pool, preallocated (pages are taken as written): None for the session ceiling
    # plus room for max_running sequences of up to RUNNING_TOKENS positions each
    kv_pool_bytes: int | None = None
    # while sequences decode, a step prefills only the prompt tokens that fit this time
    # (learned from the steps run); None: up to step_prefill_tokens whatever they cost
    step_budget_s: float | None = None

    def pool_bytes(self, bytes_per_token: int, context_length: int) -> int:
        """The KV pool's size: kv_pool_bytes, or the default described there."""
        if self.kv_pool_bytes is not None:
            return self.kv_pool_bytes
        running = self.max_running * min(context_length, RUNNING_TOKENS) * bytes_per_token
        return max(self.session_budget_bytes, self.session_ceiling_bytes or 0) + running

    def __post_init__(self) -> None:
        for name in ("max_running", "prefill_chunk_tokens", "step_prefill_tokens"):
            if getattr(self, name) < 1:
                raise InvalidRequestError(name, f"must be >= 1, got {getattr(self, name)}")
        if self.session_budget_bytes < 0:
            raise InvalidRequestError("session_budget_bytes", "must be >= 0")
        if self.kv_pool_bytes is not None and self.kv_pool_bytes <= 0:
            raise InvalidRequestError("kv_pool_bytes", "must be > 0")
        if self.step_budget_s is not None and self.step_budget_s <= 0:
            raise InvalidRequestError("step_budget_s", "must be > 0")
        if self.prefill_chunk_tokens > self.step_prefill_tokens:
            raise InvalidRequestError("prefill_chunk_tokens", "must not exceed step_prefill_tokens")
