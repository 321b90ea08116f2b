"""bench/ledger.py's check on hand-made ledgers (no broker), and the loadgen side of the contract:
what bench/loadgen.py files and encodes is what bench/ledger.py and the broker's parser read."""

from __future__ import annotations

import base64
import json

import pytest

from bench import ledger as L
from bench import loadgen
from queen_mp.wire.binary_push import parse_binary_push
from queen_mp.wire.ids import is_uuid7


def mid(producer: str, seq: int) -> bytes:
    """A deterministic 16-byte 'message id' per item."""
    return (f"{producer}:{seq}".encode() + b"\0" * 16)[:16]


def push_doc(producer: str = "a", queued: tuple[tuple[int, int], ...] = ((0, 4),),
             unknown: tuple[tuple[int, int], ...] = ((5, 6),),
             other: dict[str, list[list[int]]] | None = None) -> dict:
    ids = b"".join(mid(producer, s) for lo, hi in queued for s in range(lo, hi + 1))
    return {producer: {"queued": [list(r) for r in queued],
                       "ids": base64.b64encode(ids).decode(),
                       "other": other if other is not None else
                       {"http_400_invalid_request": [[7, 7]], "buffered": [[8, 8]]},
                       "unknown": [list(r) for r in unknown]}}


def consumed(*seqs: int, producer: str = "a", group: str = "g") -> L.Consumed:
    c = L.Consumed(group)
    for s in seqs:
        c.add(producer, s, mid(producer, s), transaction_id=f"{producer}-{s}")
    return c


def run(c: L.Consumed, doc: dict | None = None, **kw) -> dict:
    res = L.check(L.PushLedger.from_doc(doc or push_doc()), {c.group: c}, **kw)
    json.dumps(res)  # the orchestrator writes it as JSON
    return res


def test_everything_consumed_once_is_ok() -> None:
    res = run(consumed(0, 1, 2, 3, 4))
    g = res["groups"]["g"]
    assert res["ok"] and g["ok"], res["failures"]
    assert (g["expected"], g["consumed"], g["loss"], g["duplicates"]) == (5, 5, 0, 0)
    assert res["verdict"] == "ZERO-LOSS CHECK PASSED"


def test_loss_names_the_missing_items() -> None:
    res = run(consumed(0, 1, 3))
    g = res["groups"]["g"]
    assert not res["ok"] and g["loss"] == 2
    assert [(e["seq"], e["message_id"]) for e in g["examples"]["loss"]] == [
        (2, L._id_text(mid("a", 2))), (4, L._id_text(mid("a", 4)))]
    assert "LOSS" in res["verdict"]


def test_stored_twice_is_a_duplicate() -> None:
    c = consumed(0, 1, 2, 3, 4, 2)
    g = run(c)["groups"]["g"]
    assert g["duplicates"] == 1 and g["loss"] == 0 and g["id_mismatch"] == 0
    assert g["examples"]["duplicates"][0]["seq"] == 2


def redelivery(seq: int, first_ack: str, lease_expired: bool) -> L.Redelivery:
    return L.Redelivery(L._id_text(mid("a", seq)), 1, seq + 1, 2, "a", seq, first_ack,
                        lease_expired)


def test_redelivery_is_fine_only_when_explained() -> None:
    c = consumed(0, 1, 2, 3, 4)
    c.redeliveries += [redelivery(1, "failed:lease_invalid", False),
                       redelivery(2, "pending", True), redelivery(3, "ok", True)]
    res = run(c)
    g = res["groups"]["g"]
    assert res["ok"] and g["redelivered"] == 3 and g["duplicates"] == 0
    assert g["redelivery_reasons"] == {"ack_failed": 1, "ack_pending+lease_expired": 1,
                                       "lease_expired": 1}
    c.redeliveries.append(redelivery(4, "ok", False))
    g = run(c)["groups"]["g"]
    assert g["duplicates"] == 1 and g["examples"]["duplicates"][0]["seq"] == 4


def test_phantoms_never_pushed_refused_or_foreign() -> None:
    c = consumed(0, 1, 2, 3, 4, 7, 99)
    c.add("zz", 0, mid("zz", 0))
    c.foreign.append({"message_id": L._id_text(bytes(16)), "partition_id": 1, "offset": 9,
                      "transaction_id": "x", "data": "{}"})
    g = run(c)["groups"]["g"]
    assert g["phantom"] == 4
    whys = sorted(e["why"] for e in g["examples"]["phantom"])
    assert whys[0].startswith("never pushed") and any("http_400" in w for w in whys)
    assert any("not a bench message" in w for w in whys)


def test_unknown_and_buffered_are_reported_not_failed() -> None:
    res = run(consumed(0, 1, 2, 3, 4, 5, 8))
    g = res["groups"]["g"]
    assert res["ok"], res["failures"]
    assert (g["extra_unknown"], g["extra_buffered"], g["phantom"]) == (1, 1, 0)


