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
    demo = _Demo(Client(target, timeout_s=timeout_s), should_stop, out)
    threads = [
        threading.Thread(target=demo.talk, args=(sid, turns), name=f"demo {sid}", daemon=True)
        for sid, turns in DEMO_TURNS.items()
    ]
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads) and not should_stop():
            time.sleep(_POLL_S)
    finally:
        demo.client.close()  # calls still running end with CANCELLED
        for t in threads:
            t.join(_JOIN_S)
    return not demo.failures


class _Demo:
    def __init__(
        self, client: Client, should_stop: Callable[[], bool], out: Callable[[str], None]
    ) -> None:
        self.client = client
        self.should_stop = should_stop
        self.out = out
        self.lock = threading.Lock()
        self.failures: list[str] = []

    def say(self, line: str) -> None:
        with self.lock:
            self.out(line)

    def talk(self, session_id: str, turns: list[str]) -> None:
        messages: list[dict[str, str]] = []
        for text in turns:
            messages.append({"role": "user", "content": text})
            try:
                reply = self.client.complete(
                    session_id, messages=messages, max_tokens=MAX_TOKENS, temperature=0.0
                )
            except grpc.RpcError as e:
                self.failures.append(session_id)
                if not self.should_stop():
                    self.say(f"[{session_id}] error: {e.code().name}: {e.details()}")
                return
            except ValueError:  # the channel was closed: we are stopping
                self.failures.append(session_id)
                return
            messages.append({"role": "assistant", "content": reply.text})
            c = reply.completion
            self.say(
                f"[{session_id}] user: {text}\n"
                f"[{session_id} · {c.worker_id} · cached {c.usage.cached_tokens}/"
                f"{c.usage.prompt_tokens}] {' '.join(reply.text.split())}"
            )
