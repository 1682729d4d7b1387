"""The conversation of the KV tiers benchmark: turns against a running cluster, and one repeat
of resuming a session warm, from disk and recomputed."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from bench.kv_tiers_disk import drop_page_cache, resident_bytes
from common.v1 import inference_pb2 as pb
from engine.text.chat import render_chat
from engine.text.tokenizer import Tokenizer
from warmfleet.client import Client, collect

MAX_TOKENS = 4
SETTLE_TIMEOUT_S = 120.0
TEMPLATE_PREFIX_TOKENS = 64  # the chat template's default system prompt, in whole blocks
QUESTIONS = ("Summarize the log in one word.", "And in two words?", "Now in three words?")
SOURCE_NAMES: dict[int, str] = {
    pb.KV_SOURCE_COLD: "cold",
    pb.KV_SOURCE_WARM: "warm",
    pb.KV_SOURCE_DISK: "disk",
    pb.KV_SOURCE_PREFIX: "prefix",
}
Messages = list[dict[str, str]]
Encode = Callable[[Messages], list[int]]  # messages rendered with the chat template, tokenized


def log(message: str) -> None:
    """Progress, to stderr (the tables go to stdout)."""
    print(message, file=sys.stderr, flush=True)


@dataclass(slots=True)
class Turn:
    """One completion as the benchmark sees it."""

    ttft_s: float  # the completion's time to first token (from the gateway's acceptance)
    client_ttft_s: float  # seen by this client: call start to first chunk
    source: int
    prompt_tokens: int
    cached_tokens: int
    text: str
    token_ids: list[int]


def long_text(tokenizer: Tokenizer, template: str, target: int) -> str:
    """A varied log of made-up build notes whose chat prompt (with the three short questions
    and short replies of the later turns) takes at most `target` tokens."""
    parts = []
    for i in range(10_000):
        parts.append(
            f"Step {i}: module m{(i * 37) % 211} built in {(i * 7919) % 997} ms with "
            f"{(i * 31) % 17} warnings; cache key {(i * 2654435761) % 65536:04x}."
        )
    padding = [
        {"role": "assistant", "content": "word " * MAX_TOKENS},
        {"role": "user", "content": QUESTIONS[1]},
        {"role": "assistant", "content": "word " * MAX_TOKENS},
        {"role": "user", "content": QUESTIONS[2]},
    ]

    def size(n: int) -> int:
        content = " ".join(parts[:n]) + "\n\n" + QUESTIONS[0]
        messages = [{"role": "user", "content": content}, *padding]
        return len(tokenizer.encode(render_chat(template, messages)))

    lo, hi = 1, len(parts)
    while lo < hi:  # the most sentences that fit
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if size(mid) <= target else (lo, mid - 1)
    return " ".join(parts[:lo])


def turn(
    client: Client,
    session_id: str,
    *,
    messages: Messages | None = None,
    token_ids: list[int] | None = None,
) -> Turn:
    """Send `messages` or `token_ids` in `session_id` (greedy, MAX_TOKENS tokens) and time the
    reply."""
    first: list[float] = []
    t = time.perf_counter()
    call = client.stream(
        session_id, messages=messages, token_ids=token_ids, max_tokens=MAX_TOKENS, temperature=0.0
    )
    try:
        reply = collect(call, on_chunk=lambda _: first.append(time.perf_counter()))
    finally:
        call.cancel()
    c = reply.completion
    return Turn(
        c.timings.time_to_first_token_s,
        (first[0] if first else time.perf_counter()) - t,
        c.kv_source,
        c.usage.prompt_tokens,
        c.usage.cached_tokens,
        reply.text,
        reply.token_ids,
    )


def send(
    client: Client, session_id: str, messages: Messages, encode: Encode | None, replies: list[Turn]
) -> Turn:
    """A turn of the conversation `messages`. Without `encode`, sent as chat messages: the last
    user message and the template's markup around it are the turn's new tokens. With it (the
    continuation form), sent as token ids: the first message rendered, then the tokens of
    `replies`, the earlier turns' replies: the session so far and nothing new, so the turn
    computes at most the last reply's last token before it samples, whatever tier held the KV."""
    if encode is None:
        return turn(client, session_id, messages=messages)
    return turn(client, session_id, token_ids=continuation_ids(messages, encode, replies))


def continuation_ids(messages: Messages, encode: Encode, replies: list[Turn]) -> list[int]:
    """The continuation form's token ids: `messages`' first message as `encode` renders it,
    then every token of `replies`."""
    return encode(messages[:1]) + [t for r in replies for t in r.token_ids]


def wait_for(client: Client, what: str, done: Callable[[list[pb.Session]], bool]) -> None:
    """Poll the session list until `done` holds; RuntimeError after SETTLE_TIMEOUT_S."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while not done(client.list_sessions()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def settle(client: Client) -> None:
    """Wait until the spill writes in flight are done (none spilling: the kvstore marks a
    session so when it orders the write, and a write beside the next turn slows it) and at
    most one session is left in memory."""
    wait_for(
        client,
        "spills to finish",
        lambda ss: (
            not any(s.tier == pb.TIER_SPILLING for s in ss)
            and sum(s.tier in (pb.TIER_WARM, pb.TIER_HOT) for s in ss) <= 1
        ),
    )


def expect(t: Turn, source: int, what: str) -> None:
    """Assert that `t`'s KV came from `source`, and log the turn."""
    got = SOURCE_NAMES.get(t.source, str(t.source))
    assert t.source == source, f"{what}: kv_source {got}, expected {SOURCE_NAMES[source]}"
    log(
        f"  {what}: {got}, {t.prompt_tokens} prompt tokens ({t.cached_tokens} cached), "
        f"ttft {t.ttft_s * 1e3:.1f} ms (client {t.client_ttft_s * 1e3:.1f} ms)"
    )


