"""Small helpers for the parts' Prometheus metrics (each part builds its own registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, disable_created_metrics, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

Family = GaugeMetricFamily | CounterMetricFamily
disable_created_metrics()  # no `_created` series beside every counter: noise for our users


def sample(family: Family, labels: list[str], value: float) -> Metric:
    """`family` with one sample added."""
    family.add_metric(labels, value)
    return family


def serve(registry: CollectorRegistry, host: str, port: int) -> int:
    """Serve `registry` at http://host:port/metrics on a thread of its own; the port
    (OSError if it cannot listen)."""
    server, _ = start_http_server(port, host, registry=registry)
    return int(server.server_port)
