"""The residency index's commands (delete, fork, evict) and its effects and records."""

from __future__ import annotations

import time

import pytest

from broker.messages import (
    AnswerStatus,
    CommandAnswer,
    CommandOp,
    ControlOrder,
    GoneReason,
    Held,
    OrderOp,
    SessionEvent,
)
from broker.records import SessionRecord as Record
from common.enums import Tier
from kvstore.effects import Effects, Order
from tests.unit.kv_index_helpers import (
    BIG_BUDGET,
    NOW,
    REPLY,
    S1,
    S2,
    S3,
    S4,
    TOKENS,
    W0,
    W1,
    answer,
    apply_all,
    command,
    disk,
    fork_order,
    gone,
    hot,
    inventory,
    make_index,
    on_disk,
    spill_order,
    warm,
)

# ---- commands -----------------------------------------------------------------------


def test_delete_on_a_live_worker_orders_a_drop_and_lets_the_worker_answer() -> None:
    index = make_index()
    index.apply(warm(S1, 1.0))
    fx = index.apply(command(CommandOp.DELETE, S1))
    assert S1 not in index.table.records and fx.removals == {S1} and not fx.upserts
    assert fx.orders == [Order(W0, ControlOrder(OrderOp.DROP, S1, reply_to=REPLY))]
    assert not fx.replies and not fx.unlink and index.table.on_worker(W0) == []


def test_delete_on_disk_unlinks_and_answers_ok() -> None:
    index = on_disk(S1, 1.0, size=80, mtime_ns=555)
    fx = index.apply(command(CommandOp.DELETE, S1))
    assert (
        fx.unlink == [(S1, 0)]
        and fx.replies == [(REPLY, answer(AnswerStatus.OK))]
        and not fx.orders
    )
    assert fx.removals == {S1} and index.table.disk.used == 0


def test_delete_on_a_worker_not_alive_unlinks_and_answers_ok() -> None:
    index = make_index({W0: BIG_BUDGET})
    index.apply(warm(S1, 1.0, worker=W1))  # W1's heartbeat is not (yet) seen
    fx = index.apply(command(CommandOp.DELETE, S1))
    assert (
        fx.unlink == [(S1, 0)]
        and fx.replies == [(REPLY, answer(AnswerStatus.OK))]
        and not fx.orders
    )
    assert S1 not in index.table.records and index.table.on_worker(W1) == []


def test_delete_of_an_unknown_session_answers_not_found() -> None:
    fx = make_index().apply(command(CommandOp.DELETE, S1))
    assert (
        fx.replies == [(REPLY, answer(AnswerStatus.NOT_FOUND))]
        and not fx.removals
        and not fx.unlink
    )


def test_late_events_of_a_deleted_session_do_not_bring_it_back() -> None:
    index = make_index()
    index.apply(warm(S1, 1.0))
    index.apply(command(CommandOp.DELETE, S1), now=time.time())
    index.set_workers({W0: BIG_BUDGET})  # the periodic refresh keeps recent tombstones
    late = [
        warm(S1, 2.0),
        gone(S1, GoneReason.DROPPED),
        inventory(W0, [Held(S1, "warm", 1, 1, 2.0)], NOW),
    ]
    assert not apply_all(index, *late).upserts and S1 not in index.table.records
    fx = index.apply(disk(S1, 80, mtime_ns=555))  # written before the drop arrived
    assert fx.unlink == [(S1, 555)] and not fx.upserts and index.table.disk.used == 0
    fx = index.apply(hot(S1, 3.0))  # a new request: the session lives again
    assert index.table.records[S1] == Record(Tier.HOT, W0, TOKENS, 100, 3.0) == fx.upserts[S1]


def test_fork_answers_not_found_and_exists() -> None:
    index = make_index()
    assert index.apply(command(CommandOp.FORK, S1, S2)).replies == [
        (REPLY, answer(AnswerStatus.NOT_FOUND))
    ]
    apply_all(index, warm(S1, 1.0), warm(S2, 2.0))
    fx = index.apply(command(CommandOp.FORK, S1, S2), NOW)
    assert fx.replies == [(REPLY, answer(AnswerStatus.EXISTS))] and not fx.orders and not fx.upserts
    assert index.table.records[S2] == Record(Tier.WARM, W0, TOKENS, 100, 2.0)


