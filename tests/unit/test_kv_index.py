"""The residency index: tiers, eviction orders, disk budget and commands, with no Redis and
no files (spill files are a dict that `file_info` reads)."""

from __future__ import annotations

import time

import pytest

from broker import kv_events as ev
from broker.kv_events import Held, KVCommand, KVEvent, inventory_event
from kvstore.index import Effects, Order, Record, ResidencyIndex

W0, W1 = "w0", "w1"
S1, S2, S3, S4 = "local/s1", "local/s2", "local/s3", "local/s4"
REPLY = "reply:1"
TOKENS = 10
NOW = 50.0
BIG_BUDGET = 10**9

Files = dict[str, tuple[int, int]]  # key -> (size, mtime_ns) of its spill file


def make_index(
    workers: dict[str, int] | None = None,
    files: Files | None = None,
    disk_budget: int | None = None,
) -> ResidencyIndex:
    found: Files = {} if files is None else files
    index = ResidencyIndex(disk_budget, lambda key: found.get(key))
    index.set_workers({W0: BIG_BUDGET} if workers is None else workers)
    return index


def hot(
    key: str, last_used: float, nbytes: int = 100, worker: str = W0, came_from: str = ""
) -> KVEvent:
    return KVEvent(ev.HOT, worker, key, TOKENS, nbytes, last_used, came_from)


def warm(key: str, last_used: float, nbytes: int = 100, worker: str = W0) -> KVEvent:
    return KVEvent(ev.WARM, worker, key, TOKENS, nbytes, last_used)


def disk(key: str, size: int, mtime_ns: int, worker: str = W0) -> KVEvent:
    return KVEvent(ev.DISK, worker, key, TOKENS, size, 99.0, str(mtime_ns))


def gone(key: str, reason: str, worker: str = W0) -> KVEvent:
    return KVEvent(ev.GONE, worker, key, detail=reason)


def command(op: str, key: str, new_key: str = "") -> KVCommand:
    return KVCommand(op, key, REPLY, new_key)


def apply_all(index: ResidencyIndex, *items: KVEvent | KVCommand, now: float = NOW) -> Effects:
    fx = Effects()
    for item in items:
        fx.merge(index.apply(item, now))
    return fx


def spill_order(key: str, worker: str = W0) -> Order:
    return Order(worker, "spill_session", {"key": key})


def fork_args() -> dict[str, str]:
    return {"key": S1, "new_key": S2, "r": REPLY}


def on_disk(key: str, last_used: float, size: int, mtime_ns: int) -> ResidencyIndex:
    """An index holding one session on disk (spilled by W0, which is still alive)."""
    index = make_index()
    apply_all(index, warm(key, last_used), disk(key, size, mtime_ns))
    assert index.records[key].tier == "disk"
    return index


# ---- warm budget --------------------------------------------------------------------


def test_hot_then_warm_leaves_a_warm_record_on_the_worker() -> None:
    index = make_index()
    index.apply(hot(S1, 1.0, nbytes=60))
    fx = index.apply(warm(S1, 2.0, nbytes=80))
    assert index.records[S1] == Record("warm", W0, TOKENS, 80, 2.0)
    assert fx.upserts == {S1: index.records[S1]} and not fx.orders
    assert index.on_worker(W0) == [S1] and index.warm_bytes(W0) == 80


def test_warm_over_budget_spills_least_recently_used_first_never_hot() -> None:
    index = make_index({W0: 300})
    events = [hot(S4, 0.5, nbytes=1000), warm(S2, 2.0), warm(S1, 1.0), warm(S3, 3.0)]
    for e in events:  # arrival order differs from last_used order on purpose
        assert not index.apply(e).orders
        assert index.warm_bytes(W0) <= 300
    fx = index.apply(warm("local/s5", 4.0, nbytes=150))  # 450 warm bytes: two must go
    assert fx.orders == [spill_order(S1), spill_order(S2)]
    assert fx.counters == {"evictions_ordered": 2}
    assert [index.records[k].tier for k in (S1, S2, S3, S4)] == ["spilling"] * 2 + ["warm", "hot"]
    assert fx.upserts[S1] == Record("spilling", W0, TOKENS, 100, 1.0)
    assert index.warm_bytes(W0) == 250


