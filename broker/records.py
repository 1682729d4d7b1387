"""A session's record in the residency index (`wf:session:{tenant}:{id}`, a Redis hash):
written by the kvstore only, read by the gateway and by the ENQUEUE script (its worker)."""

from __future__ import annotations

from dataclasses import dataclass

from common.enums import Tier


@dataclass(frozen=True, slots=True)
class SessionRecord:
    tier: Tier
    worker: str  # "" unless the KV is in a worker's memory
    num_tokens: int
    nbytes: int  # in memory, or the file's size on disk
    last_used: float  # unix seconds
    file_mtime_ns: int = 0  # DISK: recognises the file this record describes

    def to_fields(self) -> dict[str, str]:
        return {
            "tier": str(self.tier),
            "worker": self.worker,
            "num_tokens": str(self.num_tokens),
            "kv_bytes": str(self.nbytes),
            "last_used": f"{self.last_used:.3f}",
            "file_mtime_ns": str(self.file_mtime_ns),
        }

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> SessionRecord:
        return cls(
            Tier(f.get("tier", Tier.GONE)),
            f.get("worker", ""),
            int(f.get("num_tokens", 0)),
            int(f.get("kv_bytes", 0)),
            float(f.get("last_used", 0)),
            int(f.get("file_mtime_ns", 0)),
        )
