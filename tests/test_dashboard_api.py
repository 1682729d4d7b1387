"""The dashboard's data and actions over HTTP against the keyed cluster (real Redis, two
workers, the default model): only admin keys see the fleet or act on it; an update names
both workers and the sessions; evicting a session through it writes the session to disk."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.cluster_helpers import wait_for
from tests.conftest import KeyedCluster
from warmfleet.client import Client

pytestmark = pytest.mark.slow


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def first_update(keyed: KeyedCluster) -> dict[str, Any]:
    """The first message of the dashboard's event stream (an admin's)."""
    url = f"{keyed.cluster.http_url}/dashboard/events"
    with httpx.stream("GET", url, headers=bearer(keyed.keys["ops"]), timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = r.iter_lines()
        assert next(lines) == "event: fleet"
        data = next(lines)
    assert data.startswith("data: ")
    update: dict[str, Any] = json.loads(data.removeprefix("data: "))
    return update


def tier_in_update(keyed: KeyedCluster, session_id: str) -> str | None:
    """The session's tier as the dashboard's update lists it (None: not listed)."""
    recent = first_update(keyed)["snapshot"]["sessions"]["recent"]
    return next((s["tier"] for s in recent if s["session_id"] == session_id), None)


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/dashboard/events"), ("POST", "/dashboard/api/evict"),
     ("POST", "/dashboard/api/drain")],
)  # fmt: skip
def test_the_dashboards_data_and_actions_need_an_admin_key(
    keyed_cluster: KeyedCluster, method: str, path: str
) -> None:
    url = f"{keyed_cluster.cluster.http_url}{path}"
    body = {"tenant": "alice", "session_id": "x", "worker_id": "w0"}
    missing = httpx.request(method, url, json=body, timeout=30)
    assert missing.status_code == 401
    agent = httpx.request(method, url, json=body, headers=bearer(keyed_cluster.keys["alice"]),
                          timeout=30)  # fmt: skip
    assert agent.status_code == 403
    assert "not an admin key" in agent.json()["error"]["message"]


def test_the_page_and_its_assets_are_served_by_the_package(keyed_cluster: KeyedCluster) -> None:
    base = keyed_cluster.cluster.http_url
    page = httpx.get(f"{base}/dashboard", timeout=30)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    scripts = [s for s in page.text.split('"') if s.startswith("/dashboard/static/")]
    assert scripts, "the page loads its assets from the package"
    for asset in scripts:
        assert httpx.get(f"{base}{asset}", timeout=30).status_code == 200, asset
    assert "http://" not in page.text and "https://" not in page.text  # works offline


def test_an_update_shows_the_workers_and_a_session_evicted_through_it_reaches_disk(
    keyed_cluster: KeyedCluster,
) -> None:
    cluster, keys = keyed_cluster.cluster, keyed_cluster.keys
    with Client(cluster.target, api_key=keys["bob"], timeout_s=120) as client:
        client.complete("dash-1", prompt="Hello there", max_tokens=4, ignore_eos=True)
    wait_for(lambda: tier_in_update(keyed_cluster, "dash-1") == "warm", "the session listed")
    update = first_update(keyed_cluster)
    snap = update["snapshot"]
    assert [w["id"] for w in snap["workers"]] == ["w0", "w1"]
    assert all(w["state"] == "alive" and w["slots"] > 0 for w in snap["workers"])
    assert isinstance(update["history"], list) and update["history"]
    url = f"{cluster.http_url}/dashboard/api/evict"
    admin = bearer(keys["ops"])
    gone = httpx.post(url, json={"tenant": "bob", "session_id": "nope"}, headers=admin, timeout=30)
    assert gone.status_code == 404
    bad = httpx.post(url, json={"tenant": "bob"}, headers=admin, timeout=30)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "session_id"
    evicted = httpx.post(url, json={"tenant": "bob", "session_id": "dash-1"}, headers=admin,
                         timeout=30)  # fmt: skip
    assert evicted.status_code == 200 and evicted.json() == {"tier": "spilling"}
    wait_for(lambda: tier_in_update(keyed_cluster, "dash-1") == "disk",
             "the evicted session on disk in the dashboard's update")  # fmt: skip
    drain = httpx.post(f"{cluster.http_url}/dashboard/api/drain", json={"worker_id": "w9"},
                       headers=admin, timeout=30)  # fmt: skip
    assert drain.status_code == 404
