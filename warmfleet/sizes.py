"""Byte sizes on the command line: "512M", "2G", "1.5GiB", "300000" (bytes)."""

from __future__ import annotations

import argparse
import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in `text`; K, M, G and T are powers of 1024 (KiB, MiB...). Raises ValueError."""
    m = _SIZE.match(text)
    if m is None:
        raise ValueError(f"not a size: {text!r} (examples: 512M, 2G, 1.5GiB, 1048576)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def size_arg(text: str) -> int:
    """argparse type for sizes."""
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def format_size(n: int) -> str:
    for unit in ("T", "G", "M", "K"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.1f} {unit}iB"
    return f"{n} B"
