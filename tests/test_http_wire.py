"""The HTTP face read raw with httpx: every SSE event parses and the streams end as their APIs
say; every error status comes in each API's shape; a client that goes away mid-stream
cancels its request on the worker at once."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import httpx
import pytest
import redis as redis_lib

from broker import codec, keys
from broker.messages import Completion, JobError, TokenChunk
from common.enums import FinishReason
from tests.cluster_helpers import fleet_state, wait_for, worker_status
from tests.conftest import MAX_BODY_BYTES, KeyedCluster

pytestmark = pytest.mark.slow
CHAT = [{"role": "user", "content": "Count from 1 to 50, one number per line."}]


def http(kc: KeyedCluster, tenant: str | None = "alice", **headers: str) -> httpx.Client:
    auth = {"Authorization": f"Bearer {kc.keys[tenant]}"} if tenant else {}
    return httpx.Client(base_url=kc.cluster.http_url, headers={**auth, **headers}, timeout=120)


def sse(lines: list[str]) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) of each event ([DONE] stays a string)."""
    events, name = [], None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: ") :]
        elif line.startswith("data: "):
            raw = line[len("data: ") :]
            events.append((name, raw if raw == "[DONE]" else json.loads(raw)))
            name = None
    return events


def stream_lines(client: httpx.Client, path: str, body: dict[str, Any]) -> list[str]:
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        return [line for line in r.iter_lines() if line]


def test_openai_sse_parses_ends_with_done_and_carries_usage_when_asked(
    keyed_cluster: KeyedCluster,
) -> None:
    with http(keyed_cluster) as c:
        for include in (True, False):
            # greedy: the face's default (temperature 1) might end before 8 tokens
            body = {"messages": CHAT, "max_tokens": 8, "stream": True, "temperature": 0,
                    "stream_options": {"include_usage": include}}  # fmt: skip
            events = sse(stream_lines(c, "/v1/chat/completions", body))
            assert events[-1] == (None, "[DONE]")
            chunks = [d for _, d in events[:-1]]
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert all(d["object"] == "chat.completion.chunk" for d in chunks)
            usage = [d for d in chunks if d.get("usage")]
            assert len(usage) == include and all(d["choices"] == [] for d in usage)
            finish = [d["choices"][0]["finish_reason"] for d in chunks if d["choices"]]
            assert finish[-1] == "length" and set(finish[:-1]) == {None}
            if include:
                assert usage[0]["usage"]["completion_tokens"] == 8
        text = {"prompt": "Once upon a time", "max_tokens": 5, "stream": True}
        events = sse(stream_lines(c, "/v1/completions", text))
        assert events[-1] == (None, "[DONE]") and events[-2][1]["choices"][0]["finish_reason"]


def test_anthropic_sse_has_every_event_in_order(keyed_cluster: KeyedCluster) -> None:
    body = {"max_tokens": 8, "messages": CHAT, "stream": True, "temperature": 0}  # greedy
    with http(keyed_cluster, **{"x-session-id": "sse-a"}) as c:
        events = sse(stream_lines(c, "/v1/messages", body))
    names = [n for n, _ in events]
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[2:-3]) == {"content_block_delta"}
    assert all(d["type"] == n for n, d in events)
    delta = events[-2][1]
    assert delta["delta"]["stop_reason"] == "max_tokens" and delta["usage"]["output_tokens"] == 8
    assert events[0][1]["message"]["usage"]["input_tokens"] == delta["usage"]["input_tokens"]


