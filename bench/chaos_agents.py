"""The chaos script's steady load: agents in multi-turn chats over gRPC, each turn greedy
with a few new tokens and checked against the in-process reference. A turn that fails
with UNAVAILABLE is sent again (as an agent would) after a back-off; any other failure
ends the conversation, and the agent starts a new one."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import grpc

from bench.agent_prompts import TOPICS, user_turn
from bench.chaos_stream import OK, Attempt, Expected, check, generate, references
from common.sampling import SamplingParams
from common.v1 import inference_pb2_grpc
from engine.model import Model
from warmfleet.client import build_request

RETRY_FIRST_S = 0.1  # the agent's back-off after UNAVAILABLE, doubling
RETRY_CAP_S = 0.5  # low, so that the time to recover is the system's more than the client's
RETRYABLE = grpc.StatusCode.UNAVAILABLE.name


@dataclass(frozen=True)
class Script:
    """One agent's conversation: the messages sent at each turn and the reply expected."""

    agent: int
    turns: list[list[dict[str, str]]]
    expected: list[Expected]


def scripts(model: Model, num_agents: int, num_turns: int, max_tokens: int) -> list[Script]:
    """Every agent's conversation, its replies computed in-process (one batch per turn);
    each agent's turns are those an agent sends when every reply before was right."""
    history = [[{"role": "system", "content": f"You are coding agent {a}. You work on "
                 f"{TOPICS[a % len(TOPICS)]}. Answer in one short sentence."}]
               for a in range(num_agents)]  # fmt: skip
    turns: list[list[list[dict[str, str]]]] = [[] for _ in range(num_agents)]
    expected: list[list[Expected]] = [[] for _ in range(num_agents)]
    for t in range(num_turns):
        for a in range(num_agents):
            history[a].append({"role": "user", "content": user_turn(a, t)})
            turns[a].append(list(history[a]))
        params = SamplingParams(max_tokens=max_tokens)
        refs = references(model, {str(a): (history[a], params) for a in range(num_agents)})
        for a in range(num_agents):
            expected[a].append(refs[str(a)])
            history[a].append({"role": "assistant", "content": refs[str(a)].text})
    return [Script(a, turns[a], expected[a]) for a in range(num_agents)]


@dataclass
class Load:
    """The agents' shared state: where to send, when to stop, every attempt made."""

    stub: inference_pb2_grpc.InferenceStub
    run_id: str
    max_tokens: int
    deadline_s: float
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    attempts: list[Attempt] = field(default_factory=list)
    num_turns: int = 0


async def agent(load: Load, script: Script) -> None:
    """Chat until `load.stop`: each conversation its own session, turn after turn."""
    conversation = 0
    while not load.stop.is_set():
        sid = f"{load.run_id}-a{script.agent}-c{conversation}"
        for t, messages in enumerate(script.turns):
            if load.stop.is_set():
                return
            if not await turn(load, sid, messages, script.expected[t]):
                break
        conversation += 1


async def turn(load: Load, sid: str, messages: list[dict[str, str]], expected: Expected) -> bool:
    """Send one turn until it ends other than UNAVAILABLE; whether it completed."""
    request = build_request(sid, messages=messages, max_tokens=load.max_tokens)
    delay_s = RETRY_FIRST_S
    load.num_turns += 1
    number = load.num_turns
    while True:
        attempt = await generate(load.stub, request, deadline_s=load.deadline_s)
        attempt.turn = number
        check(attempt, expected)
        load.attempts.append(attempt)
        if attempt.code != RETRYABLE or load.stop.is_set():
            return attempt.code == OK
        await asyncio.sleep(delay_s)
        delay_s = min(2 * delay_s, RETRY_CAP_S)
