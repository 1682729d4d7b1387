"""Hostile HTTP requests on kept-alive connections, each followed by a valid one on the same
connection, against a real cluster of the tiny model: bodies nested past the bound (65 to 10^6
levels) in every JSON-bearing field, lone surrogates in every text field, key and id, odd
bytes in the headers, a body cut off midway. Each hostile request gets a 4xx in its API's
shape, naming what was wrong; the connection serves the next request (a server that closes
says `Connection: close`); the valid ones answer 200 with the same greedy reply every time;
and no traceback is logged."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.cluster_helpers import one_worker
from tests.planted_bodies import COUNT, FORK, MESSAGES, hostile_bodies
from tests.test_fuzz import assert_cluster_sound
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
TIMEOUT_S = 30.0
HI = [{"role": "user", "content": "hello there"}]
GREEDY = {"temperature": 0}  # the faces' default follows the APIs' (temperature 1)
VALID: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": HI, "max_tokens": 3, **GREEDY}),
    ("/v1/completions", {"prompt": "hello there", "max_tokens": 3, **GREEDY}),
    ("/v1/messages", {"messages": HI, "max_tokens": 3, **GREEDY}),
    ("/v1/messages/count_tokens", {"messages": HI}),
    ("/v1/responses", {"input": "hello there", "max_output_tokens": 3, **GREEDY}),
]
HEADERS = (b"x-session-id", b"x-request-timeout", b"authorization")
ODD_BYTES = [*range(32), 0x7F, 0x80, 0x85, 0xA0, 0xFF]


@pytest.fixture(scope="module")
def cluster(tiny_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with one_worker(tiny_path, tmp_path_factory.mktemp, lease_s=2.0) as c:
        yield c


def reply_of(route: str, status: int, body: bytes) -> object:
    """What a valid request's answer says, checked to be whole: the text, or the count."""
    assert status == 200, (route, status, body[:300])
    j = json.loads(body)
    if route == COUNT:
        assert j["input_tokens"] > 0, j
        return j["input_tokens"]
    if route == MESSAGES:
        assert j["type"] == "message" and j["usage"]["output_tokens"] <= 3, j
        return j["content"]
    if route == "/v1/responses":
        assert j["object"] == "response" and j["usage"]["output_tokens"] <= 3, j
        return j["output"][0]["content"][0]["text"] if j["output"] else ""
    assert j["usage"]["completion_tokens"] <= 3, j
    choice = j["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


def refusal_of(route: str, status: int, body: bytes) -> str:
    """A 4xx's message, checked to be in its API's error shape."""
    assert 400 <= status < 500, (route, status, body[:300])
    j = json.loads(body)
    if route.startswith(MESSAGES):
        assert j["type"] == "error" and j["error"]["type"], j
    else:
        assert j["error"]["type"] and j["error"]["code"], j
    return str(j["error"]["message"])


class Replies:
    """The first greedy reply of each valid request; each later one must be the same."""

    def __init__(self) -> None:
        self.first: dict[str, object] = {}

    def check(self, route: str, status: int, body: bytes) -> None:
        reply = reply_of(route, status, body)
        assert self.first.setdefault(route, reply) == reply, (route, reply, self.first[route])


def peer_port(r: httpx.Response) -> int:
    """The client's side of the connection `r` came on: the same port, the same connection."""
    return int(r.extensions["network_stream"].get_extra_info("client_addr")[1])


def test_hostile_bodies_keep_the_connection(cluster: Cluster, tiny_path: Path) -> None:
    replies = Replies()
    one = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    cases = hostile_bodies()
    with httpx.Client(base_url=cluster.http_url, timeout=TIMEOUT_S, limits=one) as http:
        ports = set()
        for n, (route, body, word) in enumerate(cases):
            r = http.post(route, content=body, headers={"content-type": "application/json"})
            message = refusal_of(route, r.status_code, r.content)
            assert r.status_code == 400 and word in message, (route, message, body[:200])
            assert "connection" not in r.headers, r.headers  # a 4xx keeps the connection
            valid_route, valid = VALID[n % len(VALID)]
            v = http.post(valid_route, json=valid)
            replies.check(valid_route, v.status_code, v.content)
            ports |= {peer_port(r), peer_port(v)}
    assert len(ports) == 1, f"{len(cases)} refusals took {len(ports)} connections"
    assert_cluster_sound(cluster, tiny_path)


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=TIMEOUT_S)