def expect_fresh(t: Turn, what: str) -> None:
    """A prompt computed anew: COLD, or PREFIX with no more than the chat template's own
    opening (its default system prompt, shared by every conversation of the tenant)."""
    if t.source == pb.KV_SOURCE_PREFIX and t.cached_tokens <= TEMPLATE_PREFIX_TOKENS:
        t = replace(t, source=pb.KV_SOURCE_COLD)
    expect(t, pb.KV_SOURCE_COLD, what)


def push_out(client: Client, a: str, b: str, content: str, encode: Encode | None) -> None:
    """Run session `b` (its one message `content`, as large as `a`'s) until it has pushed
    session `a` out of the warm pool onto disk and the spill writes in flight are done."""
    log("  session B, same size, pushes A out of the warm pool")
    expect_fresh(send(client, b, [{"role": "user", "content": content}], encode, []), "B turn 1")
    wait_for(
        client,
        "session A on disk",
        lambda ss: any(s.session_id == a and s.tier == pb.TIER_DISK for s in ss),
    )
    settle(client)


def drop_spills(spill_dir: Path, methods: set[str], resident: list[int]) -> None:
    """Drop the spill files from the page cache; add the method to `methods` and the bytes
    still resident to `resident`."""
    files = sorted(spill_dir.glob("*.wfkv"))
    methods.add(drop_page_cache(files))
    res = resident_bytes(files)
    if res is not None:
        resident.append(res)
    log(f"  page cache of {len(files)} spill file(s) dropped; {res} bytes still resident")


def forget_blocks(
    client: Client, session_id: str, messages: Messages, encode: Encode | None
) -> None:
    """Make the worker's pool forget the blocks of the session on disk whose first turn was
    `messages` (released when it went to disk, they stay known by hash, and a resume takes
    them instead of reading its files): a session of that turn takes them as its prefix and
    is deleted, and DeleteSession forgets the blocks it alone held."""
    log("  a session of A's first turn takes A's blocks and is deleted: the pool forgets them")
    t = send(client, session_id, messages, encode, [])
    assert t.cached_tokens > TEMPLATE_PREFIX_TOKENS, f"{session_id} found no prefix of A's"
    client.delete_session(session_id)
    wait_for(client, f"{session_id} to go", lambda ss: all(s.session_id != session_id for s in ss))
    settle(client)


def run_repeat(
    client: Client,
    r: int,
    text: str,
    spill_dir: Path,
    encode: Encode | None,
    methods: set[str],
    resident: list[int],
    keep_blocks: bool = False,
) -> dict[str, Turn]:
    """Repeat `r`: session A resumed warm, then from disk once session B has pushed it out
    (its blocks first forgotten by the pool, unless `keep_blocks`), then recomputed under a
    new id C; each turn sent as `send` does with `encode`. Adds the page cache drop methods
    to `methods` and the spill bytes still resident after the drop to `resident`; deletes
    the sessions after."""
    a, b, c = f"kvt-{r}-a", f"kvt-{r}-b", f"kvt-{r}-c"
    # a repeat's text of its own: the blocks of an earlier repeat's deleted sessions stay
    # findable by their hash in the pool until it needs their room
    text = f"(repeat {r + 1}) {text}"
    m1: Messages = [{"role": "user", "content": f"{text}\n\n{QUESTIONS[0]}"}]
    log(f"repeat {r + 1}: session A, first turn (cold prefill)")
    t1 = send(client, a, m1, encode, [])
    expect_fresh(t1, "A turn 1")
    m2 = [*m1, {"role": "assistant", "content": t1.text}, {"role": "user", "content": QUESTIONS[1]}]
    warm = send(client, a, m2, encode, [t1])
    expect(warm, pb.KV_SOURCE_WARM, "A turn 2 (warm)")
    # B and C differ from A from their first word: they share none of A's blocks
    push_out(client, a, b, f"Session B. {text}\n\n{QUESTIONS[0]}", encode)
    if not keep_blocks:
        forget_blocks(client, f"kvt-{r}-a-forget", m1, encode)
    drop_spills(spill_dir, methods, resident)
    m3 = [
        *m2,
        {"role": "assistant", "content": warm.text},
        {"role": "user", "content": QUESTIONS[2]},
    ]
    disk = send(client, a, m3, encode, [t1, warm])
    expect(disk, pb.KV_SOURCE_DISK, "A turn 3 (disk)")
    settle(client)  # B goes to disk now
    m_c = [{"role": "user", "content": f"Session C. {m3[0]['content']}"}, *m3[1:]]
    cold = send(client, c, m_c, encode, [t1, warm])
    expect_fresh(cold, "C = A turn 3 under a new id (recompute)")
    if cold.token_ids != disk.token_ids:
        log(f"  NOTE: recomputed tokens {cold.token_ids} differ from disk's {disk.token_ids}")
    for s in (a, b, c):  # leaves an empty pool and no files for the next repeat
        client.delete_session(s)
    wait_for(client, "the sessions to go", lambda ss: not ss)
    return {"warm": warm, "disk": disk, "recompute": cold}
