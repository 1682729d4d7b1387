"""Consumer groups on Redis streams."""

from __future__ import annotations

import redis


def ensure_group(r: redis.Redis, stream: str, group: str) -> None:
    """Create `group` on `stream` (and the stream), reading from its first entry, unless it
    exists: entries added before the group (a new Redis, a restarted reader) are read."""
    try:
        r.xgroup_create(stream, group, id="0", mkstream=True)
    except redis.ResponseError as e:
        if "BUSYGROUP" not in str(e):
            raise