class RawConnection:
    """HTTP/1.1 on one socket, as written: header bytes no client library would send."""

    def __init__(self, url: str) -> None:
        self.sock = connect(url)
        self.buffer = b""

    def post(self, route: str, body: bytes, extra: bytes = b"") -> tuple[int, bytes, bytes]:
        """(status, head, body) of the answer; `extra`: header lines, each ending CRLF."""
        head = f"POST {route} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n"
        return self.exchange(head.encode() + extra + b"\r\n" + body)

    def exchange(self, request: bytes) -> tuple[int, bytes, bytes]:
        """Send `request` as it is; (status, head in lower case, body) of the answer."""
        self.sock.sendall(request)
        while b"\r\n\r\n" not in self.buffer:
            self._read()
        head_bytes, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = head_bytes.lower().split(b"\r\n")
        size = int(next(ln.split(b":")[1] for ln in lines if ln.startswith(b"content-length")))
        while len(self.buffer) < size:
            self._read()
        answer, self.buffer = self.buffer[:size], self.buffer[size:]
        return int(lines[0].split()[1]), head_bytes.lower(), answer

    def closed_by_server(self) -> bool:
        closed = self.sock.recv(1) == b""
        self.sock.close()
        return closed

    def _read(self) -> None:
        data = self.sock.recv(65536)
        assert data, "the server closed the connection without saying so"
        self.buffer += data


def test_odd_header_bytes_keep_the_connection_or_say_close(
    cluster: Cluster, tiny_path: Path
) -> None:
    replies, route, valid = Replies(), *VALID[1]
    body = json.dumps(valid).encode()
    conn, num_closed = RawConnection(cluster.http_url), 0
    for name in HEADERS:
        for byte in ODD_BYTES:
            value = (b"Bearer k" if name == b"authorization" else b"5") + bytes([byte]) + b"1"
            status, head, answer = conn.post(route, body, name + b": " + value + b"\r\n")
            assert status < 500, (name, byte, status, answer)
            if b"connection: close" in head:  # uvicorn's own refusal of a malformed header
                assert status == 400 and conn.closed_by_server(), (name, byte, head)
                conn, num_closed = RawConnection(cluster.http_url), num_closed + 1
            elif status != 200:
                assert "X-" in refusal_of(route, status, answer) or status == 401, answer
            else:
                replies.check(route, status, answer)
            replies.check(route, *conn.post(route, body)[::2])  # the same connection serves on
    assert 0 < num_closed < len(HEADERS) * len(ODD_BYTES), num_closed
    assert_cluster_sound(cluster, tiny_path)


MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"POST /v1/\x01 HTTP/1.1\r\nhost: x\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: ab\r\n\r\n",
    b"POST /v1/completions HTTP/1.1\r\nno colon\r\n\r\n",
]


@pytest.mark.parametrize("request_bytes", MALFORMED)
def test_what_uvicorn_cannot_parse_is_refused_saying_close(
    cluster: Cluster, request_bytes: bytes
) -> None:
    route, valid = VALID[3]
    conn = RawConnection(cluster.http_url)
    Replies().check(route, *conn.post(route, json.dumps(valid).encode())[::2])  # kept alive
    status, head, _ = conn.exchange(request_bytes)
    assert status == 400 and b"connection: close" in head and conn.closed_by_server(), head


def test_a_body_cut_off_midway_leaves_no_traceback(cluster: Cluster, tiny_path: Path) -> None:
    for route in (VALID[0][0], MESSAGES, FORK):
        with connect(cluster.http_url) as s:
            s.sendall(
                f"POST {route} HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n"
                '9\r\n{"message\r\n'.encode()
            )
    conn, replies = RawConnection(cluster.http_url), Replies()
    for route, valid in VALID:  # the gateway serves on; its log is checked below
        replies.check(route, *conn.post(route, json.dumps(valid).encode())[::2])
    assert_cluster_sound(cluster, tiny_path)
