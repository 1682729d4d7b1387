"""The gateway's Prometheus metrics (docs/metrics.md): each request as its client saw it
(time to first token, the gaps between tokens, end to end, tokens and cache reuse, the
status it ended with), and the fleet's queues and workers from the latest snapshot the
dashboard's sampler read (so a scrape costs no Redis call)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from broker.fleet import Snapshot
from broker.messages import Completion, Job
from common import prom  # noqa: F401  (its settings apply to every registry)

# seconds; a small model on a CPU answers in milliseconds, a long queue takes minutes
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                   160.0, 320.0, 640.0)  # fmt: skip
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3,
                     0.5, 0.75, 1.0, 2.5, 5.0)  # fmt: skip


class GatewayMetrics:
    def __init__(self, fleet: Callable[[], Snapshot | None] = lambda: None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.finished = Counter(
            "warmfleet_requests_finished", "Requests that ended with a completion",
            ["tenant", "priority", "finish_reason", "kv_source"], registry=r,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "warmfleet_prompt_tokens", "Prompt tokens of finished requests", ["tenant"], registry=r
        )
        self.cached_tokens = Counter(
            "warmfleet_cached_prompt_tokens", "Prompt tokens whose KV was reused",
            ["tenant", "kv_source"], registry=r,
        )  # fmt: skip
        self.generation_tokens = Counter(
            "warmfleet_generation_tokens", "Tokens generated for finished requests", ["tenant"],
            registry=r,
        )  # fmt: skip
        self.ttft = Histogram(
            "warmfleet_time_to_first_token_seconds", "From acceptance to the first token",
            ["priority"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.token_gap = Histogram(
            "warmfleet_inter_token_latency_seconds", "Between a request's tokens",
            ["priority"], buckets=TOKEN_GAP_BUCKETS, registry=r,
        )  # fmt: skip
        self.e2e = Histogram(
            "warmfleet_e2e_request_latency_seconds", "From acceptance to completion",
            ["priority", "finish_reason"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.queue_time = Histogram(
            "warmfleet_request_queue_time_seconds", "From acceptance until a worker started it",
            ["priority"], buckets=LATENCY_BUCKETS, registry=r,
        )  # fmt: skip
        self.responses = Counter(
            "warmfleet_responses", "Calls answered, by face and status", ["api", "code"],
            registry=r,
        )  # fmt: skip
        how = ["tenant", "api", "found", "placed"]
        self.sessions = Counter(
            "warmfleet_request_sessions", "Requests by how they found a session", how, registry=r
        )
        r.register(FleetCollector(fleet))
        self.unflushed: Tally[str] = Tally()  # responses not yet added to the counts in Redis

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def first_token(self, job: Job, now: float) -> None:
        self.ttft.labels(job.priority).observe(max(0.0, now - job.accepted_at))

    def tokens(self, job: Job, num_tokens: int, gap_s: float) -> None:
        """`num_tokens` arrived `gap_s` after the request's previous ones: as many gaps of
        gap_s / num_tokens (tokens come in chunks when the gateway falls behind)."""
        if num_tokens > 0:
            per_token = gap_s / num_tokens
            observe = self.token_gap.labels(job.priority).observe
            for _ in range(num_tokens):
                observe(per_token)

    def completed(self, job: Job, c: Completion, now: float) -> None:
        u, tenant = c.usage, job.tenant
        self.finished.labels(tenant, job.priority, c.finish_reason, c.kv_source).inc()
        self.prompt_tokens.labels(tenant).inc(u.prompt_tokens)
        self.cached_tokens.labels(tenant, c.kv_source).inc(u.cached_tokens)
        self.generation_tokens.labels(tenant).inc(u.completion_tokens)
        self.e2e.labels(job.priority, c.finish_reason).observe(max(0.0, now - job.accepted_at))
        self.queue_time.labels(job.priority).observe(max(0.0, c.timings.queue_wait_s))

    def responded(self, api: str, code: str) -> None:
        """A call answered (api: grpc or http; code: a gRPC status name or HTTP status)."""
        self.responses.labels(api, code).inc()
        self.unflushed[f"{api} {code}"] += 1


class FleetCollector(Collector):
    """Queues and workers as the latest fleet snapshot (broker/fleet.py) says."""

    def __init__(self, fleet: Callable[[], Snapshot | None]) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        snap = self.fleet()
        if snap is None:
            return
        q = snap["queues"]
        running = GaugeMetricFamily(
            "warmfleet_requests_running", "Requests taken by a worker and not yet ended",
            labels=["tenant"],
        )  # fmt: skip
        for tenant, n in q["running"].items():
            running.add_metric([tenant], n)
        waiting = GaugeMetricFamily(
            "warmfleet_requests_waiting", "Requests in the fair queues",
            labels=["priority", "tenant"],
        )  # fmt: skip
        oldest = GaugeMetricFamily(
            "warmfleet_queue_oldest_wait_seconds", "How long the queue's head has waited",
            labels=["priority", "tenant"],
        )  # fmt: skip
        for lane in q["lanes"]:
            waiting.add_metric([lane["priority"], lane["tenant"]], lane["depth"])
            if lane["oldest_age_s"] is not None:
                oldest.add_metric([lane["priority"], lane["tenant"]], lane["oldest_age_s"])
        workers = GaugeMetricFamily("warmfleet_workers", "Workers by state", labels=["state"])
        states = Tally(w["state"] for w in snap["workers"])
        for state in ("alive", "draining", "gone"):
            workers.add_metric([state], states[state])
        yield running
        yield waiting
        yield oldest
        yield CounterMetricFamily(
            "warmfleet_queue_admitted", "Requests admitted, all gateways", value=q["admitted"]
        )
        yield CounterMetricFamily(
            "warmfleet_queue_refused", "Requests refused: a queue was full", value=q["refused"]
        )
        yield workers
