"""The worker's settings, checked when built."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import InvalidRequestError


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    worker_id: str
    lease_s: float = 5.0  # an entry whose worker stops renewing is taken over after this
    idle_block_ms: int = 500  # longest wait for new requests while idle
    # the heartbeat lapses this long after the last beat: then the worker counts as dead and
    # a live one adopts its streams (the lease is only the backstop)
    heartbeat_ttl_s: float = 1.5
    heartbeat_interval_s: float = 0.5
    takeover_check_s: float = 0.25  # how often a worker looks for dead ones (one EXISTS each)
    max_backoff_s: float = 2.0  # cap of the reconnect back-off
    # idle sessions' KV that the kvstore keeps in this worker's memory (it orders the least
    # recently used to disk beyond it); while no kvstore runs, the worker keeps to it itself
    warm_budget_bytes: int = 2 << 30
    stall_s: float = 60.0  # a loop with no pass for this long stops its heartbeat

    def __post_init__(self) -> None:
        if (
            not self.worker_id
            or any(c in self.worker_id for c in ":/ ")
            or len(self.worker_id) > 64
        ):
            raise InvalidRequestError("worker_id", "1-64 characters, no ':', '/' or spaces")
        if self.lease_s < 1.0:
            raise InvalidRequestError("lease_s", f"must be >= 1 s, got {self.lease_s}")
        if self.heartbeat_ttl_s < max(0.1, 2 * self.heartbeat_interval_s):
            raise InvalidRequestError(
                "heartbeat_ttl_s",
                f"must be >= 0.1 s and span two beats (one every "
                f"{self.heartbeat_interval_s:g} s), got {self.heartbeat_ttl_s:g}",
            )
        if self.warm_budget_bytes < 0:
            raise InvalidRequestError("warm_budget_bytes", "must be >= 0")
        if self.stall_s < self.lease_s:
            raise InvalidRequestError("stall_s", f"must be >= lease_s ({self.lease_s} s)")

    @property
    def pool_ceiling_bytes(self) -> int:
        """While the kvstore runs, the pool evicts by itself only past this: a memory guard
        for when its orders do not keep up, far enough above the budget that they do."""
        return max(2 * self.warm_budget_bytes, self.warm_budget_bytes + (1 << 30))
