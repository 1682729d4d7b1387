"""The session a request naming none continues, and the worker a new session goes to,
found by its prompt. Agents that send no session id (Claude Code without metadata, Cline,
Aider, OpenCode's default) resend the whole conversation each turn, so a turn's prompt
starts with the previous turn's.

Each request names its session by its prompt's head: the prompt but its last few tokens,
which the template's opening of the reply holds and the next turn may tokenize otherwise;
known by the chain hash (common/block_hash.py, rooted in the tenant) of its whole blocks,
and the head's length and the hash of its tokens past them. A request naming no session
continues the session whose head is the longest prefix of its prompt, else starts one of
its own. The hashes of some of its whole blocks up to the head mark the prompt's prefix
too (broker/prompt_heads.py), carried in the job to the worker that starts it, whose HOT
event has the kvstore index them under the session: a request whose session no worker
holds goes to the worker holding the session that last started on the longest marked
prefix of its prompt (broker/fair_queue.py: PREFIX PLACEMENT), where the pool shares those
blocks; when only a session on disk has one, the worker it lands on reads its blocks."""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, replace

from broker.gateway_broker import GatewayBroker
from broker.messages import Job
from broker.prompt_heads import mark_blocks
from common.block_hash import chain_hash, prefix_hashes, scope_hash

BLOCK_TOKENS = 16
MARGIN_TOKENS = 4  # a prompt's last tokens, left out of its head
ROOT = "session-head"  # what the chains are rooted in besides the tenant (not KV blocks)


@dataclass(frozen=True, slots=True)
class Found:
    session_id: str  # the request's session
    # the session a worker last started on the longest marked prefix of its prompt that a
    # worker holds in memory (else on disk), or ""
    holder: str
    how: str  # named (by the client), prompt (continued), new, or none (sessionless)
    holder_worker: str = ""  # the worker holding `holder` in memory; "" when on disk
    holder_tokens: int = 0  # how many leading tokens of the prompt `holder` sent
    marks: tuple[str, ...] = ()  # the prompt's prefix marks up to its head (hex)

    def placed(self, job: Job) -> Job:
        """The job in its session, naming the worker that holds its prompt's prefix (a
        worker of the same host placed it may read those blocks from disk:
        worker/shared_prefix.py; with no worker named, a prefix on disk, read where the
        host's spill directory has it), and the prefix marks its session will hold once a
        worker starts it (the kvstore indexes them from that worker's HOT event)."""
        return replace(
            job,
            session_id=self.session_id,
            prefix_from=self.holder_worker,
            prefix_tokens=self.holder_tokens,
            prefix_marks=self.marks,
        )


def prompt_hashes(tenant: str, ids: tuple[int, ...]) -> list[bytes]:
    """The chain hash of each whole block of the prompt, in order."""
    return prefix_hashes(scope_hash(ROOT, tenant), ids, BLOCK_TOKENS)


def head_length(num_tokens: int) -> int:
    """Tokens in a prompt's head: all but its last MARGIN_TOKENS."""
    return max(0, num_tokens - MARGIN_TOKENS)


def head_rest(hashes: list[bytes], ids: tuple[int, ...], blocks: int, length: int) -> str:
    """What a head of `length` tokens holds past its first `blocks` whole blocks ("length:"
    and the chain hash of those tokens after the blocks')."""
    return f"{length}:{chain_hash(hashes[blocks - 1], ids[blocks * BLOCK_TOKENS : length]).hex()}"


def continued(
    heads: list[tuple[int, str, str]], hashes: list[bytes], ids: tuple[int, ...]
) -> str | None:
    """The session whose head is the longest prefix of the prompt, among the heads found on
    its whole blocks."""
    best: tuple[int, str] | None = None
    for blocks, session_id, rest in heads:
        digits = rest.partition(":")[0]
        length = int(digits) if digits.isdigit() else len(ids) + 1
        if length > len(ids) or not 0 < blocks <= len(hashes) or (best and best[0] >= length):
            continue
        if head_rest(hashes, ids, blocks, length) == rest:
            best = (length, session_id)
    return best[1] if best else None


def marks_of(hashes: list[bytes]) -> list[bytes]:
    """The prefix marks among a prompt's block hashes."""
    return [hashes[n - 1] for n in mark_blocks(len(hashes))]


async def session_for(
    broker: GatewayBroker, tenant: str, session_id: str, ids: tuple[int, ...], find: bool = True
) -> Found:
    """The request's session: `session_id` when it names one, else the session its prompt
    continues, else a new one ("s-" and 32 hex digits); named by this prompt's head from
    now on. And the holder of its prompt's longest marked prefix. Without `find` (gRPC,
    where naming none asks for no session) a request naming none stays without one."""
    hashes = await asyncio.to_thread(prompt_hashes, tenant, ids)  # ~5 us a block
    looking = find and not session_id  # for the session it continues, beside the holder
    heads, holder = await broker.find_by_prompt(tenant, hashes if looking else [], marks_of(hashes))
    held = mark_blocks(len(hashes))[holder.mark - 1] * BLOCK_TOKENS if holder.mark else 0
    how = "named"
    if not (session_id or find):
        return Found("", holder.session_id, "none", holder.worker, held)
    if looking:
        earlier = continued(heads, hashes, ids)
        how = "prompt" if earlier else "new"
        session_id = earlier or f"s-{uuid.uuid4().hex}"
    length = head_length(len(ids))
    blocks = length // BLOCK_TOKENS
    if blocks:
        rest = head_rest(hashes, ids, blocks, length)
        await broker.remember_head(tenant, session_id, hashes[blocks - 1], rest)
    marks = tuple(m.hex() for m in marks_of(hashes[:blocks]))
    return Found(session_id, holder.session_id, how, holder.worker, held, marks)
