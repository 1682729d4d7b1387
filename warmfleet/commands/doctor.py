"""`warmfleet doctor`: being written (a placeholder so the CLI imports)."""

from __future__ import annotations

from typing import Any


def register(sub: Any) -> None:
    """Placeholder."""
