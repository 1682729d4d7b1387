"""The shared names as the gRPC API spells them (warmfleet.v1 enums), both ways."""

from __future__ import annotations

from common.enums import FinishReason, KVSource, Priority, Tier
from common.v1 import inference_pb2 as pb

TIER = {
    Tier.HOT: pb.TIER_HOT,
    Tier.WARM: pb.TIER_WARM,
    Tier.SPILLING: pb.TIER_SPILLING,
    Tier.DISK: pb.TIER_DISK,
    Tier.GONE: pb.TIER_GONE,
}
KV_SOURCE = {
    KVSource.COLD: pb.KV_SOURCE_COLD,
    KVSource.WARM: pb.KV_SOURCE_WARM,
    KVSource.DISK: pb.KV_SOURCE_DISK,
    KVSource.PREFIX: pb.KV_SOURCE_PREFIX,
}
FINISH_REASON = {
    FinishReason.STOP: pb.FINISH_REASON_STOP,
    FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
    FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED,
}
PRIORITY_FROM_PB = {
    pb.PRIORITY_UNSPECIFIED: Priority.NORMAL,
    pb.PRIORITY_INTERACTIVE: Priority.INTERACTIVE,
    pb.PRIORITY_NORMAL: Priority.NORMAL,
    pb.PRIORITY_BATCH: Priority.BATCH,
}


def tier_pb(name: str) -> pb.Tier:
    """The API's tier for a tier name (TIER_UNSPECIFIED for one it does not know)."""
    try:
        return TIER[Tier(name)]
    except ValueError:
        return pb.TIER_UNSPECIFIED