def openai_error(r: httpx.Response, status: int, param: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return dict(error)


def anthropic_error(r: httpx.Response, status: int, kind: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind and body["error"]["message"]


def test_every_error_comes_with_its_status_and_shape(keyed_cluster: KeyedCluster) -> None:
    kc = keyed_cluster
    with http(kc) as c:
        openai_error(c.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": "8"}),
                     400, "max_tokens")  # fmt: skip
        openai_error(c.post("/v1/chat/completions", json={"messages": CHAT, "n": 2}), 400, "n")
        anthropic_error(c.post("/v1/messages", json={"messages": CHAT}), 400,
                        "invalid_request_error")  # fmt: skip
        openai_error(c.post("/v1/chat/completions", json={"model": "gpt-9", "messages": CHAT}), 404)
        unknown = {"model": "claude-9", "max_tokens": 4, "messages": CHAT}
        anthropic_error(c.post("/v1/messages", json=unknown), 404, "not_found_error")
        openai_error(c.get("/v1/sessions/no-such-session"), 404)
        big = "x" * (MAX_BODY_BYTES + 1)
        huge = {"messages": [{"role": "user", "content": big}]}
        openai_error(c.post("/v1/chat/completions", json=huge), 413)
        anthropic_error(c.post("/v1/messages", content=big), 413, "request_too_large")
        slow = {"messages": CHAT, "max_tokens": 400, "ignore_eos": True}
        error = openai_error(c.post("/v1/chat/completions", json=slow,
                                    headers={"X-Request-Timeout": "0.5"}), 504)  # fmt: skip
        assert "deadline" in error["message"]
    with http(kc, tenant=None) as c:
        openai_error(c.post("/v1/chat/completions", json={"messages": CHAT}), 401)
        wrong = c.post("/v1/messages", json={"max_tokens": 4, "messages": CHAT},
                       headers={"x-api-key": "wrong"})  # fmt: skip
        anthropic_error(wrong, 401, "authentication_error")
    with http(kc, "low") as c:
        high = {"messages": CHAT, "max_tokens": 2, "priority": "interactive"}
        openai_error(c.post("/v1/chat/completions", json=high), 403)
    check_queue_full(kc)


def tiny_state(r: redis_lib.Redis) -> str:
    queued = r.get(keys.tenant_queued("tiny")), r.llen(keys.fair_queue("normal", "tiny"))
    return f"{fleet_state(r)}; tiny's queued count and list {queued}"


def read_lines(response: httpx.Response, lines: list[str]) -> None:
    """The response's lines into `lines` as they come, until it ends or is closed."""
    try:
        for line in response.iter_lines():
            lines.append(line)
    except (httpx.HTTPError, httpx.StreamError):
        pass  # closed by the test when it leaves the stream


def check_queue_full(kc: KeyedCluster) -> None:
    """Tenant tiny may run one request and queue one: a third is refused with a hint."""
    # long enough to outlast the checks on any machine (300 tokens once finished before the
    # second request was queued); leaving the stream cancels it
    long = {"messages": CHAT, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    short = {"messages": CHAT, "max_tokens": 2}

    statuses: list[int] = []

    def wait_in_line() -> None:
        with http(kc, "tiny", **{"x-session-id": "tiny-waiting"}) as own:
            statuses.append(own.post("/v1/chat/completions", json=short).status_code)

    r = redis_lib.Redis.from_url(kc.cluster.redis_url, decode_responses=True)
    queued = threading.Thread(target=wait_in_line)
    with http(kc, "tiny") as c, c.stream("POST", "/v1/chat/completions", json=long) as running:
        lines: list[str] = []  # the long stream as it comes, read aside so a wait never blocks
        reader = threading.Thread(target=read_lines, args=(running, lines), daemon=True)
        reader.start()
        wait_for(lambda: lines, "the role chunk (admitted)")
        # a worker took it: until then it fills tiny's one queue place, and the next is
        # refused; its first text says so too (a running count read between two polls)
        wait_for(lambda: r.hget(keys.RUNNING, "tiny") == "1" or any('"content":"' in ln
                                                                  for ln in lines[1:]),
                 lambda: f"the first to run: {tiny_state(r)}; its stream so far: {lines[:4]}"
                         f"{' ... ' + str(lines[-3:]) if len(lines) > 4 else ''}")  # fmt: skip
        assert reader.is_alive(), f"the long request ended early: {lines[-3:]}"
        queued.start()
        wait_for(lambda: r.get(keys.tenant_queued("tiny")) == "1", "the second to be queued")
        # sessions of their own, new: one continuing a session a worker holds (the running
        # one's prompt is theirs) would go straight to that worker, past the tenant's queue
        refused = c.post("/v1/chat/completions", json=short, headers={"x-session-id": "tiny-3"})
        openai_error(refused, 429)
        assert int(refused.headers["retry-after"]) >= 1
        message = {**short, "max_tokens": 5}
        refused = c.post("/v1/messages", json=message, headers={"x-session-id": "tiny-4"})
        anthropic_error(refused, 429, "rate_limit_error")
    queued.join(timeout=120)  # the running one was cancelled as its client left
    assert statuses == [200]  # the one that waited ran
    r.close()


def test_a_client_that_goes_away_mid_stream_is_cancelled_at_once(
    keyed_cluster: KeyedCluster,
) -> None:
    kc = keyed_cluster
    r = redis_lib.Redis.from_url(kc.cluster.redis_url, decode_responses=True)
    body = {"messages": CHAT, "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with http(kc) as c, c.stream("POST", "/v1/chat/completions", json=body) as response:
        request_id = response.headers["x-request-id"]
        contents = 0
        for line in response.iter_lines():
            contents += '"content":"' in line and '"content":""' not in line
            if contents == 3:
                break
    gone_at = time.monotonic()  # the connection is closed here

    def stopped() -> bool:
        return all(request_id not in worker_status(r, w)["running"] for w in kc.cluster.worker_ids)

    def last_published() -> object:
        entries = r.xrevrange(keys.out_stream(request_id), count=1)
        return codec.decode_fields(entries[0][1], TokenChunk, Completion, JobError)

    wait_for(stopped, "the worker to drop the request", timeout_s=10)
    # its heartbeat thread may say so a moment before the step publishes the completion
    wait_for(lambda: isinstance(last_published(), Completion), "the completion", timeout_s=10)
    print(f"dropped by its worker {time.monotonic() - gone_at:.2f} s after the client left")
    assert time.monotonic() - gone_at < 5
    done, published = last_published(), r.xlen(keys.out_stream(request_id))
    assert isinstance(done, Completion) and done.finish_reason == FinishReason.CANCELLED
    assert done.usage.completion_tokens < 4000
    time.sleep(0.5)
    assert r.xlen(keys.out_stream(request_id)) == published  # nothing more after the end
    r.close()
