"""The residency index: tiers, eviction orders, disk budget, departed workers, inventories
and reconciliation with the disk, with no Redis and no files."""

from __future__ import annotations

from dataclasses import replace

import pytest

from broker.messages import (
    AnswerStatus,
    ControlOrder,
    EventKind,
    GoneReason,
    Held,
    OrderOp,
    SessionEvent,
)
from broker.records import SessionRecord as Record
from common.enums import Tier
from kvstore.effects import Order
from kvstore.index import ResidencyIndex
from tests.unit.kv_index_helpers import (
    BIG_BUDGET,
    NOW,
    S1,
    S2,
    S3,
    S4,
    TOKENS,
    W0,
    W1,
    answer,
    apply_all,
    disk,
    gone,
    hot,
    inventory,
    make_index,
    on_disk,
    spill_order,
    warm,
)

# ---- warm budget --------------------------------------------------------------------


def test_hot_then_warm_leaves_a_warm_record_on_the_worker() -> None:
    index = make_index()
    index.apply(hot(S1, 1.0, nbytes=60))
    fx = index.apply(warm(S1, 2.0, nbytes=80))
    assert index.table.records[S1] == Record(Tier.WARM, W0, TOKENS, 80, 2.0)
    assert fx.upserts == {S1: index.table.records[S1]} and not fx.orders
    assert index.table.on_worker(W0) == [S1] and index.table.warm_bytes(W0) == 80


def test_warm_over_budget_spills_least_recently_used_first_never_hot() -> None:
    index = make_index({W0: 300})
    events = [hot(S4, 0.5, nbytes=1000), warm(S2, 2.0), warm(S1, 1.0), warm(S3, 3.0)]
    for e in events:  # arrival order differs from last_used order on purpose
        assert not index.apply(e).orders
        assert index.table.warm_bytes(W0) <= 300
    fx = index.apply(warm("local/s5", 4.0, nbytes=150))  # 450 warm bytes: two must go
    assert fx.orders == [spill_order(S1), spill_order(S2)]
    assert fx.counters == {"evictions_ordered": 2}
    tiers = [index.table.records[k].tier for k in (S1, S2, S3, S4)]
    assert tiers == ["spilling"] * 2 + ["warm", "hot"]
    assert fx.upserts[S1] == Record(Tier.SPILLING, W0, TOKENS, 100, 1.0)
    assert index.table.warm_bytes(W0) == 250


def test_set_workers_brings_warm_bytes_within_a_lowered_budget() -> None:
    index = make_index({W0: 1000})
    apply_all(index, warm(S1, 2.0), warm(S2, 1.0), warm(S3, 3.0))
    fx = index.set_workers({W0: 150})
    assert fx.orders == [spill_order(S2), spill_order(S1)]
    assert index.table.warm_bytes(W0) == 100


def test_inventory_over_budget_orders_spills() -> None:
    index = make_index({W0: 150})
    held = [Held(S1, "warm", TOKENS, 100, 2.0), Held(S2, "warm", TOKENS, 100, 1.0)]
    fx = index.apply(inventory(W0, held, NOW))
    assert fx.orders == [spill_order(S2)] and index.table.records[S2].tier == "spilling"
    assert index.table.warm_bytes(W0) == 100


# ---- disk events and failures -------------------------------------------------------


def test_disk_event_from_the_holder_moves_the_session_to_disk() -> None:
    index = make_index()
    index.apply(warm(S1, 1.0))
    fx = index.apply(disk(S1, size=80, mtime_ns=555))
    assert index.table.records[S1] == Record(Tier.DISK, "", TOKENS, 80, 1.0, 555)  # keeps last_used
    assert fx.counters == {"spills": 1} and fx.upserts == {S1: index.table.records[S1]}
    assert index.table.disk.used == 80 and index.table.on_worker(W0) == []