def test_fork_of_a_session_on_a_live_worker_is_copied_there() -> None:
    index = make_index()
    index.apply(warm(S1, 1.0, nbytes=70))
    fx = index.apply(command(CommandOp.FORK, S1, S2), NOW)
    assert index.table.records[S2] == Record(Tier.WARM, W0, TOKENS, 70, NOW) == fx.upserts[S2]
    assert fx.orders == [fork_order(W0)] and not fx.replies
    assert index.table.on_worker(W0) == [S1, S2]


def test_fork_of_a_session_on_disk_goes_to_any_worker() -> None:
    index = on_disk(S1, 1.0, size=80, mtime_ns=555)
    fx = index.apply(command(CommandOp.FORK, S1, S2), NOW)
    assert fx.orders == [fork_order("")] and not fx.replies
    assert index.table.records[S2] == Record(Tier.GONE, "", 0, 0, NOW)
    assert index.table.records[S1].tier == "disk" and index.table.disk.used == 80


def test_fork_of_a_gone_session_answers_at_once() -> None:
    index = make_index()
    apply_all(index, warm(S1, 1.0), gone(S1, GoneReason.DROPPED))
    fx = index.apply(command(CommandOp.FORK, S1, S2), NOW)
    assert fx.replies == [(REPLY, answer(AnswerStatus.OK))] and not fx.orders
    assert index.table.records[S2] == Record(Tier.GONE, "", 0, 0, NOW) == fx.upserts[S2]


def test_evict_orders_a_spill_of_a_warm_session() -> None:
    index = make_index()
    index.apply(warm(S1, 1.0))
    fx = index.apply(command(CommandOp.EVICT, S1))
    assert fx.orders == [spill_order(S1)] and fx.replies == [
        (REPLY, answer(AnswerStatus.OK, Tier.SPILLING))
    ]
    assert index.table.records[S1] == Record(Tier.SPILLING, W0, TOKENS, 100, 1.0) == fx.upserts[S1]
    assert index.table.warm_bytes(W0) == 0


@pytest.mark.parametrize(
    ("events", "expected"),
    [([hot(S1, 1.0)], answer(AnswerStatus.OK, Tier.HOT)), ([], answer(AnswerStatus.NOT_FOUND))],
)
def test_evict_of_a_session_not_warm_only_answers(
    events: list[SessionEvent], expected: CommandAnswer
) -> None:
    index = make_index()
    apply_all(index, *events)
    fx = index.apply(command(CommandOp.EVICT, S1))
    assert fx.replies == [(REPLY, expected)] and not fx.orders and not fx.upserts


# ---- effects and records ------------------------------------------------------------


def test_effects_merge_keeps_the_latest_change_of_each_key_and_adds_counters() -> None:
    first, second = Record(Tier.WARM, W0, 1, 10, 1.0), Record(Tier.DISK, "", 1, 20, 1.0, 5)
    fx = Effects(upserts={S1: first, S2: first}, removals={S3}, counters={"spills": 1})
    fx.orders.append(spill_order(S1))
    fx.unlink.append((S4, 1))
    fx.replies.append((REPLY, answer(AnswerStatus.OK)))
    later = Effects(upserts={S1: second, S3: second}, removals={S2})
    later.counters.update({"spills": 2, "restores": 1})
    later.orders.append(spill_order(S2))
    later.unlink.append((S4, 2))
    later.replies.append(("reply:2", answer(AnswerStatus.OK, Tier.HOT)))
    fx.merge(later)
    assert fx.upserts == {S1: second, S3: second} and fx.removals == {S2}
    assert fx.counters == {"spills": 3, "restores": 1}
    assert fx.orders == [spill_order(S1), spill_order(S2)]
    assert fx.unlink == [(S4, 1), (S4, 2)]
    assert fx.replies == [
        (REPLY, answer(AnswerStatus.OK)),
        ("reply:2", answer(AnswerStatus.OK, Tier.HOT)),
    ]


def test_record_fields_round_trip() -> None:
    record = Record(Tier.DISK, "", 12, 3456, 1700000000.125, 42)
    assert Record.from_fields(record.to_fields()) == record
    assert Record.from_fields({}).tier == "gone"
