"""The kvstore's Prometheus metrics (docs/metrics.md), served on its `--metrics-port`:
sessions per tier, each worker's warm bytes against its budget, the disk against its
budget, the counters. Built from the usage report (kvstore/usage.py) when scraped."""

from __future__ import annotations

from collections.abc import Iterator

import redis
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from common import prom
from common.prom import sample
from kvstore.service import KVStore


class KVStoreMetrics(Collector):
    def __init__(self, store: KVStore) -> None:
        self.store = store
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def serve(self, host: str, port: int) -> int:
        return prom.serve(self.registry, host, port)

    def collect(self) -> Iterator[Metric]:
        try:
            report = self.store.usage()
        except redis.RedisError:
            return  # Redis is down: a scrape with no samples says so (the part is up)
        tiers = GaugeMetricFamily(
            "warmfleet_kvstore_sessions", "Sessions per tier", labels=["tier"]
        )
        for field in report.tiers.DESCRIPTOR.fields:
            tiers.add_metric([field.name], getattr(report.tiers, field.name))
        yield tiers
        warm = GaugeMetricFamily(
            "warmfleet_kvstore_warm_bytes", "Each worker's idle sessions' bytes", labels=["worker"]
        )
        budget = GaugeMetricFamily(
            "warmfleet_kvstore_warm_budget_bytes", "Each worker's warm budget", labels=["worker"]
        )
        for w in report.workers:
            warm.add_metric([w.worker_id], w.warm_bytes)
            budget.add_metric([w.worker_id], w.warm_budget_bytes)
        yield warm
        yield budget
        disk = report.disk
        for name, doc, value in (
            ("warmfleet_kvstore_disk_bytes", "Spill files (shared blocks once)", disk.used_bytes),
            ("warmfleet_kvstore_disk_budget_bytes", "The disk budget (0: none)", disk.budget_bytes),
            ("warmfleet_kvstore_events_behind", "Session events not yet applied",
             report.events_behind),
        ):  # fmt: skip
            yield sample(GaugeMetricFamily(name, doc, labels=[]), [], value)
        for field in report.counters.DESCRIPTOR.fields:
            name = f"warmfleet_kvstore_{field.name}"
            doc = f"Since the index was created: {field.name.replace('_', ' ')}"
            value = getattr(report.counters, field.name)
            yield sample(CounterMetricFamily(name, doc, labels=[]), [], value)