def test_set_workers_brings_warm_bytes_within_a_lowered_budget() -> None:
    index = make_index({W0: 1000})
    apply_all(index, warm(S1, 2.0), warm(S2, 1.0), warm(S3, 3.0))
    fx = index.set_workers({W0: 150})
    assert fx.orders == [spill_order(S2), spill_order(S1)]
    assert index.warm_bytes(W0) == 100


def test_inventory_over_budget_orders_spills() -> None:
    index = make_index({W0: 150})
    held = [Held(S1, "warm", TOKENS, 100, 2.0), Held(S2, "warm", TOKENS, 100, 1.0)]
    fx = index.apply(inventory_event(W0, held, NOW))
    assert fx.orders == [spill_order(S2)] and index.records[S2].tier == "spilling"
    assert index.warm_bytes(W0) == 100


# ---- disk events and failures -------------------------------------------------------


def test_disk_event_from_the_holder_moves_the_session_to_disk() -> None:
    index = make_index()
    index.apply(warm(S1, 1.0))
    fx = index.apply(disk(S1, size=80, mtime_ns=555))
    assert index.records[S1] == Record("disk", "", TOKENS, 80, 1.0, 555)  # keeps last_used
    assert fx.counters == {"spills": 1} and fx.upserts == {S1: index.records[S1]}
    assert index.disk_bytes == 80 and index.on_worker(W0) == []


def test_late_disk_event_from_the_previous_worker_leaves_the_record_and_drops_its_file() -> None:
    index = make_index({W0: BIG_BUDGET, W1: BIG_BUDGET})
    apply_all(index, warm(S1, 1.0), hot(S1, 2.0, worker=W1, came_from="disk"))
    fx = index.apply(disk(S1, size=80, mtime_ns=555, worker=W0))
    assert index.records[S1] == Record("hot", W1, TOKENS, 100, 2.0)
    assert fx.counters == {"spills": 1} and not fx.upserts
    assert fx.unlink == [(S1, 555)]  # that file only: a newer one has another mtime
    assert index.disk_bytes == 0 and index.on_worker(W1) == [S1]


def test_a_second_copy_on_another_worker_is_forgotten() -> None:
    index = make_index({W0: BIG_BUDGET, W1: BIG_BUDGET})
    index.apply(warm(S1, 1.0))  # on w0
    fx = index.apply(hot(S1, 2.0, worker=W1, came_from="none"))  # routed elsewhere
    assert fx.orders == [Order(W0, "forget_session", {"key": S1})]
    assert index.records[S1].worker == W1 and index.on_worker(W0) == []


def test_inventory_keeps_the_newer_of_two_copies() -> None:
    index = make_index({W0: BIG_BUDGET, W1: BIG_BUDGET})
    index.apply(warm(S1, 5.0, worker=W1))
    older = inventory_event(W0, [Held(S1, "warm", TOKENS, 100, 4.0)], 9.0)
    fx = index.apply(older)
    assert fx.orders == [Order(W0, "forget_session", {"key": S1})]
    assert index.records[S1].worker == W1
    newer = inventory_event(W0, [Held(S1, "warm", TOKENS, 100, 6.0)], 9.0)
    fx = index.apply(newer)
    assert fx.orders == [Order(W1, "forget_session", {"key": S1})]
    assert index.records[S1] == Record("warm", W0, TOKENS, 100, 6.0)


def test_restore_from_disk_is_counted_and_frees_disk_bytes() -> None:
    index = on_disk(S1, 1.0, size=80, mtime_ns=555)
    fx = index.apply(hot(S1, 2.0, worker=W0, came_from="disk"))
    assert fx.counters == {"restores": 1}
    assert index.records[S1] == Record("hot", W0, TOKENS, 100, 2.0) and index.disk_bytes == 0
    assert index.apply(hot(S1, 3.0, came_from="pool")).counters == {}


@pytest.mark.parametrize(
    ("reason", "counters"),
    [
        (ev.REJECTED, {"rejected_files": 1}),
        (ev.WRITE_FAILED, {"failed_writes": 1}),
        (ev.DROPPED, {}),
    ],
)
def test_gone_event_sets_gone_and_counts_its_reason(reason: str, counters: dict[str, int]) -> None:
    index = make_index()
    index.apply(warm(S1, 1.0))
    fx = index.apply(gone(S1, reason))
    assert index.records[S1] == Record("gone", "", 0, 0, 1.0)
    assert fx.counters == counters and index.on_worker(W0) == []


