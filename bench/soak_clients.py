"""The soak script's clients: each, until told to stop, sends one request after another over
gRPC or HTTP (the OpenAI API, streamed), picking at random among fixed prompts, lengths and
samplings (greedy or seeded), a priority and a session; some are cancelled (gRPC) or their
connection closed (HTTP) after a few chunks. Every reply is checked against the
in-process reference of the same request."""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.chaos_stream import (
    HUNG,
    NO_COMPLETION,
    OK,
    Attempt,
    Expected,
    check,
    generate,
    references,
)
from common.sampling import SamplingParams
from common.v1 import inference_pb2_grpc
from engine.model import Model
from warmfleet.client import build_request

DISCONNECTED = "DISCONNECTED_BY_CLIENT"
TOPICS = ["the sea", "a mountain", "a library", "the moon", "a train", "a garden", "a violin",
          "the desert", "a lighthouse", "a market", "a glacier", "a forest"]  # fmt: skip
LENGTHS = (8, 24)
SAMPLINGS: tuple[tuple[float, int | None], ...] = ((0.0, None), (0.8, 1), (0.8, 2))
_GUARD_S = 5.0


@dataclass(frozen=True)
class Pick:
    """One request's choices."""

    topic: int
    max_tokens: int
    sampling: int  # index into SAMPLINGS
    priority: str
    session: str
    interrupt_after: int | None  # chunks before the client cancels or disconnects

    @property
    def key(self) -> str:
        return f"{self.topic}/{self.max_tokens}/{self.sampling}"

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Write two sentences about {TOPICS[self.topic]}."}]


def all_references(model: Model) -> dict[str, Expected]:
    """Every request a client may send, run in-process."""
    requests = {}
    for topic in range(len(TOPICS)):
        for n in LENGTHS:
            for s, (temperature, seed) in enumerate(SAMPLINGS):
                pick = Pick(topic, n, s, "normal", "", None)
                params = SamplingParams(temperature=temperature, seed=seed, max_tokens=n)
                requests[pick.key] = (pick.messages, params)
    return references(model, requests)


@dataclass
class Soak:
    """What the clients share: where to send, as whom, when to stop, what happened."""

    stub: inference_pb2_grpc.InferenceStub
    http: httpx.AsyncClient
    keys: list[str]  # one API key per tenant
    expected: dict[str, Expected]
    run_id: str
    deadline_s: float
    interrupt_share: float
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    done: list[tuple[str, str, Attempt]] = field(default_factory=list)  # (face, priority, ..)


def pick(rng: random.Random, soak: Soak, client: int, n: int) -> Pick:
    session = f"{soak.run_id}-c{client}-s{rng.randrange(3)}"
    if rng.random() < 0.1:
        session = f"{soak.run_id}-c{client}-new{n}"  # sessions keep coming
    interrupt = rng.randint(1, 4) if rng.random() < soak.interrupt_share else None
    return Pick(rng.randrange(len(TOPICS)), rng.choice(LENGTHS), rng.randrange(len(SAMPLINGS)),
                rng.choice(["interactive", "batch"]), session, interrupt)  # fmt: skip


async def client(soak: Soak, number: int, face: str) -> None:
    """Send requests one after another until `soak.stop`."""
    rng = random.Random(number)
    key = soak.keys[number % len(soak.keys)]
    n = 0
    while not soak.stop.is_set():
        p = pick(rng, soak, number, n)
        send = grpc_request if face == "grpc" else http_request
        attempt = await send(soak, p, key)
        check(attempt, soak.expected[p.key], has_ids=face == "grpc")
        soak.done.append((face, p.priority, attempt))
        n += 1
        await asyncio.sleep(rng.uniform(0.0, 0.5))


async def grpc_request(soak: Soak, p: Pick, key: str) -> Attempt:
    temperature, seed = SAMPLINGS[p.sampling]
    request = build_request(p.session, messages=p.messages, max_tokens=p.max_tokens,
                            temperature=temperature, seed=seed, priority=p.priority)  # fmt: skip
    return await generate(soak.stub, request, deadline_s=soak.deadline_s,
                          metadata=[("authorization", f"Bearer {key}")],
                          cancel_after=p.interrupt_after)  # fmt: skip


async def http_request(soak: Soak, p: Pick, key: str) -> Attempt:
    temperature, seed = SAMPLINGS[p.sampling]
    body: dict[str, Any] = {"messages": p.messages, "max_tokens": p.max_tokens, "stream": True,
                            "temperature": temperature, "priority": p.priority,
                            "stream_options": {"include_usage": True}}  # fmt: skip
    if seed is not None:
        body["seed"] = seed
    headers = {"authorization": f"Bearer {key}", "x-session-id": p.session,
               "x-request-timeout": str(soak.deadline_s)}  # fmt: skip
    attempt = Attempt(start=time.monotonic())
    try:
        read = _read_sse(soak.http, body, headers, attempt, p.interrupt_after)
        await asyncio.wait_for(read, soak.deadline_s + _GUARD_S)
    except TimeoutError:
        attempt.code = HUNG
    except httpx.HTTPError as e:
        attempt.code = f"HTTP {type(e).__name__}"
    attempt.end = time.monotonic()
    return attempt


async def _read_sse(
    http: httpx.AsyncClient,
    body: dict[str, Any],
    headers: dict[str, str],
    attempt: Attempt,
    interrupt_after: int | None,
) -> None:
    """Read one streamed chat completion into `attempt`; leaving early closes the connection."""
    async with http.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            attempt.code = HUNG if r.status_code == 504 else f"HTTP {r.status_code}"
            return
        attempt.code = NO_COMPLETION
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[len("data: ") :])
            if "error" in data:  # after the 200, an error travels in the stream
                code = data["error"].get("code")
                attempt.code = HUNG if code == "deadline_exceeded" else f"HTTP event {code}"
                return
            if usage := data.get("usage"):
                attempt.reported_tokens = usage["completion_tokens"]
                attempt.code = OK
            for choice in data.get("choices") or []:
                if text := (choice.get("delta") or {}).get("content"):
                    attempt.text += text
                    attempt.arrivals.append((time.monotonic(), len(attempt.arrivals) + 1))
            if interrupt_after is not None and len(attempt.arrivals) >= interrupt_after:
                attempt.code = DISCONNECTED
                return
