"""/metrics of every part after a known workload on the shared two-worker cluster (real
Redis, gRPC and HTTP, the default model): each text parses with prometheus_client's own
parser, and the counters moved by exactly the requests, tokens and reused tokens the
replies report; every finished request was observed by the latency histograms; the
kvstore counted the one spill and the one restore, and its gauges say what GetUsage says."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
import httpx
import pytest
import redis as redis_lib

from broker import keys
from common.v1 import inference_pb2 as pb
from tests.cluster_helpers import settle, wait_for
from tests.metrics_scrape import Samples, scrape, total
from warmfleet.client import Client, KVStoreClient
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow
PARTS = ["gateway", "kvstore", "w0", "w1"]
LATENCIES = ["warmfleet_time_to_first_token_seconds", "warmfleet_e2e_request_latency_seconds",
             "warmfleet_request_queue_time_seconds"]  # fmt: skip


@dataclass
class Workload:
    before: dict[str, Samples]
    after: dict[str, Samples]
    replies: list[pb.Completion]  # the gRPC ones
    http_usage: dict[str, int]  # the HTTP one's

    def moved(self, part: str, name: str, **labels: str) -> float:
        return total(self.after[part], name, **labels) - total(self.before[part], name, **labels)


@pytest.fixture(scope="module")
def w(default_cluster: Cluster) -> Iterator[Workload]:
    """Two turns of a session, a request without one, a refused one, the session evicted
    and resumed from disk, one HTTP completion; every part scraped before and after."""
    cluster, sid = default_cluster, f"m-{uuid.uuid4().hex[:8]}"
    r = redis_lib.Redis.from_url(cluster.redis_url, decode_responses=True)
    with KVStoreClient(cluster.kvstore_target) as kv, Client(cluster.target, timeout_s=180) as c:
        settle(r, kv)
        admitted_so_far = int(r.hget(keys.STATS, "admitted") or 0)
        wait_for(  # earlier tests' requests must be in the gateway's look at the fleet
            lambda: total(scrape(cluster, "gateway"), "warmfleet_queue_admitted_total")
            == admitted_so_far, "the gateway's look at the fleet to catch up",
        )  # fmt: skip
        before = {part: scrape(cluster, part) for part in PARTS}
        chat = [{"role": "user", "content": "Count to three."}]
        first = c.complete(sid, messages=chat, max_tokens=6, ignore_eos=True)
        chat += [{"role": "assistant", "content": first.text},
                 {"role": "user", "content": "And to four?"}]  # fmt: skip
        replies = [first.completion]
        replies.append(c.complete(sid, messages=chat, max_tokens=5, ignore_eos=True).completion)
        replies.append(c.complete("", prompt="Hi", max_tokens=3, ignore_eos=True).completion)
        with pytest.raises(grpc.RpcError) as refused:
            c.complete("", prompt="Hi", max_tokens=0)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert kv.evict(sid) == pb.TIER_SPILLING
        settle(r, kv)
        replies.append(c.complete(sid, messages=chat, max_tokens=2, ignore_eos=True).completion)
        http = httpx.post(f"{cluster.http_url}/v1/completions", timeout=120,
                          json={"prompt": "Hi", "max_tokens": 2})  # fmt: skip
        assert http.status_code == 200
        settle(r, kv)
        admitted = total(before["gateway"], "warmfleet_queue_admitted_total") + 5
        wait_for(  # the fleet's figures are the gateway's look of up to a second ago
            lambda: total(scrape(cluster, "gateway"), "warmfleet_queue_admitted_total")
            >= admitted, "the gateway's next look at the fleet",
        )  # fmt: skip
        after = {part: scrape(cluster, part) for part in PARTS}
    r.close()
    yield Workload(before, after, replies, http.json()["usage"])


def test_the_gateway_counts_the_requests_and_tokens_the_replies_report(w: Workload) -> None:
    usage, n = [c.usage for c in w.replies], len(w.replies) + 1  # and the HTTP one
    prompt = sum(u.prompt_tokens for u in usage) + w.http_usage["prompt_tokens"]
    generated = sum(u.completion_tokens for u in usage) + w.http_usage["completion_tokens"]
    cached = sum(u.cached_tokens for u in usage)
    first, warm, plain, back = (c.kv_source for c in w.replies)
    assert first in (pb.KV_SOURCE_COLD, pb.KV_SOURCE_PREFIX)  # other sessions' template blocks
    assert (warm, plain, back) == (pb.KV_SOURCE_WARM, pb.KV_SOURCE_COLD, pb.KV_SOURCE_DISK)
    assert cached > 0 and generated == 6 + 5 + 3 + 2 + 2
    assert w.moved("gateway", "warmfleet_requests_finished_total") == n
    assert w.moved("gateway", "warmfleet_requests_finished_total", kv_source="warm") == 1
    assert w.moved("gateway", "warmfleet_requests_finished_total", kv_source="disk") == 1
    assert w.moved("gateway", "warmfleet_prompt_tokens_total", tenant="local") == prompt
    assert w.moved("gateway", "warmfleet_generation_tokens_total", tenant="local") == generated
    assert w.moved("gateway", "warmfleet_cached_prompt_tokens_total") == cached
    assert w.moved("gateway", "warmfleet_queue_admitted_total") == n
    ok = w.moved("gateway", "warmfleet_responses_total", api="grpc", code="OK")
    refused = w.moved("gateway", "warmfleet_responses_total", api="grpc", code="INVALID_ARGUMENT")
    assert (ok, refused) == (len(w.replies), 1)
    assert w.moved("gateway", "warmfleet_responses_total", api="http", code="200") == 1
    assert total(w.after["gateway"], "warmfleet_workers", state="alive") == 2


def test_every_finished_request_is_in_the_latency_histograms(w: Workload) -> None:
    n = len(w.replies) + 1
    for name in LATENCIES:
        assert w.moved("gateway", f"{name}_count") == n, name
        assert w.moved("gateway", f"{name}_bucket", le="+Inf") == n, name
        assert w.moved("gateway", f"{name}_sum") > 0, name
    assert w.moved("gateway", "warmfleet_inter_token_latency_seconds_count") > 0


def test_the_workers_count_the_tokens_they_sampled_and_their_steps(w: Workload) -> None:
    generated = sum(c.usage.completion_tokens for c in w.replies)
    generated += w.http_usage["completion_tokens"]
    workers = ["w0", "w1"]
    assert sum(w.moved(x, "warmfleet_worker_generation_tokens_total") for x in workers) == generated
    assert sum(w.moved(x, "warmfleet_worker_step_seconds_count") for x in workers) >= 6
    for x in workers:
        assert total(w.after[x], "warmfleet_worker_batch_slots", worker=x) == 32
        held = total(w.after[x], "warmfleet_kv_blocks_held")
        capacity = total(w.after[x], "warmfleet_kv_blocks_capacity")
        assert total(w.after[x], "warmfleet_kv_cache_usage_ratio") == pytest.approx(held / capacity)
        # float16 by default: 30 layers x (192 keys + 192 values) x 2 bytes
        assert total(w.after[x], "warmfleet_kv_bytes_per_token", worker=x) == 30 * 384 * 2


def test_the_kvstore_counts_the_spill_and_the_restore(
    w: Workload, default_cluster: Cluster
) -> None:
    assert w.moved("kvstore", "warmfleet_kvstore_spills_total") == 1
    assert w.moved("kvstore", "warmfleet_kvstore_restores_total") == 1
    assert w.moved("kvstore", "warmfleet_kvstore_evictions_ordered_total") == 1
    with KVStoreClient(default_cluster.kvstore_target) as kv:
        usage = kv.usage()
    now = scrape(default_cluster, "kvstore")  # nothing runs: both say the same
    for tier in ("hot", "warm", "disk", "gone"):
        assert total(now, "warmfleet_kvstore_sessions", tier=tier) == getattr(usage.tiers, tier)
    assert total(now, "warmfleet_kvstore_disk_bytes") == usage.disk.used_bytes
    for worker in usage.workers:
        warm = total(now, "warmfleet_kvstore_warm_bytes", worker=worker.worker_id)
        assert warm == worker.warm_bytes