def test_gone_from_a_worker_that_no_longer_holds_the_session_is_ignored() -> None:
    index = make_index({W0: BIG_BUDGET, W1: BIG_BUDGET})
    apply_all(index, warm(S1, 1.0, worker=W1))
    fx = index.apply(gone(S1, ev.WRITE_FAILED, worker=W0))
    assert index.records[S1].tier == "warm" and not fx.upserts
    assert fx.counters == {"failed_writes": 1}


# ---- disk budget --------------------------------------------------------------------


def test_disk_budget_unlinks_least_recently_used_files() -> None:
    index = make_index(disk_budget=250)
    apply_all(index, warm(S1, 3.0), warm(S2, 1.0), warm(S3, 2.0))
    fx = apply_all(index, disk(S1, 100, mtime_ns=11), disk(S2, 100, mtime_ns=12))
    assert not fx.unlink and index.disk_bytes == 200
    fx = index.apply(disk(S3, 200, mtime_ns=13))  # 400 bytes: S2 then S3 are older than S1
    assert fx.unlink == [(S2, 12), (S3, 13)]
    assert fx.counters == {"spills": 1, "budget_deletions": 2}
    assert index.records[S2] == Record("gone", "", 0, 0, 1.0)
    assert [index.records[k].tier for k in (S1, S2, S3)] == ["disk", "gone", "gone"]
    assert index.disk_bytes == 100


# ---- workers leaving, inventories ---------------------------------------------------


def test_sessions_of_a_departed_worker_move_to_their_file_or_gone() -> None:
    index = make_index({W0: BIG_BUDGET, W1: BIG_BUDGET}, files={S1: (70, 777)})
    apply_all(index, warm(S1, 1.0), hot(S2, 2.0), warm(S3, 3.0, worker=W1))
    fx = index.set_workers({W1: BIG_BUDGET})
    assert fx.upserts == {
        S1: Record("disk", "", TOKENS, 70, 1.0, 777),
        S2: Record("gone", "", 0, 0, 2.0),
    }
    assert index.records[S3] == Record("warm", W1, TOKENS, 100, 3.0)
    assert index.on_worker(W0) == [] and index.disk_bytes == 70


def test_files_of_a_departed_worker_count_against_the_disk_budget() -> None:
    files = {S1: (100, 1), S2: (100, 2)}
    index = make_index({W0: BIG_BUDGET}, files=files, disk_budget=150)
    apply_all(index, warm(S1, 1.0), warm(S2, 2.0))
    fx = index.set_workers({})
    assert fx.unlink == [(S1, 1)] and index.disk_bytes <= 150


def test_inventory_is_the_workers_whole_truth() -> None:
    index = make_index(files={S1: (70, 777)})
    apply_all(index, warm(S1, 1.0), warm(S2, 2.0), hot(S3, 3.0))
    held = [Held(S3, "warm", 12, 90, 4.0), Held(S4, "hot", 0, 0, 5.0)]
    fx = index.apply(inventory_event(W0, held, NOW))
    assert fx.upserts == {
        S1: Record("disk", "", TOKENS, 70, 1.0, 777),
        S2: Record("gone", "", 0, 0, 2.0),
        S3: Record("warm", W0, 12, 90, 4.0),
        S4: Record("hot", W0, 0, 0, 5.0),
    }
    assert index.on_worker(W0) == [S3, S4] and index.disk_bytes == 70


# ---- commands -----------------------------------------------------------------------


def test_delete_on_a_live_worker_orders_a_drop_and_lets_the_worker_answer() -> None:
    index = make_index()
    index.apply(warm(S1, 1.0))
    fx = index.apply(command(ev.DELETE, S1))
    assert S1 not in index.records and fx.removals == {S1} and not fx.upserts
    assert fx.orders == [Order(W0, "drop_session", {"key": S1, "r": REPLY})]
    assert not fx.replies and not fx.unlink and index.on_worker(W0) == []


def test_delete_on_disk_unlinks_and_answers_ok() -> None:
    index = on_disk(S1, 1.0, size=80, mtime_ns=555)
    fx = index.apply(command(ev.DELETE, S1))
    assert fx.unlink == [(S1, 0)] and fx.replies == [(REPLY, "ok")] and not fx.orders
    assert fx.removals == {S1} and index.disk_bytes == 0


