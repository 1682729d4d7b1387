"""The engine's limits: how much work one step may do, and how large the KV pool is."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import InvalidRequestError

RUNNING_TOKENS = 2048  # positions per running sequence the default KV pool makes room for


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