def test_late_disk_event_from_the_previous_worker_leaves_the_record_and_drops_its_file() -> None:
    index = make_index({W0: BIG_BUDGET, W1: BIG_BUDGET})
    apply_all(index, warm(S1, 1.0), hot(S1, 2.0, worker=W1, came_from="disk"))
    fx = index.apply(disk(S1, size=80, mtime_ns=555, worker=W0))
    assert index.table.records[S1] == Record(Tier.HOT, W1, TOKENS, 100, 2.0)
    assert fx.counters == {"spills": 1} and not fx.upserts
    assert fx.unlink == [(S1, 555)]  # that file only: a newer one has another mtime
    assert index.table.disk.used == 0 and index.table.on_worker(W1) == [S1]


def test_a_second_copy_on_another_worker_is_forgotten() -> None:
    index = make_index({W0: BIG_BUDGET, W1: BIG_BUDGET})
    index.apply(warm(S1, 1.0))  # on w0
    fx = index.apply(hot(S1, 2.0, worker=W1, came_from="none"))  # routed elsewhere
    assert fx.orders == [Order(W0, ControlOrder(OrderOp.FORGET, S1))]
    assert index.table.records[S1].worker == W1 and index.table.on_worker(W0) == []


def test_inventory_keeps_the_newer_of_two_copies() -> None:
    index = make_index({W0: BIG_BUDGET, W1: BIG_BUDGET})
    index.apply(warm(S1, 5.0, worker=W1))
    older = inventory(W0, [Held(S1, "warm", TOKENS, 100, 4.0)], 9.0)
    fx = index.apply(older)
    assert fx.orders == [Order(W0, ControlOrder(OrderOp.FORGET, S1))]
    assert index.table.records[S1].worker == W1
    newer = inventory(W0, [Held(S1, "warm", TOKENS, 100, 6.0)], 9.0)
    fx = index.apply(newer)
    assert fx.orders == [Order(W1, ControlOrder(OrderOp.FORGET, S1))]
    assert index.table.records[S1] == Record(Tier.WARM, W0, TOKENS, 100, 6.0)


def test_restore_from_disk_is_counted_and_frees_disk_bytes() -> None:
    index = on_disk(S1, 1.0, size=80, mtime_ns=555)
    fx = index.apply(hot(S1, 2.0, worker=W0, came_from="disk"))
    assert fx.counters == {"restores": 1}
    assert index.table.records[S1] == Record(Tier.HOT, W0, TOKENS, 100, 2.0)
    assert index.table.disk.used == 0
    assert index.apply(hot(S1, 3.0, came_from="pool")).counters == {}


@pytest.mark.parametrize(
    ("reason", "counters"),
    [
        (GoneReason.REJECTED, {"rejected_files": 1}),
        (GoneReason.WRITE_FAILED, {"failed_writes": 1}),
        (GoneReason.DROPPED, {}),
    ],
)
def test_gone_event_sets_gone_and_counts_its_reason(
    reason: GoneReason, counters: dict[str, int]
) -> None:
    index = make_index()
    index.apply(warm(S1, 1.0))
    fx = index.apply(gone(S1, reason))
    assert index.table.records[S1] == Record(Tier.GONE, "", 0, 0, 1.0)
    assert fx.counters == counters and index.table.on_worker(W0) == []


def test_gone_from_a_worker_that_no_longer_holds_the_session_is_ignored() -> None:
    index = make_index({W0: BIG_BUDGET, W1: BIG_BUDGET})
    apply_all(index, warm(S1, 1.0, worker=W1))
    fx = index.apply(gone(S1, GoneReason.WRITE_FAILED, worker=W0))
    assert index.table.records[S1].tier == "warm" and not fx.upserts
    assert fx.counters == {"failed_writes": 1}


# ---- disk budget --------------------------------------------------------------------