def test_delete_on_a_worker_not_alive_unlinks_and_answers_ok() -> None:
    index = make_index({W0: BIG_BUDGET})
    index.apply(warm(S1, 1.0, worker=W1))  # W1's heartbeat is not (yet) seen
    fx = index.apply(command(ev.DELETE, S1))
    assert fx.unlink == [(S1, 0)] and fx.replies == [(REPLY, "ok")] and not fx.orders
    assert S1 not in index.records and index.on_worker(W1) == []


def test_delete_of_an_unknown_session_answers_not_found() -> None:
    fx = make_index().apply(command(ev.DELETE, S1))
    assert fx.replies == [(REPLY, "not_found")] and not fx.removals and not fx.unlink


def test_late_events_of_a_deleted_session_do_not_bring_it_back() -> None:
    index = make_index()
    index.apply(warm(S1, 1.0))
    index.apply(command(ev.DELETE, S1), now=time.time())
    index.set_workers({W0: BIG_BUDGET})  # the periodic refresh keeps recent tombstones
    late = [
        warm(S1, 2.0),
        gone(S1, ev.DROPPED),
        inventory_event(W0, [Held(S1, "warm", 1, 1, 2.0)], NOW),
    ]
    assert not apply_all(index, *late).upserts and S1 not in index.records
    fx = index.apply(disk(S1, 80, mtime_ns=555))  # written before the drop arrived
    assert fx.unlink == [(S1, 555)] and not fx.upserts and index.disk_bytes == 0
    fx = index.apply(hot(S1, 3.0))  # a new request: the session lives again
    assert index.records[S1] == Record("hot", W0, TOKENS, 100, 3.0) == fx.upserts[S1]


def test_fork_answers_not_found_and_exists() -> None:
    index = make_index()
    assert index.apply(command(ev.FORK, S1, S2)).replies == [(REPLY, "not_found")]
    apply_all(index, warm(S1, 1.0), warm(S2, 2.0))
    fx = index.apply(command(ev.FORK, S1, S2), NOW)
    assert fx.replies == [(REPLY, "exists")] and not fx.orders and not fx.upserts
    assert index.records[S2] == Record("warm", W0, TOKENS, 100, 2.0)


def test_fork_of_a_session_on_a_live_worker_is_copied_there() -> None:
    index = make_index()
    index.apply(warm(S1, 1.0, nbytes=70))
    fx = index.apply(command(ev.FORK, S1, S2), NOW)
    assert index.records[S2] == Record("warm", W0, TOKENS, 70, NOW) == fx.upserts[S2]
    assert fx.orders == [Order(W0, "fork_session", fork_args())] and not fx.replies
    assert index.on_worker(W0) == [S1, S2]


def test_fork_of_a_session_on_disk_goes_to_any_worker() -> None:
    index = on_disk(S1, 1.0, size=80, mtime_ns=555)
    fx = index.apply(command(ev.FORK, S1, S2), NOW)
    assert fx.orders == [Order("", "fork_session", fork_args())] and not fx.replies
    assert index.records[S2] == Record("gone", "", 0, 0, NOW)
    assert index.records[S1].tier == "disk" and index.disk_bytes == 80


def test_fork_of_a_gone_session_answers_at_once() -> None:
    index = make_index()
    apply_all(index, warm(S1, 1.0), gone(S1, ev.DROPPED))
    fx = index.apply(command(ev.FORK, S1, S2), NOW)
    assert fx.replies == [(REPLY, "ok")] and not fx.orders
    assert index.records[S2] == Record("gone", "", 0, 0, NOW) == fx.upserts[S2]


def test_evict_orders_a_spill_of_a_warm_session() -> None:
    index = make_index()
    index.apply(warm(S1, 1.0))
    fx = index.apply(command(ev.EVICT, S1))
    assert fx.orders == [spill_order(S1)] and fx.replies == [(REPLY, "spilling")]
    assert index.records[S1] == Record("spilling", W0, TOKENS, 100, 1.0) == fx.upserts[S1]
    assert index.warm_bytes(W0) == 0


@pytest.mark.parametrize(("events", "answer"), [([hot(S1, 1.0)], "hot"), ([], "not_found")])
def test_evict_of_a_session_not_warm_only_answers(events: list[KVEvent], answer: str) -> None:
    index = make_index()
    apply_all(index, *events)
    fx = index.apply(command(ev.EVICT, S1))
    assert fx.replies == [(REPLY, answer)] and not fx.orders and not fx.upserts


def test_unknown_command_answers_an_error() -> None:
    fx = make_index().apply(command("rename", S1))
    assert len(fx.replies) == 1 and fx.replies[0][0] == REPLY
    assert fx.replies[0][1].startswith("error")