def test_id_and_transaction_id_mismatch() -> None:
    c = consumed(0, 1, 2, 3)
    c.add("a", 4, b"\x01" * 16, transaction_id="a-40")
    g = run(c)["groups"]["g"]
    assert (g["id_mismatch"], g["txn_mismatch"]) == (1, 1)
    assert g["examples"]["id_mismatch"][0]["consumed_id"] == L._id_text(b"\x01" * 16)


def test_ignored_producers_and_empty_checks() -> None:
    doc = {**push_doc(), **push_doc("warm-x", queued=((0, 1),), unknown=(), other={})}
    c = consumed(0, 1, 2, 3, 4)
    c.add("warm-x", 0, mid("warm-x", 0))
    res = run(c, doc, ignore_producers_prefix="warm-")
    assert res["ok"] and res["groups"]["g"]["ignored"] == 1
    assert not run(c, doc)["ok"]  # warm-x seq 1 lost once it counts
    assert not L.check(L.PushLedger(), {"g": L.Consumed("g")})["ok"]
    assert not L.check(L.PushLedger.from_doc(push_doc()), {})["ok"]


def test_ledger_conflict_is_reported() -> None:
    doc = push_doc(unknown=((4, 6),))
    g = run(consumed(0, 1, 2, 3, 4), doc)["groups"]["g"]
    assert g["ledger_conflicts"] == 1


def test_load_push_ledger_merges_files(tmp_path) -> None:
    with pytest.raises(FileNotFoundError):
        L.load_push_ledger(str(tmp_path))
    (tmp_path / "push-t1w0.json").write_text(json.dumps(push_doc(queued=((5, 6),), unknown=(),
                                                                 other={})))
    (tmp_path / "push-t1w1.json").write_text(json.dumps(push_doc(queued=((0, 4),), unknown=(),
                                                                 other={})))
    led = L.load_push_ledger(str(tmp_path))
    pp = led.producers["a"]
    assert pp.queued == [(0, 4), (5, 6)]
    assert pp.ids == b"".join(mid("a", s) for s in range(7))
    assert led.totals()["queued"] == 7 and len(led.files) == 2


def test_loadgen_ledger_is_what_the_checker_reads(tmp_path) -> None:
    lg = loadgen._Ledger()
    ids = [mid("p", s) for s in range(4)]

    def item(s: int, status: str) -> dict:
        return {"status": status, "messageId": L._id_text(ids[s]) if s < 4 else None}

    answer = json.dumps([item(0, "queued"), item(1, "queued"), item(2, "duplicate"),
                         item(3, "queued")]).encode()
    got, bad = lg.answered(b"p", 0, 4, answer, b"".join(ids))
    assert got == ["queued", "queued", "duplicate", "queued"] and bad == 0
    lg.unknown(b"p", 4, 2)
    lg.rejected(b"p", 6, 2, 429, b'{"code":"overloaded"}')
    lg.rejected(b"p", 8, 1, 503, b'{"code":"outcome_unknown"}')
    assert lg.answered(b"p", 9, 2, b"[]", None) == (None, 0)  # wrong length: unknown
    lg.rejected(b"p", 11, 1, 502, b"bad gateway")
    lg.rejected(b"p", 12, 1, 503, b'{"code":"unavailable"}')
    lg.write(str(tmp_path / "push-x.json"))
    pp = L.load_push_ledger(str(tmp_path)).producers["p"]
    assert pp.queued == [(0, 1), (3, 3)] and pp.ids == ids[0] + ids[1] + ids[3]
    assert pp.other == {"duplicate": [(2, 2)], "http_429_overloaded": [(6, 7)],
                        "http_503_unavailable": [(12, 12)]}
    assert pp.unknown == [(4, 5), (8, 11)]


@pytest.mark.parametrize("spread", ["request", "item"])
def test_loadgen_qpb1_body_parses_as_the_broker_reads_it(spread: str, tmp_path) -> None:
    w = loadgen._Worker("h", 1, "/api/v1/push", 12, 50, "bench", spread, 1.0, "t", seed=1,
                        fmt="qpb1", ledger_dir=str(tmp_path))
    body, nxt, ids = w.body(b"tc0", 95)
    assert nxt == 107 and ids is not None
    frames = [f for g in parse_binary_push(body).groups for f in g.frames]
    assert [f.transaction_id for f in frames] == [f"tc0-{s}" for s in range(95, 107)]
    assert [bytes(f.payload) for f in frames] == [loadgen.payload(b"tc0", s)
                                                  for s in range(95, 107)]
    assert [f.message_id for f in frames] == [ids[k:k + 16] for k in range(0, 16 * 12, 16)]
    assert all(is_uuid7(f.message_id) for f in frames) and len(set(ids[k:k + 16] for k in
                                                                   range(0, 192, 16))) == 12
