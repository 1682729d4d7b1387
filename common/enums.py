"""The names every layer shares: where a session's KV is, where a request's KV came from,
why a request ended, and its priority class. String enums: they travel as their values."""

from __future__ import annotations

import enum


class Tier(enum.StrEnum):
    """Where a session's KV lives."""

    HOT = "hot"  # in a worker's memory, in a running request
    WARM = "warm"  # in a worker's pool, idle
    SPILLING = "spilling"  # ordered to disk, still in the worker's memory until written
    DISK = "disk"  # in its spill file
    GONE = "gone"  # nowhere: recomputed when the session returns


IN_MEMORY = (Tier.HOT, Tier.WARM, Tier.SPILLING)

# --device: where a worker's model runs (engine/device.py picks the array module)
DEVICES = ("auto", "cpu", "cuda", "mlx")


class KVSource(enum.StrEnum):
    """Where a request's reused KV came from."""

    COLD = "cold"  # nothing reused
    WARM = "warm"  # the worker's memory
    DISK = "disk"  # a spill file
    PREFIX = "prefix"  # whole blocks of a prefix other sessions of the tenant computed


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end-of-turn token or a stop string
    LENGTH = "length"  # max_tokens, or the context is full
    CANCELLED = "cancelled"


class Priority(enum.StrEnum):
    """Classes served strictly in this order."""

    INTERACTIVE = "interactive"
    NORMAL = "normal"
    BATCH = "batch"


PRIORITIES = tuple(Priority)  # in the order they are served