def test_disk_budget_unlinks_least_recently_used_files() -> None:
    index = make_index(disk_budget=250)
    apply_all(index, warm(S1, 3.0), warm(S2, 1.0), warm(S3, 2.0))
    fx = apply_all(index, disk(S1, 100, mtime_ns=11), disk(S2, 100, mtime_ns=12))
    assert not fx.unlink and index.table.disk.used == 200
    fx = index.apply(disk(S3, 200, mtime_ns=13))  # 400 bytes: S2 then S3 are older than S1
    assert fx.unlink == [(S2, 12), (S3, 13)]
    assert fx.counters == {"spills": 1, "budget_deletions": 2}
    assert index.table.records[S2] == Record(Tier.GONE, "", 0, 0, 1.0)
    assert [index.table.records[k].tier for k in (S1, S2, S3)] == ["disk", "gone", "gone"]
    assert index.table.disk.used == 100


# ---- workers leaving, inventories ---------------------------------------------------


def test_sessions_of_a_departed_worker_move_to_their_file_or_gone() -> None:
    index = make_index({W0: BIG_BUDGET, W1: BIG_BUDGET}, files={S1: (70, 777)})
    apply_all(index, warm(S1, 1.0), hot(S2, 2.0), warm(S3, 3.0, worker=W1))
    fx = index.set_workers({W1: BIG_BUDGET})
    assert fx.upserts == {
        S1: Record(Tier.DISK, "", TOKENS, 70, 1.0, 777),
        S2: Record(Tier.GONE, "", 0, 0, 2.0),
    }
    assert index.table.records[S3] == Record(Tier.WARM, W1, TOKENS, 100, 3.0)
    assert index.table.on_worker(W0) == [] and index.table.disk.used == 70


def test_files_of_a_departed_worker_count_against_the_disk_budget() -> None:
    files = {S1: (100, 1), S2: (100, 2)}
    index = make_index({W0: BIG_BUDGET}, files=files, disk_budget=150)
    apply_all(index, warm(S1, 1.0), warm(S2, 2.0))
    fx = index.set_workers({})
    assert fx.unlink == [(S1, 1)] and index.table.disk.used <= 150


def test_inventory_is_the_workers_whole_truth() -> None:
    index = make_index(files={S1: (70, 777)})
    apply_all(index, warm(S1, 1.0), warm(S2, 2.0), hot(S3, 3.0))
    held = [Held(S3, "warm", 12, 90, 4.0), Held(S4, "hot", 0, 0, 5.0)]
    fx = index.apply(inventory(W0, held, NOW))
    assert fx.upserts == {
        S1: Record(Tier.DISK, "", TOKENS, 70, 1.0, 777),
        S2: Record(Tier.GONE, "", 0, 0, 2.0),
        S3: Record(Tier.WARM, W0, 12, 90, 4.0),
        S4: Record(Tier.HOT, W0, 0, 0, 5.0),
    }
    assert index.table.on_worker(W0) == [S3, S4] and index.table.disk.used == 70


# ---- disk reconciliation ------------------------------------------------------------


def test_reconcile_disk_matches_records_with_the_files_found() -> None:
    index = on_disk(S1, 1.0, size=80, mtime_ns=555)
    apply_all(index, warm(S2, 2.0), warm(S3, 3.0), gone(S3, GoneReason.DROPPED))
    files = {S2: (60, 6_000_000_000, 5), S3: (70, 7_000_000_000, 7), S4: (90, 9_000_000_000, 9)}
    fx = index.reconcile_disk(files)
    assert fx.upserts == {
        S1: Record(Tier.GONE, "", TOKENS, 0, 1.0),
        S3: Record(Tier.DISK, "", 7, 70, 3.0, 7_000_000_000),  # keeps the record's last_used
        S4: Record(Tier.DISK, "", 9, 90, 9.0, 9_000_000_000),  # last_used from the file
    }
    assert index.table.records[S2].tier == "warm"  # in memory: its file is not the truth
    assert index.table.disk.used == 160


