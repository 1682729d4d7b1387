"""Faults under a steady load, one after another, on the system as `warmfleet up` runs it
(its children started again by warmfleet/supervisor.py):

    .venv/bin/python -m bench.chaos [--faults kill-worker,kill-gateway] [--phase-s 40]

Agents (8 by default) chat over gRPC with the default model, several turns per session and
a few greedy tokens per turn, every reply checked against the in-process engine's; a turn
that fails UNAVAILABLE is sent again, as an agent would. After a baseline, in turn: SIGKILL
a worker, SIGKILL the kvstore, SIGKILL the gateway, restart Redis empty (state lost) and
from its append-only file, SIGTERM a worker (a drain: it exits 0 and is started again),
fill the spill directory's file system (a tmpfs) for half the phase. Each fault gets a
row, from the attempts that ended during its phase: completed, retried after UNAVAILABLE,
failed (by code), hung (past the deadline: none allowed), duplicate or missing token
indexes and tokens other than the reference's (none allowed), attempts slower than the
slow threshold, and the time from the fault until requests complete normally again
(bench/chaos_report.py defines it). Notes under the table say when each restarted part
served again."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import grpc

from bench.chaos_agents import Load, Script, agent, scripts
from bench.chaos_cluster import Fleet, FleetOptions, log
from bench.chaos_faults import FAULTS, watch_back
from bench.chaos_report import HEADER, Phase, rows, slow_threshold_s
from bench.chaos_stream import CHANNEL_OPTIONS, reference_model, stub_for
from bench.table import print_table
from warmfleet.models import resolve_model
from warmfleet.sizes import size_arg

_MIB = 1 << 20


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--faults",
        default=",".join(FAULTS),
        metavar="LIST",
        help=f"comma-separated, in order (default: all): {', '.join(FAULTS)}",
    )
    p.add_argument("--agents", type=int, default=8, help="concurrent sessions (8)")
    p.add_argument("--turns", type=int, default=4, help="turns per session (4)")
    p.add_argument("--tokens", type=int, default=8, help="new tokens per turn (8)")
    p.add_argument("--workers", type=int, default=2, help="worker processes (2)")
    p.add_argument("--baseline-s", type=float, default=30.0, help="load before the first fault")
    p.add_argument("--phase-s", type=float, default=40.0, help="time given to each fault (40)")
    p.add_argument("--deadline-s", type=float, default=60.0,
                   help="each call's deadline: an attempt past it is hung (60)")  # fmt: skip
    p.add_argument("--slow-factor", type=float, default=3.0,
                   help="slow: over this times the baseline's p90 latency (3)")  # fmt: skip
    p.add_argument("--warm-budget", type=size_arg, default=48 * _MIB,
                   help="each worker's warm KV, small so that sessions spill (48M)")  # fmt: skip
    p.add_argument("--disk-budget", type=size_arg, default=96 * _MIB,
                   help="the kvstore's spill files at most (96M)")  # fmt: skip
    p.add_argument("--spill-mib", type=int, default=192,
                   help="size of the tmpfs the spill directory is mounted on (192)")  # fmt: skip
    args = p.parse_args(argv)
    args.faults = [f for f in args.faults.split(",") if f]
    unknown = [f for f in args.faults if f not in FAULTS]
    if unknown:
        p.error(f"unknown faults: {', '.join(unknown)}; choose from {', '.join(FAULTS)}")
    return args


async def wait(seconds: float, supervising: asyncio.Task[None]) -> None:
    """Sleep, but end at once (raising) if the supervision failed."""
    done, _ = await asyncio.wait({supervising}, timeout=max(0.0, seconds))
    if done:
        supervising.result()
        raise RuntimeError("the supervision ended early")


async def faults(fleet: Fleet, args: argparse.Namespace, sup: asyncio.Task[None]) -> list[Phase]:
    """The baseline, then each fault in its phase."""
    assert fleet.supervisor is not None
    phases = [Phase("none (baseline)", time.monotonic())]
    await wait(args.baseline_s, sup)
    watches = []
    for name in args.faults:
        fault = FAULTS[name]
        phases[-1].end = phase_start = time.monotonic()
        phase = Phase(fault.title, phase_start)
        phases.append(phase)
        log(f"fault: {fault.title}")
        restarts = dict(fleet.supervisor.restarts)  # before the fault
        part, notes = await fault.inject(fleet, args.phase_s)
        phase.notes += notes
        if part is not None:
            back = watch_back(fleet, part, restarts.get(part, 0), phase_start, phase.notes)
            watches.append(asyncio.create_task(back))
        await wait(phase_start + args.phase_s - time.monotonic(), sup)
    phases[-1].end = time.monotonic()
    for watch in watches:
        watch.cancel()
    return phases


async def run_load(
    fleet: Fleet, args: argparse.Namespace, convs: list[Script]
) -> tuple[list[Phase], Load]:
    assert fleet.cluster is not None
    stop_supervising = asyncio.Event()
    sup = asyncio.create_task(fleet.supervise(stop_supervising))
    async with grpc.aio.insecure_channel(fleet.cluster.target, options=CHANNEL_OPTIONS) as ch:
        load = Load(stub_for(ch), f"chaos{int(time.time())}", args.tokens, args.deadline_s)
        agents = [asyncio.create_task(agent(load, s)) for s in convs]
        try:
            phases = await faults(fleet, args, sup)
        finally:
            load.stop.set()
            log("load stopping: waiting for the turns in flight")
            await asyncio.wait(agents, timeout=args.deadline_s + 10)
            stop_supervising.set()
            await sup
    return phases, load


def report(phases: list[Phase], load: Load, args: argparse.Namespace) -> None:
    baseline = [a for a in load.attempts if phases[0].holds(a)]
    slow_s = slow_threshold_s(baseline, args.slow_factor)
    print(f"chaos: {args.agents} agents, {args.turns} turns of {args.tokens} tokens per "
          f"session, {args.workers} workers; phases of {args.phase_s:.0f} s; deadline "
          f"{args.deadline_s:.0f} s; slow: over {slow_s:.2f} s ({args.slow_factor:g}x the "
          f"baseline's p90)")  # fmt: skip
    print_table(HEADER, rows(phases, load.attempts, slow_s))
    for phase in phases:
        for note in phase.notes:
            print(f"- {phase.name}: {note}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    path = resolve_model(None)
    log("computing the reference replies in-process")
    convs = scripts(reference_model(path), args.agents, args.turns, args.tokens)
    fleet = Fleet(FleetOptions(model=path, workers=args.workers, own_redis=True,
                               spill_tmpfs_mib=args.spill_mib, warm_budget=args.warm_budget,
                               disk_budget=args.disk_budget))  # fmt: skip
    try:
        fleet.start()
        phases, load = asyncio.run(run_load(fleet, args, convs))
    finally:
        fleet.stop()
    report(phases, load, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
