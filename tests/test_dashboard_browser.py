"""The dashboard in a real browser (Debian's chromium, driven by Playwright) against the
whole system (Redis, the kvstore, two workers of one batch slot each, the real model): the
admin key form, both workers, a request that waits behind long ones in the fair queue and
then leaves it, a session evicted from the page to disk, and the screenshot in the docs
(UPDATE_SCREENSHOT=1 ./dev test tests/test_dashboard_browser.py renews it)."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from playwright.sync_api import Browser, ConsoleMessage, Dialog, Page, expect, sync_playwright

from common.v1 import inference_pb2 as pb
from gateway.auth import hash_key
from warmfleet.client import Client, GenerateStream, Reply, collect
from warmfleet.cluster_config import ClusterConfig
from warmfleet.launcher import Cluster

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]  # fmt: skip
SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "dashboard.png"
WAIT_MS = 60_000  # every wait on the page; nothing waits forever
ADMIN_KEY, AGENT_KEY = "ops-secret", "alice-secret"  # tenants "ops" (an admin key) and "alice"
KEY_FILE = f"""[[keys]]
sha256 = "{hash_key(ADMIN_KEY)}"
tenant = "ops"
admin = true

[[keys]]
sha256 = "{hash_key(AGENT_KEY)}"
tenant = "alice"
"""
PROMPT = "Count from one to a thousand, in words:"


@dataclass
class Dashboard:
    page: Page
    opening: list[str]  # the errors and warnings the browser logged until the key was taken
    log: list[str]  # those it logged since


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("dashboard")
    (tmp / "keys.toml").write_text(KEY_FILE, encoding="utf-8")
    config = ClusterConfig(num_workers=2, spill_dir=tmp / "spill", keys_file=tmp / "keys.toml",
                           worker_args=["--max-running", "1"], log_dir=tmp / "logs")  # fmt: skip
    with Cluster(config) as c:
        yield c


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: the dashboard's test needs Debian's chromium "
                    "(apt-get install chromium; ./dev test installs it)")  # fmt: skip
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS,
                                    timeout=WAIT_MS)  # fmt: skip
        yield browser
        browser.close()


def record(into: list[str], message: ConsoleMessage) -> None:
    """Keeps the console's errors and warnings, with the URL they are about."""
    if message.type in ("error", "warning"):
        into.append(f"{message.type}: {message.text} ({message.location.get('url', '')})")


