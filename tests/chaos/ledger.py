"""The fault matrix's per-message ledger: what producers were told against what each group got.

Failures (any one fails the run):
- LOST: an accepted item (``queued``, ``duplicate`` or ``buffered``) never delivered to a
  group; in the autoAck group, only beyond what its pops of unknown outcome can explain (an
  answer cut, or ``503 timeout``/``outcome_unknown``: an autoAck pop commits its cursor before
  answering, so such a pop may take up to a batch with it, the documented at-most-once
  meaning of autoAck);
- DUPLICATED: a message delivered again after a successful ack of its earlier delivery (manual
  group), or delivered twice at all (autoAck group);
- WRONG ID: delivered under another messageId than its push answer gave;
- PHANTOM: delivered, but no push of it was accepted or left without an answer;
- OFFSETS: a partition's stored segments do not tile its offsets (bench/ledger.py);
- REORDERED: an item stored at a lower offset than an item its producer had sent earlier to
  the same partition and had been answered ``queued`` or ``duplicate`` for (a producer sends
  its next request only once the last one is answered, so the earlier one was committed);
- AFTER A BUFFERED ONE: an item stored at a lower offset than an item its producer had sent
  earlier to the same partition and had been answered ``buffered`` for (the broker keeps a
  producer's order across its spools: queen_mp/front/spoolhold.py);
- OUT OF ORDER: a group received a partition's messages (first deliveries) out of offset order.
Counted, not failures: redeliveries after a delivery whose ack did not succeed (its lease
expired) and items whose every attempt failed until the run gave up (``unanswered``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from tests.chaos.workload import ACCEPTED, Consumer, Delivery, Pushed

__all__ = ["GroupVerdict", "Order", "Verdict", "judge"]

POP_BATCH = 10


@dataclass
class GroupVerdict:
    group: str
    delivered: int = 0  # distinct messages
    redelivered: int = 0  # explained repeats
    lost: int = 0
    lost_explained: int = 0  # autoAck only: within the cut pops' reach
    duplicated: int = 0
    wrong_id: int = 0
    phantom: int = 0
    out_of_order: int = 0  # first deliveries of a partition below one delivered before
    examples: list[str] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return self.lost + self.duplicated + self.wrong_id + self.phantom + self.out_of_order

    def example(self, text: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(text)


@dataclass
class Verdict:
    accepted: int
    by_status: dict[str, int]
    unanswered: int
    groups: list[GroupVerdict]
    offsets: dict[str, Any]
    errors: dict[str, int]
    cut: dict[str, int]
    order: Order

    @property
    def ok(self) -> bool:
        return (all(g.failures == 0 for g in self.groups) and bool(self.offsets.get("ok"))
                and self.order.reordered == 0 and self.order.after_buffered == 0)

    def summary(self) -> str:
        parts = [f"accepted {self.accepted} {self.by_status}, unanswered {self.unanswered}"]
        for g in self.groups:
            parts.append(f"{g.group}: delivered {g.delivered}, redelivered {g.redelivered}, "
                         f"lost {g.lost} (+{g.lost_explained} explained), duplicated "
                         f"{g.duplicated}, wrong id {g.wrong_id}, phantom {g.phantom}, out "
                         f"of order {g.out_of_order} {g.examples}")
        parts.append(f"offsets: {self.offsets.get('verdict')}")
        parts.append(f"order: reordered {self.order.reordered}, after a buffered one "
                     f"{self.order.after_buffered} {self.order.examples}")
        parts.append(f"client errors {self.errors}, cut {self.cut}")
        return "; ".join(parts)


def judge(pushed: list[Pushed], consumers: list[Consumer], offsets: dict[str, Any],
          errors: Counter[str], cut: Counter[str]) -> Verdict:
    final: dict[str, Pushed] = {}
    for p in pushed:
        final[f"{p.producer}-{p.seq}"] = p
    by_status = Counter(p.status for p in final.values())
    accepted = {t: p for t, p in final.items() if p.status in ACCEPTED}
    groups = []
    for c in consumers:
        groups.append(_judge_group(c, accepted, final, cut.get(f"pop/{c.group}", 0)))
    return Verdict(len(accepted), dict(by_status), by_status.get("unanswered", 0), groups,
                   offsets, dict(errors), dict(cut), _store_order(accepted, consumers))


@dataclass
class Order:
    """Items stored below an item their producer sent earlier to the same partition."""

    reordered: int = 0  # the earlier one answered queued or duplicate: a failure
    after_buffered: int = 0  # the earlier one answered buffered: a failure too
    examples: list[str] = field(default_factory=list)


def _store_order(accepted: dict[str, Pushed], consumers: list[Consumer]) -> Order:
    """Per producer and partition, in send order, each item's offset against the highest of
    the items sent before it (offsets as delivered: an item never delivered is LOST already)."""
    where: dict[str, tuple[str, int]] = {}
    for c in consumers:
        for d in c.deliveries:
            where.setdefault(d.transaction_id, (d.partition_id, d.offset))
    streams: dict[tuple[str, str], list[tuple[int, int, bool]]] = {}
    for txn, p in accepted.items():
        if txn in where:
            pid, offset = where[txn]
            streams.setdefault((p.producer, pid), []).append(
                (p.seq, offset, p.status == "buffered"))
    order = Order()
    for (producer, pid), items in streams.items():
        top_direct = top_buffered = -1
        for seq, offset, buffered in sorted(items):
            if offset < top_direct:
                order.reordered += 1
                if len(order.examples) < 5:
                    order.examples.append(f"{producer}-{seq} at {pid}/{offset}, below "
                                          f"{top_direct} sent earlier")
            elif offset < top_buffered:
                order.after_buffered += 1
                if len(order.examples) < 5:
                    order.examples.append(f"{producer}-{seq} at {pid}/{offset}, below "
                                          f"{top_buffered} answered buffered earlier")
            if buffered:
                top_buffered = max(top_buffered, offset)
            else:
                top_direct = max(top_direct, offset)
    return order


def _judge_group(c: Consumer, accepted: dict[str, Pushed], final: dict[str, Pushed],
                 cut_pops: int) -> GroupVerdict:
    v = GroupVerdict(c.group)
    seen: dict[str, list[Delivery]] = {}
    for d in c.deliveries:
        seen.setdefault(d.transaction_id, []).append(d)
    high: dict[str, int] = {}  # per partition, the highest offset delivered so far
    for d in c.deliveries:
        if d.offset < high.get(d.partition_id, -1) and seen[d.transaction_id][0] is d:
            v.out_of_order += 1
            v.example(f"out of order {d.transaction_id} at {d.partition_id}/{d.offset}, after "
                      f"offset {high[d.partition_id]}")
        high[d.partition_id] = max(high.get(d.partition_id, -1), d.offset)
    for txn, ds in seen.items():
        p = final.get(txn)
        if p is None or p.status not in ACCEPTED | {"unanswered"}:
            v.phantom += 1
            v.example(f"phantom {txn} ({p.status if p else 'never pushed'})")
            continue
        v.delivered += 1
        if p.status in ACCEPTED and any(d.message_id != p.message_id for d in ds):
            v.wrong_id += 1
            v.example(f"wrong id {txn}: answered {p.message_id}, delivered "
                      f"{sorted({d.message_id for d in ds})}")
        for before, again in pairwise(ds):
            if c.auto_ack or (before.transaction_id, str(before.lease_id)) in c.acked:
                v.duplicated += 1
                after = "an autoAck delivery" if c.auto_ack else "a successful ack"
                v.example(f"duplicate {txn} at {again.partition_id}/{again.offset} "
                          f"(attempt {again.attempt}) after {after}")
            else:
                v.redelivered += 1
    missing = [t for t in accepted if t not in seen]
    allowed = cut_pops * POP_BATCH if c.auto_ack else 0
    v.lost_explained = min(len(missing), allowed)
    v.lost = len(missing) - v.lost_explained
    for t in missing[:3] if v.lost else []:
        v.example(f"lost {t} ({accepted[t].status}, partition {accepted[t].partition})")
    return v
