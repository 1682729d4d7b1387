"""The chaos table: one row per fault, from the attempts that ended while it was the latest.

An attempt is abnormal when it failed (any code, UNAVAILABLE included) or took longer than
the slow threshold (a multiple of the baseline's p90). Time to recover: from the fault to
the end of the first normal attempt that started after the last abnormal one began; 0
when no attempt was abnormal. Longest stall: the longest a turn waited for its next new
token (from its start for the first, retries included, to its completion for the last),
over the turns that ended in the phase: a moved stream's pause when a worker dies, a
retried one's outage when the gateway does."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from bench.chaos_agents import RETRYABLE
from bench.chaos_stream import HUNG, OK, Attempt

HEADER = ["fault", "ok", "retried (UNAVAILABLE)", "failed (by code)", "hung",
          "dup/missing tokens", "wrong tokens", "slow", "longest stall (s)",
          "recovered after (s)"]  # fmt: skip


@dataclass
class Phase:
    name: str
    start: float
    end: float = float("inf")
    notes: list[str] = field(default_factory=list)

    def holds(self, attempt: Attempt) -> bool:
        return self.start <= attempt.end < self.end


def slow_threshold_s(baseline: list[Attempt], factor: float) -> float:
    """`factor` times the p90 latency of the baseline's completed attempts."""
    latencies = sorted(a.latency_s for a in baseline if a.code == OK)
    if len(latencies) < 2:
        return float("inf")
    return factor * statistics.quantiles(latencies, n=10)[-1]


def recovery_s(phase: Phase, attempts: list[Attempt], slow_s: float) -> float | None:
    """Seconds from the fault until requests complete normally again; None if they never
    did within the phase."""

    def abnormal(a: Attempt) -> bool:
        return a.code != OK or a.latency_s > slow_s

    bad = [a.start for a in attempts if abnormal(a)]
    if not bad:
        return 0.0
    last_bad = max(bad)
    after = [a.end for a in attempts if not abnormal(a) and a.start > last_bad]
    return min(after) - phase.start if after else None


def stalls(attempts: list[Attempt]) -> list[tuple[float, float]]:
    """(when it ended, its longest wait for a new token) of each turn."""
    turns: dict[int, list[Attempt]] = defaultdict(list)
    for a in attempts:
        turns[a.turn].append(a)
    found = []
    for group in turns.values():
        last, tokens, longest = min(a.start for a in group), 0, 0.0
        for when, num_tokens in sorted(x for a in group for x in a.arrivals):
            if num_tokens > tokens:
                longest, last, tokens = max(longest, when - last), when, num_tokens
        done = [a.end for a in group if a.code == OK]
        end = min(done) if done else max(a.end for a in group)
        found.append((end, max(longest, end - last)))
    return found


def row(phase: Phase, attempts: list[Attempt], slow_s: float, baseline: bool) -> list[str]:
    mine = [a for a in attempts if phase.holds(a)]
    stall = max((s for end, s in stalls(attempts) if phase.start <= end < phase.end), default=0)
    failed = Counter(a.code for a in mine if a.code not in (OK, RETRYABLE, HUNG))
    recovered = recovery_s(phase, mine, slow_s)
    if baseline:
        recover = "-"
    else:
        recover = "not within the phase" if recovered is None else f"{recovered:.1f}"
    return [
        phase.name,
        str(sum(a.code == OK for a in mine)),
        str(sum(a.code == RETRYABLE for a in mine)),
        ", ".join(f"{code} {n}" for code, n in sorted(failed.items())) or "0",
        str(sum(a.code == HUNG for a in mine)),
        f"{sum(a.duplicates for a in mine)}/{sum(a.missing for a in mine)}",
        str(sum(a.wrong for a in mine)),
        str(sum(a.code == OK and a.latency_s > slow_s for a in mine)),
        f"{stall:.1f}",
        recover,
    ]


def rows(phases: list[Phase], attempts: list[Attempt], slow_s: float) -> list[list[str]]:
    return [row(p, attempts, slow_s, baseline=i == 0) for i, p in enumerate(phases)]
