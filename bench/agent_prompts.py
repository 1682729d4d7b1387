"""The multi-agent workload's prompts: each agent its own system prompt of a given size
(counted with the default model's tokenizer and chat template), and user turns of about 50
tokens. Shared by bench.multi_agent (gRPC) and bench.agents (OpenAI API)."""

from __future__ import annotations

from engine.text.chat import render_chat
from engine.text.gguf_file import open_gguf, read_metadata
from engine.text.tokenizer import Tokenizer
from warmfleet.models import resolve_model

TOPICS = ["a parser", "a cache", "a scheduler", "a file system", "a compiler", "a database",
          "a network stack", "a renderer", "a shell", "an allocator"]  # fmt: skip


def system_prompt(tokenizer: Tokenizer, template: str, agent: int, target: int) -> str:
    """An agent's own instructions, about `target` tokens once rendered."""
    topic = TOPICS[agent % len(TOPICS)]
    lines = [f"You are coding agent {agent}. You work on {topic}. Rules follow."]
    i = 0
    while True:
        rule = (
            f"Rule {i}: keep function f{(i * 13 + agent) % 97} under {(i * 7) % 50 + 10} lines "
            f"and log event e{(i * 31 + agent * 7) % 211} at level {i % 5}."
        )
        text = "\n".join([*lines, rule])
        size = len(tokenizer.encode(render_chat(template, [{"role": "system", "content": text}])))
        if size > target:
            return "\n".join(lines)
        lines.append(rule)
        i += 1


def system_prompts(num_agents: int, target_tokens: int) -> list[str]:
    tokenizer = Tokenizer.from_metadata(read_metadata(open_gguf(resolve_model(None))))
    assert tokenizer.chat_template is not None
    return [system_prompt(tokenizer, tokenizer.chat_template, i, target_tokens)
            for i in range(num_agents)]  # fmt: skip


def user_turn(agent: int, turn: int) -> str:
    """About 50 tokens: the next step of the agent's task."""
    topic = TOPICS[agent % len(TOPICS)]
    return (
        f"Step {turn + 1}: the tests of {topic} failed on case {turn * 7 + agent}. Read the "
        f"failing assertion, find the function that computes the wrong value, explain in one "
        f"sentence why it is wrong, and propose the smallest change that fixes it without "
        f"breaking the other {turn + 3} cases."
    )
