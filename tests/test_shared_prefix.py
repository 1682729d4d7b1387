"""A new session placed on a worker that does not hold its prompt's prefix reads that
prefix from the block files the holder writes to the host's spill directory, instead of
prefilling it (real Redis, two workers sharing one spill directory, the real model, gRPC):
the holder is too busy for prefix placement, the newcomer lands on the other worker, which
asks the holder for the blocks and starts on them (kv_source DISK), with the tokens a cold
start gives. Another tenant's identical prompt gets nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.agent_prompts import system_prompts
from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.conftest import KeyedCluster
from tests.test_prefix_placement import shared_tokens, worker_of
from warmfleet.client import Client, Reply

pytestmark = pytest.mark.slow
BLOCK = 16
# each of the holder's three requests runs this long at most (seconds here), stopped once the
# newcomer is answered
BUSY_TOKENS = 1000


def blocks_on_disk(kc: KeyedCluster) -> int:
    spill = kc.cluster.spill_dir
    assert spill is not None
    return sum(1 for _ in Path(spill, "blocks").glob("*.wfkb"))


def test_a_prefix_held_by_a_busy_worker_is_read_from_its_block_files(
    keyed_cluster: KeyedCluster, model: Model
) -> None:
    kc = keyed_cluster
    system = "[shared blocks]\n" + system_prompts(4, 600)[3]
    holder = [{"role": "system", "content": system}, {"role": "user", "content": "Begin."}]
    newcomer = [holder[0], {"role": "user", "content": "Review the last commit, please."}]
    shared = shared_tokens(model, holder, newcomer)
    assert shared > 500
    options: dict[str, Any] = {"max_tokens": 4, "temperature": 0.0}
    alice = Client(kc.cluster.target, api_key=kc.keys["alice"], timeout_s=300)
    bob = Client(kc.cluster.target, api_key=kc.keys["bob"], timeout_s=300)
    with alice, bob:
        alice.complete("shared-holder", messages=holder, **options)
        where = worker_of(kc, "alice", "shared-holder")
        # three more sessions with the same system prompt follow the holder's prefix onto
        # its worker, until it runs PREFIX_SLACK more requests than the other one
        long: dict[str, Any] = {"max_tokens": BUSY_TOKENS, "ignore_eos": True, "temperature": 0.0}
        busy = []
        for i in range(3):
            busy.append(alice.stream(f"shared-busy-{i}", messages=holder, **long))
            assert next(iter(busy[-1])).HasField("chunk")  # running
            assert worker_of(kc, "alice", f"shared-busy-{i}") == where
        try:
            before = blocks_on_disk(kc)
            reply = alice.complete("shared-newcomer", messages=newcomer, **options)
            c = reply.completion
            assert c.worker_id != where  # the holder was too busy
            assert c.kv_source == pb.KV_SOURCE_DISK
            whole = BLOCK * (shared // BLOCK)
            assert whole - BLOCK <= c.usage.cached_tokens <= whole
            assert blocks_on_disk(kc) - before >= c.usage.cached_tokens // BLOCK  # the holder's
            cold: Reply = bob.complete("shared-cold", messages=newcomer, **options)
            assert cold.completion.usage.cached_tokens == 0  # not alice's blocks
            assert cold.token_ids == reply.token_ids
        finally:
            for b in busy:
                b.cancel()
