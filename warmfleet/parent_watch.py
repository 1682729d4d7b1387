"""Children of `warmfleet up` stop when the launcher is gone, even if it was SIGKILLed.

The launcher sets WARMFLEET_PARENT_PID; a worker or gateway started any other way (systemd,
compose) does not watch its parent.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

PARENT_ENV = "WARMFLEET_PARENT_PID"
CHECK_INTERVAL_S = 1.0


def watch_parent(on_gone: Callable[[], None]) -> threading.Thread | None:
    """Call `on_gone` once if the launcher that started this process exits."""
    raw = os.environ.get(PARENT_ENV)
    if not raw or not raw.isdigit():
        return None
    parent = int(raw)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(CHECK_INTERVAL_S):
            if os.getppid() != parent:
                on_gone()
                return

    thread = threading.Thread(target=loop, name="parent-watch", daemon=True)
    thread.start()
    return thread
