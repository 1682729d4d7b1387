"""deploy/'s Grafana dashboard and Prometheus config chart only the metrics docs/metrics.md
documents, in ways that fit their types and labels (files only; no cluster)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml  # PyYAML: a dependency of gguf

from warmfleet.commands.gateway import DEFAULT_HTTP_PORT

REPO = Path(__file__).resolve().parents[2]
METRICS_DOC = REPO / "docs" / "metrics.md"
PROMETHEUS = REPO / "deploy" / "prometheus.yml"
GRAFANA = REPO / "deploy" / "grafana"
DASHBOARD = GRAFANA / "warmfleet-dashboard.json"
DATASOURCE_REF = {"type": "prometheus", "uid": "${datasource}"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
SCRAPE_LABELS = {"job", "instance"}  # Prometheus adds these to every series it scrapes
JOB_PARTS = {"gateway": "gateway", "workers": "each worker", "kvstore": "kvstore"}

SERIES = re.compile(r"\b(warmfleet_[a-z0-9_]+)(\{[^}]*\})?")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
RATE = re.compile(r"\b(?:rate|irate|increase)\(\s*$")  # right before a series
AGGREGATION = re.compile(r"\b(?:sum|max|min|avg|count) by \(([^)]*)\) \(")
VARIABLE = re.compile(r"\$\{?(\w+)")


@dataclass(frozen=True)
class Documented:
    kind: str  # counter, gauge or histogram
    labels: frozenset[str]


def documented_metrics() -> dict[str, Documented]:
    """docs/metrics.md's tables: name -> type and labels. A row may name several metrics
    (`warmfleet_worker_spills_total`, `_restores_total`): the rest share the first's
    `warmfleet_<part>` prefix. A heading may give a label on each ("label `worker` on each")."""
    found: dict[str, Documented] = {}
    heading_labels: frozenset[str] = frozenset()
    columns: list[str] | None = None
    for line in METRICS_DOC.read_text().splitlines():
        if line.startswith("#"):
            heading_labels = frozenset(re.findall(r"label `(\w+)` on each", line))
        if not line.startswith("|"):
            columns = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if columns is None:
            columns = cells
            continue
        if "metric" not in columns or set(line.strip()) <= set("|-: "):
            continue
        row = dict(zip(columns, cells, strict=True))
        names = re.findall(r"`(\w+)`", row["metric"])
        prefix = "_".join(names[0].split("_")[:2])
        labels = heading_labels | {x.strip() for x in row.get("labels", "").split(",") if x.strip()}
        for name in names:
            full = name if name.startswith("warmfleet_") else prefix + name
            found[full] = Documented(row["type"], frozenset(labels))
    return found


DOCS = documented_metrics()


def histogram_of(series: str) -> str | None:
    """The documented histogram whose `_bucket`, `_sum` or `_count` series this is."""
    for suffix in HISTOGRAM_SUFFIXES:
        base = series.removesuffix(suffix)
        if base != series and base in DOCS and DOCS[base].kind == "histogram":
            return base
    return None


def series_labels(series: str) -> set[str]:
    """Labels a scraped series can carry: its documented ones, the scrape's, and `le`."""
    base = histogram_of(series) or series
    extra = {"le"} if series.endswith("_bucket") else set()
    return set(DOCS[base].labels) | SCRAPE_LABELS | extra


