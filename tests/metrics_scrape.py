"""Reading a part's /metrics in tests: its samples parsed with prometheus_client's own
parser, and the sum of a metric's samples over the labels given."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from warmfleet.launcher import Cluster

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(cluster: Cluster, part: str) -> Samples:
    response = httpx.get(cluster.metrics_url(part), timeout=30)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name`'s samples whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)
