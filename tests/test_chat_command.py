"""`warmfleet chat`, one turn and the REPL, against an in-process fake gateway."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest

from tests.fake_cluster import FakeInference, serve
from warmfleet.cli import main
from warmfleet.processes import free_port


@pytest.fixture
def fake() -> FakeInference:
    return FakeInference(worker_id="w1")


@pytest.fixture
def target(fake: FakeInference) -> Iterator[str]:
    server, port = serve(fake)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)


def test_one_turn_json(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["chat", "--session", "s", "--target", target, "--message", "hi", "--json"])
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["text"] == "echo: hi"
    assert result["token_ids"] == [ord(c) for c in "echo: hi"]
    completion = result["completion"]
    assert completion["worker_id"] == "w1"
    assert completion["finish_reason"] == "FINISH_REASON_STOP"
    assert completion["usage"]["cached_tokens"] == 0  # zeros are printed, not dropped


def test_one_turn_streams_text_and_passes_options(
    target: str, fake: FakeInference, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["chat", "--session", "s", "--target", target, "--system", "be brief"]
    argv += ["--message", "hi", "--max-tokens", "7", "--temperature", "0.5", "--seed", "3"]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out == "echo: h\n"
    assert "[w1 · kv cold · cached 0/" in err
    request = fake.requests[-1]
    assert [(m.role, m.content) for m in request.messages.messages] == [
        ("system", "be brief"),
        ("user", "hi"),
    ]
    assert (request.max_tokens, request.temperature, request.seed) == (7, 0.5, 3)


def test_repl_resends_the_whole_conversation(
    target: str,
    fake: FakeInference,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("first\n\nsecond\n/quit\nnever sent\n"))
    assert main(["chat", "--session", "s", "--target", target]) == 0
    out, err = capsys.readouterr()
    assert out == "echo: first\necho: second\n"
    assert len(fake.requests) == 2
    assert [(m.role, m.content) for m in fake.requests[1].messages.messages] == [
        ("user", "first"),
        ("assistant", "echo: first"),
        ("user", "second"),
    ]
    assert "kv warm" in err.splitlines()[-1]


def test_target_from_environment(
    target: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WARMFLEET_TARGET", target)
    assert main(["chat", "--session", "s", "--message", "yo"]) == 0
    assert capsys.readouterr().out == "echo: yo\n"


def test_grpc_error_is_one_line(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["chat", "--session", "s", "--target", target, "--message", "hi", "--max-tokens", "0"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == "warmfleet: error: INVALID_ARGUMENT: max_tokens: must be at least 1\n"


def test_unreachable_gateway_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    target = f"127.0.0.1:{free_port()}"
    assert main(["chat", "--session", "s", "--target", target, "--message", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("warmfleet: error: UNAVAILABLE: ")
    assert err.count("\n") == 1


def test_json_needs_message(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chat", "--session", "s", "--json"]) == 2
    assert "--json: needs --message" in capsys.readouterr().err