def test_inventory_copy_older_than_the_file_is_forgotten_and_a_newer_one_replaces_it() -> None:
    index = on_disk(S1, 5.0, size=80, mtime_ns=555)
    older = inventory(W0, [Held(S1, "warm", TOKENS, 100, 4.0)], 9.0)
    fx = index.apply(older)
    assert fx.orders == [Order(W0, ControlOrder(OrderOp.FORGET, S1))]
    assert index.table.records[S1].tier == "disk" and not fx.unlink
    newer = inventory(W0, [Held(S1, "warm", TOKENS, 100, 6.0)], 9.0)
    fx = index.apply(newer)
    assert fx.unlink == [(S1, 555)] and not fx.orders
    assert index.table.records[S1] == Record(Tier.WARM, W0, TOKENS, 100, 6.0)
    assert index.table.disk.used == 0


def test_the_event_that_completes_a_command_answers_it_once_applied() -> None:
    index = make_index({W0: BIG_BUDGET})
    index.apply(warm(S1, 1.0))
    done = SessionEvent(EventKind.WARM, W0, S2, TOKENS, 100, 2.0, reply_to="wf:reply:x")
    fx = index.apply(done)
    assert fx.replies == [("wf:reply:x", answer(AnswerStatus.OK))]
    assert index.table.records[S2].tier == "warm"


def test_a_dropped_copy_does_not_forget_the_file_written_since() -> None:
    # w0 evicted s1 by itself (kvstore down) and reported the file; a spill order sent
    # before that event was applied finds nothing in w0's pool and says so
    index = on_disk(S1, 1.0, size=80, mtime_ns=555)
    index.apply(SessionEvent(EventKind.GONE, W0, S1, last_used=2.0, reason=GoneReason.DROPPED))
    assert index.table.records[S1].tier == "disk"
    index.apply(SessionEvent(EventKind.GONE, W1, S1, last_used=3.0, reason=GoneReason.REJECTED))
    assert index.table.records[S1].tier == "gone"  # the file itself failed its checks


def test_the_warm_budget_counts_the_blocks_the_worker_holds_shared_ones_once() -> None:
    """Sessions sharing a prompt's blocks: their records say 100 bytes each, the worker
    counts 200 in all; the budget keeps to the worker's count, and spilling one counts at
    most its record until the worker says what it freed."""
    index = make_index({W0: 250})
    shared = [replace(warm(k, t), warm_bytes=w) for k, t, w in ((S1, 1.0, 100), (S2, 2.0, 150),
                                                                (S3, 3.0, 200))]  # fmt: skip
    for e in shared:
        assert not index.apply(e).orders  # 300 in the records, 200 held
    assert index.table.warm_bytes(W0) == 200
    fx = index.apply(replace(warm(S4, 4.0), warm_bytes=300))
    assert fx.orders == [spill_order(S1)] and index.table.warm_bytes(W0) == 200
    # S1's spill freed only its own 40 bytes: over budget still, the next goes
    fx = index.apply(replace(disk(S1, 500, 7), warm_bytes=260))
    assert fx.orders == [spill_order(S2)] and index.table.warm_bytes(W0) == 160
    index.apply(replace(disk(S2, 500, 8), warm_bytes=210))
    assert index.table.warm_bytes(W0) == 210 and index.table.warm_held == {W0: 210}


def test_disk_bytes_count_each_shared_block_once() -> None:
    """Three sessions on disk list one shared block; deleting the oldest frees its own file
    and nothing of the block the others still list."""
    listed = {S1: (10, {"a": 100, "b1": 100}), S2: (20, {"a": 100, "b2": 100}),
              S3: (30, {"a": 100})}  # fmt: skip
    index = ResidencyIndex(None, lambda key: None, listed.get)
    for i, key in enumerate((S1, S2, S3)):
        index.apply(disk(key, 999, i + 1))
    assert index.table.disk.used == 10 + 20 + 30 + 3 * 100  # a, b1, b2
    index.disk_budget = 300
    fx = index.apply(disk(S4, 5, 9))  # no file to read: its record's size stands
    assert index.table.disk.used == 360 + 5 - 10 - 100  # S1 went: its file and b1, not a
    assert fx.unlink == [(S1, 1)] and index.table.records[S1].tier == "gone"
