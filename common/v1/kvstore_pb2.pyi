from common.v1 import inference_pb2 as _inference_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetUsageRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerUsage(_message.Message):
    __slots__ = ("worker_id", "alive", "pool_bytes", "warm_budget_bytes", "warm_bytes", "spilling_bytes", "num_hot", "num_warm", "num_spilling")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    POOL_BYTES_FIELD_NUMBER: _ClassVar[int]
    WARM_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    WARM_BYTES_FIELD_NUMBER: _ClassVar[int]
    SPILLING_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_HOT_FIELD_NUMBER: _ClassVar[int]
    NUM_WARM_FIELD_NUMBER: _ClassVar[int]
    NUM_SPILLING_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    alive: bool
    pool_bytes: int
    warm_budget_bytes: int
    warm_bytes: int
    spilling_bytes: int
    num_hot: int
    num_warm: int
    num_spilling: int
    def __init__(self, worker_id: _Optional[str] = ..., alive: _Optional[bool] = ..., pool_bytes: _Optional[int] = ..., warm_budget_bytes: _Optional[int] = ..., warm_bytes: _Optional[int] = ..., spilling_bytes: _Optional[int] = ..., num_hot: _Optional[int] = ..., num_warm: _Optional[int] = ..., num_spilling: _Optional[int] = ...) -> None: ...

class DiskUsage(_message.Message):
    __slots__ = ("spill_dir", "used_bytes", "budget_bytes", "num_files")
    SPILL_DIR_FIELD_NUMBER: _ClassVar[int]
    USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    NUM_FILES_FIELD_NUMBER: _ClassVar[int]
    spill_dir: str
    used_bytes: int
    budget_bytes: int
    num_files: int
    def __init__(self, spill_dir: _Optional[str] = ..., used_bytes: _Optional[int] = ..., budget_bytes: _Optional[int] = ..., num_files: _Optional[int] = ...) -> None: ...

class TierCounts(_message.Message):
    __slots__ = ("hot", "warm", "spilling", "disk", "gone")
    HOT_FIELD_NUMBER: _ClassVar[int]
    WARM_FIELD_NUMBER: _ClassVar[int]
    SPILLING_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    GONE_FIELD_NUMBER: _ClassVar[int]
    hot: int
    warm: int
    spilling: int
    disk: int
    gone: int
    def __init__(self, hot: _Optional[int] = ..., warm: _Optional[int] = ..., spilling: _Optional[int] = ..., disk: _Optional[int] = ..., gone: _Optional[int] = ...) -> None: ...

class KVCounters(_message.Message):
    __slots__ = ("spills", "restores", "rejected_files", "failed_writes", "budget_deletions", "evictions_ordered")
    SPILLS_FIELD_NUMBER: _ClassVar[int]
    RESTORES_FIELD_NUMBER: _ClassVar[int]
    REJECTED_FILES_FIELD_NUMBER: _ClassVar[int]
    FAILED_WRITES_FIELD_NUMBER: _ClassVar[int]
    BUDGET_DELETIONS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_ORDERED_FIELD_NUMBER: _ClassVar[int]
    spills: int
    restores: int
    rejected_files: int
    failed_writes: int
    budget_deletions: int
    evictions_ordered: int
    def __init__(self, spills: _Optional[int] = ..., restores: _Optional[int] = ..., rejected_files: _Optional[int] = ..., failed_writes: _Optional[int] = ..., budget_deletions: _Optional[int] = ..., evictions_ordered: _Optional[int] = ...) -> None: ...

class KVUsage(_message.Message):
    __slots__ = ("workers", "disk", "tiers", "counters", "events_behind")
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_BEHIND_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerUsage]
    disk: DiskUsage
    tiers: TierCounts
    counters: KVCounters
    events_behind: int
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerUsage, _Mapping]]] = ..., disk: _Optional[_Union[DiskUsage, _Mapping]] = ..., tiers: _Optional[_Union[TierCounts, _Mapping]] = ..., counters: _Optional[_Union[KVCounters, _Mapping]] = ..., events_behind: _Optional[int] = ...) -> None: ...

class EvictRequest(_message.Message):
    __slots__ = ("session_id", "tenant")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    tenant: str
    def __init__(self, session_id: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class EvictResponse(_message.Message):
    __slots__ = ("tier",)
    TIER_FIELD_NUMBER: _ClassVar[int]
    tier: _inference_pb2.Tier
    def __init__(self, tier: _Optional[_Union[_inference_pb2.Tier, str]] = ...) -> None: ...
