"""`warmfleet top`: the fleet at a glance in a terminal (queues, workers, sessions, the
kvstore), refreshed in place; `--once --json` prints one snapshot for scripts. Every figure
comes from one `broker.fleet` snapshot, the one the dashboard shows."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from rich import box
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from broker import fleet
from common.errors import InvalidRequestError, ServiceError
from warmfleet.commands.common import add_redis_url
from warmfleet.redis_conn import connect_async
from warmfleet.sizes import format_size

READ_TIMEOUT_S = 5.0  # one snapshot, or an error
MAX_RETRY_S = 10.0  # between reads while Redis cannot be read (the live view)
NONE = "-"  # a figure that needs two samples, or is unknown
STATE_STYLES = {"alive": "green", "draining": "yellow", "gone": "red"}
TIERS = ("hot", "warm", "spilling", "disk", "gone")
Figures = dict[str, Any]  # a part of a snapshot, or its rates


def register(sub: Any) -> None:
    p = sub.add_parser(
        "top",
        help="the fleet at a glance, refreshed in place: queues, workers, sessions, kvstore",
    )
    add_redis_url(p)
    p.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="seconds between samples (1.0)"
    )
    p.add_argument(
        "--once",
        action="store_true",
        help="print one picture and exit (two samples --interval apart, for the rates); "
        "with --json, one snapshot at once, without rates",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print snapshots as JSON: with --once exactly one object; otherwise one line "
        "per sample, with 'rates' from the second on",
    )
    p.add_argument(
        "--sessions",
        type=int,
        metavar="N",
        help="list the N most recently used sessions (default: as many as fit the terminal; "
        f"with --json, {fleet.RECENT_SESSIONS})",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if not args.interval > 0:
        raise InvalidRequestError("--interval", f"must be positive, got {args.interval}")
    if args.sessions is not None and args.sessions < 0:
        raise InvalidRequestError("--sessions", f"must be at least 0, got {args.sessions}")
    try:
        asyncio.run(_main(args))
    except KeyboardInterrupt:
        if args.once:
            raise
    except BrokenPipeError:  # the reader of `--json` left (`| head -1`): done
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit
    return 0  # Ctrl-C is how one leaves the live view


async def _main(args: argparse.Namespace) -> None:
    r = connect_async(args.redis_url, block_ms=0, pool_size=1, wait_s=READ_TIMEOUT_S)
    console = Console()

    def max_sessions() -> int:  # the terminal's height bounds what the view lists
        if args.sessions is not None:
            return int(args.sessions)
        return fleet.RECENT_SESSIONS if args.json else console.size.height

    reader = Reader(r, args.redis_url, max_sessions)
    try:
        if args.json and args.once:
            print(json.dumps(await reader.read()), flush=True)
        elif args.json:
            await _every(args.interval, reader, _print_json_line)
        elif args.once:
            before = await reader.read()
            await asyncio.sleep(args.interval)
            console.print(fit(console, await reader.read(), before, args.sessions))
        else:
            await _live(console, args, reader)
    finally:
        await r.aclose(close_connection_pool=True)


class Reader:
    """Reads snapshots with a deadline; any failure is one ServiceError naming Redis."""

    def __init__(self, r: aioredis.Redis, url: str, max_sessions: Callable[[], int]) -> None:
        self.r, self.url, self.max_sessions = r, url, max_sessions

    async def read(self) -> fleet.Snapshot:
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow the Ctrl-C's
        # cancellation when the read completes at the same moment, and the view runs on
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                return await fleet.read(self.r, self.max_sessions())
        except TimeoutError as e:
            raise ServiceError(f"Redis at {self.url}: no answer in {READ_TIMEOUT_S:g} s") from e
        except (redis.RedisError, OSError) as e:
            task = asyncio.current_task()
            if task is not None and task.cancelling():  # Ctrl-C during a read, which
                raise asyncio.CancelledError from e  # redis-py may turn into its own error
            raise ServiceError(f"cannot read the fleet from Redis at {self.url}: {e}") from e


async def _every(
    interval_s: float, reader: Reader, show: Callable[[fleet.Snapshot, fleet.Snapshot | None], None]
) -> None:
    """Read and show a snapshot every `interval_s` (a failed read raises)."""
    before = None
    while True:
        started = time.monotonic()
        snap = await reader.read()
        show(snap, before)
        before = snap
        await asyncio.sleep(max(0.0, interval_s - (time.monotonic() - started)))


def _print_json_line(snap: fleet.Snapshot, before: fleet.Snapshot | None) -> None:
    if before is not None:
        snap = {**snap, "rates": fleet.rates(before, snap)}
    print(json.dumps(snap), flush=True)


async def _live(console: Console, args: argparse.Namespace, reader: Reader) -> None:
    """The view, redrawn in place every interval until Ctrl-C. Once it shows, a failed read
    keeps the last picture under an error line and retries, backing off up to MAX_RETRY_S."""
    snap, before = await reader.read(), None  # the first failure ends the command
    problem: Text | None = None
    wait_s = args.interval
    with Live(console=console, auto_refresh=False, vertical_overflow="crop") as live:
        while True:
            view = fit(console, snap, before, args.sessions)
            live.update(view if problem is None else Group(problem, view), refresh=True)
            await asyncio.sleep(wait_s)
            try:
                snap, before = await reader.read(), snap
                problem, wait_s = None, args.interval
            except ServiceError as e:
                wait_s = min(MAX_RETRY_S, wait_s * 2)
                problem = Text(f"{e}; retrying in {wait_s:.0f} s", style="bold red")


def fit(
    console: Console, snap: fleet.Snapshot, before: fleet.Snapshot | None, num_sessions: int | None
) -> RenderableType:
    """The view; without `num_sessions`, it lists as many sessions as fit the console."""
    if num_sessions is None:
        used = len(console.render_lines(render(snap, before, 0), pad=False))
        num_sessions = max(0, console.size.height - used - 1)
    return render(snap, before, num_sessions)


def render(
    snap: fleet.Snapshot, before: fleet.Snapshot | None, num_sessions: int
) -> RenderableType:
    """The picture of one snapshot; per-second figures need the one before (else NONE)."""
    rates = fleet.rates(before, snap) if before is not None else None
    when = time.strftime("%H:%M:%S", time.localtime(snap["time"]))
    return Group(
        Text(f"warmfleet top  {when}", style="bold"),
        queues_table(snap["queues"], snap["responses"], rates),
        workers_table(snap["workers"], rates),
        kvstore_table(snap["kvstore"]),
        sessions_table(snap["sessions"], snap["time"], num_sessions),
    )


def queues_table(q: Figures, responses: dict[str, int], rates: Figures | None) -> Group:
    running = ", ".join(f"{t} {n}" for t, n in q["running"].items()) or "0"
    per_s = [f"{_per_s(rates, 'admitted_per_s')} admitted/s",
             f"{_per_s(rates, 'refused_per_s')} refused/s"]  # fmt: skip
    title = f"Queues: {q['waiting']} waiting, running {running}; " + ", ".join(per_s)
    table = _table("class", "tenant", "depth", "oldest wait")
    for lane in q["lanes"]:
        age = lane["oldest_age_s"]
        table.add_row(lane["priority"], lane["tenant"], str(lane["depth"]),
                      NONE if age is None else f"{age:.1f} s")  # fmt: skip
    answered = ", ".join(f"{code} {n}" for code, n in responses.items()) or "none yet"
    return _section(title, table, Text(f"responses: {answered}", style="dim"))


def workers_table(workers: list[Figures], rates: Figures | None) -> Group:
    columns = ("worker", "state", "running", "paused", "tokens/s", "step ms", "warm pool",
               "sessions", "KV", "sessions/GiB", "heartbeat")  # fmt: skip
    table = _table(*columns)
    tokens_per_s = rates["tokens_per_s_by_worker"] if rates else {}
    step_ms = rates["step_ms_by_worker"] if rates else {}
    for w in workers:
        table.add_row(
            w["id"],
            Text(w["state"], style=STATE_STYLES.get(w["state"], "")),
            f"{w['running']} / {w['slots']}",
            str(w["paused"]),
            _figure(tokens_per_s.get(w["id"])),
            _figure(step_ms.get(w["id"])),
            f"{format_size(w['pool_bytes'])} / {format_size(w['warm_budget'])}",
            str(w["sessions"]),
            w.get("kv_dtype") or NONE,
            _figure(w.get("sessions_per_gib")),
            f"{w['heartbeat_age_s']:.1f} s ago",
        )
    return _section(f"Workers: {len(workers)}", table)


def kvstore_table(kv: Figures) -> Group:
    usage = kv["usage"]
    if usage is None:
        return _section("KV store: down (no usage report in Redis)")
    counters, disk = usage["counters"], usage["disk"]
    names = ("spills", "restores", "rejected_files", "failed_writes", "budget_deletions")
    columns = [n.replace("_", " ") for n in names] + ["disk", "files", "events behind"]
    table = _table(*columns)
    # GetUsage as JSON: its 64-bit integers are strings
    table.add_row(
        *(str(int(counters[n])) for n in names),
        _used_of(int(disk["used_bytes"]), int(disk["budget_bytes"])),
        str(disk["num_files"]),
        str(int(usage["events_behind"])),
    )
    return _section(f"KV store: {'alive' if kv['alive'] else 'gone'}", table)


def sessions_table(sessions: Figures, now: float, num_sessions: int) -> Group:
    tiers = ", ".join(f"{tier} {sessions['tiers'].get(tier, 0)}" for tier in TIERS)
    recent = sessions["recent"][:num_sessions]
    title = f"Sessions: {sessions['total']} ({tiers}); {len(recent)} most recently used"
    table = _table("tenant", "session", "tier", "worker", "tokens", "size", "last used")
    for s in recent:
        table.add_row(s["tenant"], s["session_id"], s["tier"], s["worker"] or NONE,
                      str(s["tokens"]), format_size(s["bytes"]),
                      f"{max(0.0, now - s['last_used']):.0f} s ago")  # fmt: skip
    return _section(title, table)


def _section(title: str, *parts: RenderableType) -> Group:
    return Group(Text(""), Text(title, style="bold"), *parts)


def _table(*columns: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in columns:
        table.add_column(name, no_wrap=True)
    return table


def _used_of(used_bytes: int, budget_bytes: int) -> str:
    budget = format_size(budget_bytes) if budget_bytes else "no budget"
    return f"{format_size(used_bytes)} / {budget}"


def _per_s(rates: Figures | None, name: str) -> str:
    return _figure(rates[name] if rates else None)


def _figure(x: float | None) -> str:
    return NONE if x is None else f"{x:.1f}"