@pytest.fixture(scope="module")
def dashboard(cluster: Cluster, browser: Browser) -> Iterator[Dashboard]:
    """The page opened, refused an agent's key, then given the admin key."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(WAIT_MS)
    logged: list[str] = []
    page.on("console", lambda m: record(logged, m))
    page.on("pageerror", lambda e: logged.append(f"pageerror: {e}"))
    page.goto(f"{cluster.http_url}/dashboard")
    expect(page.locator("#key-form")).to_be_visible()
    expect(page.locator("body")).to_have_attribute("data-connection", "key needed")
    page.fill("#key-input", AGENT_KEY)
    page.click("#key-form button[type=submit]")
    expect(page.locator("#key-message")).to_contain_text("not an admin key")
    page.fill("#key-input", ADMIN_KEY)
    page.click("#key-form button[type=submit]")
    expect(page.locator("body")).to_have_attribute("data-connection", "live")
    opening = list(logged)
    logged.clear()
    yield Dashboard(page, opening, log=logged)
    page.close()


def test_page_opens_without_console_errors_and_shows_both_workers(dashboard: Dashboard) -> None:
    page = dashboard.page
    # the page asks /dashboard/access (always 200) before it opens the stream: no refused
    # request for the browser to log while it asks for the key, then is given a wrong one
    assert dashboard.opening == []
    assert page.evaluate("sessionStorage.getItem('warmfleet-key')") == ADMIN_KEY
    for worker in ("w0", "w1"):
        row = page.locator(f'#workers tr[data-worker="{worker}"]')
        expect(row.locator('[data-col="state"]')).to_have_text("alive")
        expect(row.locator('[data-col="running"] span')).to_have_text("0 / 1")
        expect(row.locator('[data-col="kv"]')).to_have_text("float16")  # the default
    expect(page.locator("#workers tbody tr")).to_have_count(2)


def read_in_thread(call: GenerateStream, into: list[Reply | grpc.RpcError]) -> threading.Thread:
    """Reads a Generate stream to its end on a thread; its Reply or RpcError lands in `into`."""

    def read() -> None:
        try:
            into.append(collect(call))
        except grpc.RpcError as e:
            into.append(e)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread


def test_a_request_queued_behind_long_ones_shows_in_its_lane_then_leaves(
    cluster: Cluster, dashboard: Dashboard
) -> None:
    page = dashboard.page
    lane = page.locator('#queues tr[data-lane="normal/alice"]')
    with Client(cluster.target, api_key=AGENT_KEY, timeout_s=120) as client:
        long_calls = [client.stream(f"long-{i}", prompt=PROMPT, max_tokens=4000, ignore_eos=True)
                      for i in range(2)]  # fmt: skip
        ended: list[Reply | grpc.RpcError] = []
        readers = [read_in_thread(call, ended) for call in long_calls]
        for worker in ("w0", "w1"):  # one batch slot each: both are now full
            running = page.locator(f'#workers tr[data-worker="{worker}"] [data-col="running"]')
            expect(running.locator("span")).to_have_text("1 / 1")
        queued: list[Reply | grpc.RpcError] = []
        waiter = read_in_thread(
            client.stream("queued", prompt=PROMPT, max_tokens=8, ignore_eos=True), queued
        )
        expect(lane.locator('[data-col="depth"]')).to_have_text("1")
        for call in long_calls:
            call.cancel()
        expect(lane).to_have_count(0)
        expect(page.locator('#queues-panel [data-figure="waiting"]')).to_have_text("0")
        waiter.join(timeout=WAIT_MS / 1000)
        for reader in readers:
            reader.join(timeout=WAIT_MS / 1000)
    assert len(queued) == 1 and isinstance(queued[0], Reply), queued
    assert len(queued[0].token_ids) == 8
    codes = [e.code() for e in ended if isinstance(e, grpc.RpcError)]
    assert codes == [grpc.StatusCode.CANCELLED] * 2


def test_a_session_evicted_from_the_page_moves_from_warm_to_disk(
    cluster: Cluster, dashboard: Dashboard
) -> None:
    page = dashboard.page
    with Client(cluster.target, api_key=AGENT_KEY, timeout_s=120) as client:
        for sid in ("kept", "evicted"):
            client.complete(sid, prompt=PROMPT, max_tokens=16)
        row = page.locator('#sessions tr[data-session="alice/evicted"]')
        expect(row.locator('[data-col="tier"]')).to_have_text("warm")
        page.fill("#session-search", "evict")
        expect(page.locator("#sessions tbody tr:visible")).to_have_count(1)
        row.locator('[data-action="evict"]').click()
        expect(page.locator("#action-status")).to_contain_text("evicted alice/evicted")
        expect(row.locator('[data-col="tier"]')).to_have_text("disk")
        expect(row.locator('[data-action="evict"]')).to_be_disabled()
        assert client.get_session("evicted").tier == pb.TIER_DISK
        assert client.get_session("kept").tier == pb.TIER_WARM
    expect(page.locator('#session-tiers [data-tier="disk"]')).to_have_text("disk 1")
    expect(page.locator('#kvstore [data-figure="spills"]')).to_have_text("1")
    expect(page.locator('#kvstore [data-figure="num_files"]')).to_have_text("1")
    page.fill("#session-search", "")
    expect(page.locator('#sessions tr[data-session="alice/kept"] [data-col="tier"]')).to_have_text(
        "warm"
    )


def test_the_page_logs_nothing_and_its_screenshot_is_saved(
    dashboard: Dashboard, tmp_path: Path
) -> None:
    """The screenshot goes to the docs only when asked (UPDATE_SCREENSHOT=1): a test run
    leaves the checkout as it found it."""
    page = dashboard.page
    expect(page.locator("body")).to_have_attribute("data-connection", "live")
    expect(page.locator("#chart-tokens canvas")).to_have_count(1)
    page.locator("#session-search").blur()
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    if os.environ.get("UPDATE_SCREENSHOT") == "1":
        shutil.copyfile(shot, SCREENSHOT)
    assert dashboard.log == []


def test_a_worker_drained_from_the_page_finishes_and_exits(
    cluster: Cluster, dashboard: Dashboard
) -> None:
    page = dashboard.page  # last: the screenshot above shows both workers
    asked: list[str] = []

    def accept(dialog: Dialog) -> None:
        asked.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    page.locator('#workers tr[data-worker="w1"] [data-action="drain"]').click()
    expect(page.locator("#action-status")).to_contain_text("w1 is draining")
    assert len(asked) == 1 and asked[0].startswith("Drain w1?")
    assert cluster.processes["w1"].wait(timeout=WAIT_MS / 1000) == 0
    expect(page.locator('#workers tr[data-state="alive"]')).to_have_count(1)
    expect(page.locator('#workers tr[data-worker="w0"]')).to_have_attribute("data-state", "alive")
    assert dashboard.log == []
