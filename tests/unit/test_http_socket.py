"""The gateway's HTTP socket: the connections it accepts send small writes at once
(TCP_NODELAY), so a response's body does not wait 40 ms behind its head."""

from __future__ import annotations

import socket

from gateway.server import http_socket


def test_accepted_connections_have_nagle_off() -> None:
    with http_socket("127.0.0.1", 0) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as client:
            accepted, _ = server.accept()
            with accepted:
                assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                assert not client.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
