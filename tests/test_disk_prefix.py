"""A prefix that only sessions on disk hold is read from the host's block files by a worker
whose pool never computed it (real Redis, the launcher, one worker restarted with an empty
pool, the real model, gRPC): the fleet's prefix index names the session on disk, the job
the prefix's length, and the worker reads those blocks (kv_source DISK) and answers with the
tokens a cold start gives."""

from __future__ import annotations

import pytest

from bench.agent_prompts import system_prompts
from bench.disk_prefix import wait_on_disk
from bench.shared_prefix import worker_of
from common.v1 import inference_pb2 as pb
from engine.model import Model
from tests.cluster_fixtures import one_worker_cluster  # noqa: F401
from tests.cluster_helpers import BLOCK_TOKENS, common_prefix, prompt_ids, reference
from warmfleet.client import Client, KVStoreClient
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
MAX_TOKENS = 6


def test_a_prefix_only_sessions_on_disk_hold_is_read_from_their_block_files(
    cluster: Cluster, model: Model
) -> None:
    system = "[prefix on disk]\n" + system_prompts(6, 600)[5]
    holder = [{"role": "system", "content": system}, {"role": "user", "content": "Begin."}]
    newcomer = [holder[0], {"role": "user", "content": "List the open tasks, please."}]
    shared = common_prefix(prompt_ids(model, holder), prompt_ids(model, newcomer))
    assert shared > 500
    options = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
    with Client(cluster.target, timeout_s=300) as client:
        client.complete("disk-holder", messages=holder, **options)
        assert worker_of(client, "disk-holder") == "w0"  # the kvstore applied its HOT event
        with KVStoreClient(cluster.kvstore_target) as kv:
            assert kv.evict("disk-holder") == pb.TIER_SPILLING
        wait_on_disk(client, "disk-holder")
        assert cluster.terminate("w0") == 0  # it drains and exits...
        cluster.restart("w0")  # ...and starts again: no block of the prompt in its pool
        reply = client.complete("disk-newcomer", messages=newcomer, **options)
    c = reply.completion
    assert c.kv_source == pb.KV_SOURCE_DISK
    whole = BLOCK_TOKENS * (shared // BLOCK_TOKENS)
    assert whole - BLOCK_TOKENS <= c.usage.cached_tokens <= whole
    assert reply.token_ids == reference(model, newcomer, MAX_TOKENS)[1]