# ---- disk reconciliation ------------------------------------------------------------


def test_reconcile_disk_matches_records_with_the_files_found() -> None:
    index = on_disk(S1, 1.0, size=80, mtime_ns=555)
    apply_all(index, warm(S2, 2.0), warm(S3, 3.0), gone(S3, ev.DROPPED))
    files = {S2: (60, 6_000_000_000, 5), S3: (70, 7_000_000_000, 7), S4: (90, 9_000_000_000, 9)}
    fx = index.reconcile_disk(files)
    assert fx.upserts == {
        S1: Record("gone", "", TOKENS, 0, 1.0),
        S3: Record("disk", "", 7, 70, 3.0, 7_000_000_000),  # keeps the record's last_used
        S4: Record("disk", "", 9, 90, 9.0, 9_000_000_000),  # last_used from the file
    }
    assert index.records[S2].tier == "warm"  # in memory: its file is not the truth
    assert index.disk_bytes == 160


# ---- effects and records ------------------------------------------------------------


def test_effects_merge_keeps_the_latest_change_of_each_key_and_adds_counters() -> None:
    first, second = Record("warm", W0, 1, 10, 1.0), Record("disk", "", 1, 20, 1.0, 5)
    fx = Effects(upserts={S1: first, S2: first}, removals={S3}, counters={"spills": 1})
    fx.orders.append(spill_order(S1))
    fx.unlink.append((S4, 1))
    fx.replies.append((REPLY, "ok"))
    later = Effects(upserts={S1: second, S3: second}, removals={S2})
    later.counters.update({"spills": 2, "restores": 1})
    later.orders.append(spill_order(S2))
    later.unlink.append((S4, 2))
    later.replies.append(("reply:2", "hot"))
    fx.merge(later)
    assert fx.upserts == {S1: second, S3: second} and fx.removals == {S2}
    assert fx.counters == {"spills": 3, "restores": 1}
    assert fx.orders == [spill_order(S1), spill_order(S2)]
    assert fx.unlink == [(S4, 1), (S4, 2)]
    assert fx.replies == [(REPLY, "ok"), ("reply:2", "hot")]


def test_record_fields_round_trip() -> None:
    record = Record("disk", "", 12, 3456, 1700000000.125, 42)
    assert Record.from_fields(record.to_fields()) == record
    assert Record.from_fields({}).tier == "gone"


def test_inventory_copy_older_than_the_file_is_forgotten_and_a_newer_one_replaces_it() -> None:
    index = on_disk(S1, 5.0, size=80, mtime_ns=555)
    older = inventory_event(W0, [Held(S1, "warm", TOKENS, 100, 4.0)], 9.0)
    fx = index.apply(older)
    assert fx.orders == [Order(W0, "forget_session", {"key": S1})]
    assert index.records[S1].tier == "disk" and not fx.unlink
    newer = inventory_event(W0, [Held(S1, "warm", TOKENS, 100, 6.0)], 9.0)
    fx = index.apply(newer)
    assert fx.unlink == [(S1, 555)] and not fx.orders
    assert index.records[S1] == Record("warm", W0, TOKENS, 100, 6.0) and index.disk_bytes == 0


def test_the_event_that_completes_a_command_answers_it_once_applied() -> None:
    index = make_index({W0: BIG_BUDGET})
    index.apply(warm(S1, 1.0))
    done = KVEvent(ev.WARM, W0, S2, TOKENS, 100, 2.0, reply_to="wf:reply:x")
    fx = index.apply(done)
    assert fx.replies == [("wf:reply:x", "ok")] and index.records[S2].tier == "warm"
    assert KVEvent.decode(done.encode()) == done


def test_a_dropped_copy_does_not_forget_the_file_written_since() -> None:
    # w0 evicted s1 by itself (kvstore down) and reported the file; a spill order sent
    # before that event was applied finds nothing in w0's pool and says so
    index = on_disk(S1, 1.0, size=80, mtime_ns=555)
    index.apply(KVEvent(ev.GONE, W0, S1, last_used=2.0, detail=ev.DROPPED))
    assert index.records[S1].tier == "disk"
    index.apply(KVEvent(ev.GONE, W1, S1, last_used=3.0, detail=ev.REJECTED))
    assert index.records[S1].tier == "gone"  # the file itself failed its checks
