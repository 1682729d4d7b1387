"""Two sessions talking to a running warmfleet at once: what `warmfleet up --demo` shows."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc

from warmfleet.client import Client

DEMO_TURNS = {
    "demo-a": ["What is the capital of France?", "And which river runs through it?"],
    "demo-b": ["Name three colors of the rainbow.", "Which of them is the color of the sky?"],
}
MAX_TOKENS = 48
_POLL_S = 0.1
_JOIN_S = 5.0


def run_demo(
    target: str,
    should_stop: Callable[[], bool],
    out: Callable[[str], None] = print,
    timeout_s: float = 120.0,
) -> bool:
    """Run the demo sessions concurrently, each turn resending its whole conversation, and
    print every reply with its worker and cached tokens. True when every turn succeeded.

    Returns early, cancelling the calls in flight, once `should_stop()` is true.
    """
    lock = threading.Lock()
    failures: list[str] = []
    client = Client(target, timeout_s=timeout_s)

    def say(line: str) -> None:
        with lock:
            out(line)

    def talk(session_id: str, turns: list[str]) -> None:
        messages: list[dict[str, str]] = []
        for text in turns:
            messages.append({"role": "user", "content": text})
            try:
                reply = client.complete(
                    session_id, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0
                )
            except grpc.RpcError as e:
                failures.append(session_id)
                if not should_stop():
                    say(f"[{session_id}] error: {e.code().name}: {e.details()}")
                return
            except ValueError:  # the channel was closed: we are stopping
                failures.append(session_id)
                return
            messages.append({"role": "assistant", "content": reply.text})
            c = reply.completion
            say(
                f"[{session_id}] user: {text}\n"
                f"[{session_id} · {c.worker_id} · cached {c.usage.cached_tokens}/"
                f"{c.usage.prompt_tokens}] {' '.join(reply.text.split())}"
            )

    threads = [
        threading.Thread(target=talk, args=(sid, turns), name=f"demo {sid}", daemon=True)
        for sid, turns in DEMO_TURNS.items()
    ]
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads) and not should_stop():
            time.sleep(_POLL_S)
    finally:
        client.close()  # calls still running end with CANCELLED
        for t in threads:
            t.join(_JOIN_S)
    return not failures
