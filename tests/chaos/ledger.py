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
- OFFSETS: a partition's stored segments do not tile its offsets (bench/ledger.py).
Counted, not failures: redeliveries after a delivery whose ack did not succeed (its lease
expired), and items whose every attempt failed until the run gave up (``unanswered``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from tests.chaos.workload import ACCEPTED, Consumer, Delivery, Pushed

__all__ = ["GroupVerdict", "Verdict", "judge"]

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
    examples: list[str] = field(default_factory=list)

    @property
    def failures(self) -> int:
        return self.lost + self.duplicated + self.wrong_id + self.phantom

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

    @property
    def ok(self) -> bool:
        return all(g.failures == 0 for g in self.groups) and bool(self.offsets.get("ok"))

    def summary(self) -> str:
        parts = [f"accepted {self.accepted} {self.by_status}, unanswered {self.unanswered}"]
        for g in self.groups:
            parts.append(f"{g.group}: delivered {g.delivered}, redelivered {g.redelivered}, "
                         f"lost {g.lost} (+{g.lost_explained} explained), duplicated "
                         f"{g.duplicated}, wrong id {g.wrong_id}, phantom {g.phantom} "
                         f"{g.examples}")
        parts.append(f"offsets: {self.offsets.get('verdict')}")
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
                   offsets, dict(errors), dict(cut))


def _judge_group(c: Consumer, accepted: dict[str, Pushed], final: dict[str, Pushed],
                 cut_pops: int) -> GroupVerdict:
    v = GroupVerdict(c.group)
    seen: dict[str, list[Delivery]] = {}
    for d in c.deliveries:
        seen.setdefault(d.transaction_id, []).append(d)
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
