"""A worker's Prometheus metrics (docs/metrics.md), served on its own `--metrics-port`:
its batch against its slots, step times, tokens, its KV pool against its budget, its spill
files. Everything but the step-time histogram is read from the worker's state when
scraped (plain counters and lengths: safe to read from the server's thread)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common import prom
from common.prom import sample
from worker.state import WorkerState

STEP_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0,
                5.0)  # fmt: skip
SPILL_COUNTERS = {  # SpillStats field: metric name
    "num_spilled": "warmfleet_worker_spills",
    "num_restored": "warmfleet_worker_restores",
    "num_rejected": "warmfleet_worker_rejected_files",
    "num_failed": "warmfleet_worker_failed_writes",
    "num_converted": "warmfleet_worker_converted_files",
    "num_shared": "warmfleet_worker_shared_prefixes_written",
    "num_shared_read": "warmfleet_worker_shared_prefixes_read",
}


class WorkerMetrics:
    def __init__(self, state: WorkerState) -> None:
        self.registry = CollectorRegistry()
        worker = state.config.worker_id
        self.step_time = Histogram(
            "warmfleet_worker_step_seconds", "One engine step's forward pass", ["worker"],
            buckets=STEP_BUCKETS, registry=self.registry,
        ).labels(worker)  # fmt: skip
        self.registry.register(WorkerCollector(state))

    def serve(self, host: str, port: int) -> int:
        return prom.serve(self.registry, host, port)


class WorkerCollector(Collector):
    def __init__(self, state: WorkerState) -> None:
        self.s = state

    def collect(self) -> Iterator[Metric]:
        s, engine = self.s, self.s.engine
        worker = [s.config.worker_id]
        paused = len(engine.paused)
        pool = engine.pool
        size, held = pool.alloc.num_blocks, pool.alloc.num_held
        gauges = [
            ("warmfleet_worker_requests_running", "Requests in its batch",
             len(s.inflight) - paused),
            ("warmfleet_worker_requests_paused", "Requests preempted by interactive ones", paused),
            ("warmfleet_worker_batch_slots", "Sequences decoded together at most",
             engine.config.max_running),
            ("warmfleet_worker_sessions", "Idle sessions in its KV pool", len(engine.sessions)),
            ("warmfleet_kv_pool_bytes", "Idle sessions' KV in its pool (shared blocks once)",
             engine.sessions.nbytes),
            ("warmfleet_kv_warm_budget_bytes", "Its warm budget", s.config.warm_budget_bytes),
            ("warmfleet_kv_bytes_per_token", "KV bytes a token takes, all layers (--kv-dtype)",
             engine.model.bytes_per_token),
            ("warmfleet_kv_blocks_held", "KV blocks in use", held),
            ("warmfleet_kv_blocks_capacity", "KV blocks in its pool", size),
            ("warmfleet_kv_cache_usage_ratio", "KV blocks held / capacity",
             held / size if size else 0.0),
            ("warmfleet_worker_weight_bytes", "The model's weights in memory",
             engine.model.weight_bytes),
        ]  # fmt: skip
        for name, doc, value in gauges:
            yield sample(GaugeMetricFamily(name, doc, labels=["worker"]), worker, value)
        counters = [
            ("warmfleet_worker_generation_tokens", "Tokens sampled",
             engine.stats.num_generated_tokens),
            ("warmfleet_worker_prompt_tokens", "Prompt tokens computed (reused ones are not)",
             engine.stats.num_prefill_tokens),
        ]  # fmt: skip
        if s.spiller is not None:
            spilled = asdict(s.spiller.stats)
            counters += [(name, "Its spill files: " + field.removeprefix("num_"), spilled[field])
                         for field, name in SPILL_COUNTERS.items()]  # fmt: skip
        for name, doc, value in counters:
            yield sample(CounterMetricFamily(name, doc, labels=["worker"]), worker, value)
