"""The commands the kvstore carries out for callers (DeleteSession, ForkSession, Evict):
each answered exactly once, at once or when the worker's completing event is applied."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from broker.messages import AnswerStatus, CommandAnswer, CommandOp, ControlOrder, KVCommand, OrderOp
from broker.records import SessionRecord
from common.enums import Tier
from kvstore.budgets import enforce_warm_budget, order_spill
from kvstore.effects import Effects, Order

if TYPE_CHECKING:
    from kvstore.index import ResidencyIndex

log = logging.getLogger("warmfleet.kvstore")
OK = CommandAnswer(AnswerStatus.OK)
NOT_FOUND = CommandAnswer(AnswerStatus.NOT_FOUND)


def carry_out(index: ResidencyIndex, c: KVCommand, fx: Effects, now: float) -> None:
    if c.deadline and now > c.deadline:
        log.warning("%s %s dropped: its caller gave up %.1f s ago", c.op, c.key, now - c.deadline)
        return
    HANDLERS[c.op](index, c, fx, now)


def delete(index: ResidencyIndex, c: KVCommand, fx: Effects, now: float) -> None:
    record = index.records.get(c.key)
    if record is None:
        fx.replies.append((c.reply_to, NOT_FOUND))
        return
    index.remove(fx, c.key)
    index.tombstones[c.key] = now
    if record.worker in index.alive:  # it drops the KV and its file, then answers
        order = ControlOrder(OrderOp.DROP, c.key, reply_to=c.reply_to)
        fx.orders.append(Order(record.worker, order))
    else:
        fx.unlink.append((c.key, 0))
        fx.replies.append((c.reply_to, OK))


def fork(index: ResidencyIndex, c: KVCommand, fx: Effects, now: float) -> None:
    source = index.records.get(c.key)
    if source is None:
        fx.replies.append((c.reply_to, NOT_FOUND))
        return
    if c.new_key in index.records:
        fx.replies.append((c.reply_to, CommandAnswer(AnswerStatus.EXISTS)))
        return
    index.tombstones.pop(c.new_key, None)
    order = ControlOrder(OrderOp.FORK, c.key, c.new_key, c.reply_to)
    if source.worker in index.alive:  # the worker copies the KV, then answers
        record = SessionRecord(Tier.WARM, source.worker, source.num_tokens, source.nbytes, now)
        index.put(fx, c.new_key, record)
        fx.orders.append(Order(source.worker, order))  # before any spill
        enforce_warm_budget(index, source.worker, fx)
    elif source.tier == Tier.DISK:  # any worker of the host restores it and copies
        index.put(fx, c.new_key, SessionRecord(Tier.GONE, "", 0, 0, now))
        fx.orders.append(Order("", order))
    else:
        index.put(fx, c.new_key, SessionRecord(Tier.GONE, "", 0, 0, now))
        fx.replies.append((c.reply_to, OK))


def evict(index: ResidencyIndex, c: KVCommand, fx: Effects, now: float) -> None:
    record = index.records.get(c.key)
    if record is None:
        fx.replies.append((c.reply_to, NOT_FOUND))
        return
    if record.tier == Tier.WARM and record.worker in index.alive:
        order_spill(index, c.key, fx)
        fx.replies.append((c.reply_to, CommandAnswer(AnswerStatus.OK, Tier.SPILLING)))
    else:
        fx.replies.append((c.reply_to, CommandAnswer(AnswerStatus.OK, record.tier)))


HANDLERS = {CommandOp.DELETE: delete, CommandOp.FORK: fork, CommandOp.EVICT: evict}