def closing_paren(text: str, open_at: int) -> int:
    depth = 0
    for i in range(open_at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise AssertionError(f"unbalanced parentheses: {text}")


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def all_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows and those folded inside a collapsed row included."""
    return [q for p in dash["panels"] for q in [p, *p.get("panels", [])]]


def panel_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    content = [p for p in all_panels(dash) if p["type"] != "row"]
    return [(p["title"], t["expr"]) for p in content for t in p["targets"]]


def variable_queries(dash: dict[str, Any]) -> list[tuple[str, str]]:
    variables = dash["templating"]["list"]
    return [(f"${v['name']}", v["query"]) for v in variables if v["type"] == "query"]


def test_the_doc_parser_finds_every_table_row_with_its_type_and_labels() -> None:
    assert len(DOCS) >= 40  # 44 when written: no table was skipped
    assert DOCS["warmfleet_worker_failed_writes_total"] == Documented(
        "counter", frozenset({"worker"})
    )
    assert DOCS["warmfleet_kv_cache_usage_ratio"] == Documented("gauge", frozenset({"worker"}))
    e2e = DOCS["warmfleet_e2e_request_latency_seconds"]
    assert e2e == Documented("histogram", frozenset({"priority", "finish_reason"}))
    assert DOCS["warmfleet_kvstore_disk_bytes"] == Documented("gauge", frozenset())
    assert histogram_of("warmfleet_worker_step_seconds_bucket") == "warmfleet_worker_step_seconds"
    assert histogram_of("warmfleet_kv_pool_bytes_count") is None


def test_dashboard_identity_and_layout() -> None:
    dash = load_dashboard()
    assert (dash["uid"], dash["refresh"]) == ("warmfleet", "5s")
    assert dash["time"] == {"from": "now-1h", "to": "now"}
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 36
    panels = all_panels(dash)
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["w"] > 0 and g["x"] + g["w"] <= 24, p["title"]
        xs, ys = range(g["x"], g["x"] + g["w"]), range(g["y"], g["y"] + g["h"])
        for cell in ((x, y) for x in xs for y in ys):
            assert cell not in cells, f"{p['title']} overlaps {cells[cell]}"
            cells[cell] = p["title"]


def test_every_query_reads_the_datasource_variable() -> None:
    dash = load_dashboard()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for p in all_panels(dash):
        if p["type"] == "row":
            continue
        assert p["datasource"] == DATASOURCE_REF, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["datasource"] == DATASOURCE_REF, p["title"]
    for v in variables.values():
        if v["type"] == "query":
            assert v["datasource"] == DATASOURCE_REF, v["name"]


def test_queries_use_only_defined_variables() -> None:
    dash = load_dashboard()
    defined = {v["name"] for v in dash["templating"]["list"]}
    for title, expr in panel_queries(dash) + variable_queries(dash):
        used = {n for n in VARIABLE.findall(expr) if not n.startswith("__")}
        assert used <= defined, f"{title}: {expr}"


def test_queries_name_only_documented_series_and_labels() -> None:
    dash = load_dashboard()
    for title, expr in panel_queries(dash) + variable_queries(dash):
        found = SERIES.findall(expr)
        assert found, f"{title}: no warmfleet metric in {expr}"
        for series, selector in found:
            known = series in DOCS and DOCS[series].kind != "histogram"
            assert known or histogram_of(series), f"{title}: {series} is no documented series"
            unknown = set(MATCHER.findall(selector)) - series_labels(series)
            assert not unknown, f"{title}: {series} has no label {unknown}"
    for name, query in variable_queries(dash):
        m = re.fullmatch(r"label_values\((\w+), (\w+)\)", query)
        assert m, f"{name}: {query}"
        series, label = m.groups()
        assert label in series_labels(series), f"{name}: {series} has no label {label}"


def test_counters_and_histogram_series_only_inside_rate_and_gauges_never() -> None:
    for title, expr in panel_queries(load_dashboard()):
        for m in SERIES.finditer(expr):
            series = m.group(1)
            if series not in DOCS and not histogram_of(series):
                continue  # the test of documented names says which
            cumulative = bool(histogram_of(series)) or DOCS[series].kind == "counter"
            in_rate = RATE.search(expr[: m.start()]) is not None
            where = "outside" if cumulative else "inside"
            assert in_rate == cumulative, f"{title}: {series} {where} rate() in {expr}"


def test_histogram_quantile_reads_buckets_by_le() -> None:
    checked = 0
    for title, expr in panel_queries(load_dashboard()):
        for m in re.finditer(r"histogram_quantile(\(([0-9.]+),)", expr):
            assert 0 < float(m.group(2)) < 1, f"{title}: {expr}"
            inner = expr[m.end() : closing_paren(expr, m.start(1))]
            series = [s for s, _ in SERIES.findall(inner)]
            assert series and all(s.endswith("_bucket") and histogram_of(s) for s in series), (
                f"{title}: histogram_quantile over {series}"
            )
            by = AGGREGATION.search(inner)
            assert by and "le" in {x.strip() for x in by.group(1).split(",")}, f"{title}: {expr}"
            checked += 1
    assert checked >= 12  # p50/p90/p99 of TTFT, inter-token, e2e and queue time


def test_aggregations_group_by_labels_their_series_carry() -> None:
    for title, expr in panel_queries(load_dashboard()):
        for m in AGGREGATION.finditer(expr):
            by = {x.strip() for x in m.group(1).split(",")}
            argument = expr[m.end() - 1 : closing_paren(expr, m.end() - 1) + 1]
            for series, _ in SERIES.findall(argument):
                if series not in DOCS and not histogram_of(series):
                    continue  # the test of documented names says which
                missing = by - series_labels(series)
                assert not missing, f"{title}: {series} has no label {missing} in {expr}"


def documented_paths() -> dict[str, str]:
    """docs/metrics.md's first table: part -> the path its metrics are served on."""
    paths = {}
    for line in METRICS_DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and (path := re.search(r"`(?:http://HOST:PORT)?(/\w+)", cells[1])):
            paths[cells[0]] = path.group(1)
    return paths


def local_variant() -> dict[str, Any]:
    """The config for `warmfleet up` kept in prometheus.yml's lines that start with "#| "."""
    lines = PROMETHEUS.read_text().splitlines()
    return yaml.safe_load("\n".join(x.removeprefix("#| ") for x in lines if x.startswith("#| ")))


def check_jobs(scrape_configs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    jobs = {j["job_name"]: j for j in scrape_configs}
    assert set(jobs) == set(JOB_PARTS)
    paths = documented_paths()
    for name, job in jobs.items():
        assert job["metrics_path"] == paths[JOB_PARTS[name]], name
    return jobs


def targets(job: dict[str, Any]) -> list[tuple[str, int]]:
    found = [t.rsplit(":", 1) for c in job.get("static_configs", []) for t in c["targets"]]
    return [(host, int(port)) for host, port in found]


def test_prometheus_scrapes_each_part_on_its_documented_path() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert config["global"]["scrape_interval"] == "5s"
    jobs = check_jobs(config["scrape_configs"])
    assert targets(jobs["gateway"]) == [("gateway", DEFAULT_HTTP_PORT)]
    assert targets(jobs["kvstore"]) == [("kvstore", 9100)]
    workers = targets(jobs["workers"])
    assert [h for h, _ in workers] == [f"worker-{i}" for i in range(len(workers))]
    ports = [p for _, p in workers] + [9100, DEFAULT_HTTP_PORT]
    assert len(workers) >= 2 and len(set(ports)) == len(ports)


def test_the_local_variant_parses_and_keeps_each_part_in_its_job() -> None:
    config = local_variant()
    assert config["global"]["scrape_interval"] == "5s"
    jobs = check_jobs(config["scrape_configs"])
    assert targets(jobs["gateway"]) == [("127.0.0.1", DEFAULT_HTTP_PORT)]
    discovered = {n: j for n, j in jobs.items() if "file_sd_configs" in j}
    kept = {
        n: [r["regex"] for r in j["relabel_configs"] if r["action"] == "keep"]
        for n, j in discovered.items()
    }
    assert kept == {"workers": ["worker"], "kvstore": ["kvstore"]}


def test_grafana_provisioning_serves_the_dashboard_the_variable_expects() -> None:
    sources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yaml").read_text())
    (source,) = sources["datasources"]
    dash = load_dashboard()
    variable = next(v for v in dash["templating"]["list"] if v["name"] == "datasource")
    assert source["type"] == variable["query"] and source["isDefault"]
    assert source["uid"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/warmfleet.yaml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
