"""bench/peers.py and the suite's peer arms, without a broker: the private nats-server's
config and its version check, the server-process lookup, a peer that cannot be reached being
skipped (never faked), which push cells the peers get, and the issue 26 comparisons in the
targets, ratios and report."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench import report
from bench.peers import (
    DURABILITY,
    PEERS,
    PeerLoadSpec,
    PeerSet,
    PrivateNats,
    listener_pid,
    tcp_probe,
)
from bench.suite import PEER_TARGETS, parse_args, push_arms, ratios, targets


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fake_nats_server(path: Path, accepts: bool) -> str:
    """A stand-in binary answering --version and -t like nats-server 2.9 (rejects
    sync_interval) or 2.10+ (accepts it)."""
    reject = ('echo "nats-server: $2:6:3: unknown field \\"sync_interval\\"" >&2; exit 1'
              if not accepts else 'echo "configuration file $2 is valid"; exit 0')
    path.write_text("#!/bin/sh\n"
                    f'if [ "$1" = "--version" ]; then echo "nats-server: '
                    f'{"v2.15.1" if accepts else "v2.9.10"}"; exit 0; fi\n'
                    f'if [ "$3" = "-t" ]; then {reject}; fi\n'
                    "exit 2\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_private_nats_config_fsyncs_every_write(tmp_path: Path) -> None:
    text = PrivateNats.config_text(4333, tmp_path / "store dir")
    assert "listen: 127.0.0.1:4333" in text
    assert "sync_interval: always" in text
    assert f'store_dir: "{tmp_path / "store dir"}"' in text


def test_private_nats_check_names_what_an_old_server_lacks(tmp_path: Path) -> None:
    old = PrivateNats(_fake_nats_server(tmp_path / "old", accepts=False), tmp_path / "a")
    why = old.check()
    assert why is not None and "v2.9.10" in why and "sync_interval" in why and "2.10" in why
    new = PrivateNats(_fake_nats_server(tmp_path / "new", accepts=True), tmp_path / "b")
    assert new.check() is None and new.version == "v2.15.1"
    assert (tmp_path / "b" / "nats-server.conf").read_text().count("sync_interval: always")
    missing = PrivateNats(str(tmp_path / "nope"), tmp_path / "c")
    assert "no nats-server binary" in (missing.check() or "")
    missing.stop()  # nothing started: a no-op


def test_listener_pid_finds_the_listening_process() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listener_pid(port) == os.getpid()
        assert tcp_probe("127.0.0.1", port) is None
    assert listener_pid(port) is None
    assert tcp_probe("127.0.0.1", port, timeout=1.0) is not None


def test_an_unreachable_peer_is_skipped_with_its_reason(tmp_path: Path) -> None:
    port = _closed_port()
    peers = PeerSet(["queen-mp", "rabbitmq-quorum", "nats"], tmp_path,
                    rabbitmq_url=f"amqp://guest:secret@127.0.0.1:{port}/",
                    nats_url=f"nats://127.0.0.1:{port}")
    assert peers.arms == ["rabbitmq-quorum", "nats"]
    peers.setup()
    doc = peers.doc()
    for arm in ("rabbitmq-quorum", "nats"):
        assert not peers.ok(arm)
        why = peers.peers[arm].reason or ""
        assert "not reachable" in why or "not installed" in why, why
        assert doc[arm]["status"] == "skipped"
    assert "secret" not in json.dumps(doc)
    assert peers.cleanup() == []


def test_peer_spec_round_trips_through_the_worker_command_line() -> None:
    spec = PeerLoadSpec(arm="nats", url="nats://127.0.0.1:4222", name="qb_x", items=100)
    assert PeerLoadSpec(**json.loads(json.dumps(asdict(spec)))) == spec
    with pytest.raises(ValueError):
        PeerLoadSpec(arm="kafka", url="", name="x")


def test_the_peers_push_at_their_batch_sizes_only() -> None:
    arms = ["queen-mp", "naive", "queen-mp-qpb1", "physical", *PEERS]
    assert push_arms(arms, 1, 1000, [1000], [1, 100]) == ["queen-mp", "naive", *PEERS]
    assert push_arms(arms, 10, 1000, [1000], [1, 100]) == ["queen-mp", "naive"]
    assert push_arms(arms, 1000, 1000, [1000], [1, 100]) == [
        "queen-mp", "naive", "queen-mp-qpb1", "physical"]
    assert push_arms(arms, 100, 1000, [1000], [1, 100], skip={"nats-fsync"}) == [
        "queen-mp", "naive", "rabbitmq-quorum", "rabbitmq-classic", "nats"]


def test_default_arms_include_the_peers() -> None:
    a = parse_args([])
    assert all(p in a.arms for p in PEERS)
    venv = Path(sys.executable).parent / "nats-server"  # the bench extra's, when installed
    want = str(venv) if venv.exists() else "/usr/sbin/nats-server"
    assert a.peer_batches == [1, 100] and a.nats_server == want
    assert parse_args(["--arms", "queen-mp,nats", "--peer-batches", "100"]).peer_batches == [100]


def _rows() -> list[dict]:
    def row(section: str, variant: str, arm: str, msgs: float, cpu: float) -> dict:
        return {"section": section, "variant": variant, "arm": arm, "msgs_per_s": msgs,
                "p50_ms": 5.0, "p99_ms": 9.0, "cpu_broker_s": 2.0, "cpu_us_per_msg": cpu,
                "commits_per_s": None if arm in PEERS else 100.0,
                "wal_bytes_per_msg": None if arm in PEERS else 500.0}

    out = []
    for section, variant in (("push", "batch 1"), ("push", "batch 100"),
                             ("consume", "batch 100")):
        out += [row(section, variant, "queen-mp", 6000.0, 300.0),
                row(section, variant, "edge", 12000.0, 100.0),
                row(section, variant, "rabbitmq-quorum", 3000.0, 200.0),
                row(section, variant, "nats", 4000.0, 150.0)]
    return out


def test_targets_are_issue_26s_with_the_peer_comparisons_scored() -> None:
    suite = SimpleNamespace(args=SimpleNamespace(consume_batch=100), rss_peak=0.0,
                            pss_peak=140.0)
    got = targets(_rows(), suite)  # type: ignore[arg-type]
    own = got[:9]
    assert [t["threshold"] for t in own] == [2.0, 1.5, 8.0, 1.5, 0.8, 1.0, 10.0, 20.0, 150.0]
    assert own[-1]["target"] == "peak PSS of all broker processes (MB)" and own[-1]["met"]
    peer = {t["target"]: t for t in got[9:9 + len(PEER_TARGETS)]}
    assert list(peer) == [label for label, *_ in PEER_TARGETS]
    # the partition-scale targets follow; this suite ran no partitions section
    scale = got[9 + len(PEER_TARGETS):]
    assert [(t["threshold"], t["value"], t["met"]) for t in scale] == [
        (1.5, None, None), (10.0, None, None), (100.0, None, None)]
    for t in peer.values():
        assert t["threshold"] == 1.0
    assert peer["push 1-item JSON vs rabbitmq-quorum (x)"]["value"] == 2.0
    assert peer["push 1-item JSON vs rabbitmq-quorum (x)"]["met"] is True
    assert peer["consume batch 100 vs nats (x)"]["value"] == 1.5
    assert peer["push 100-item JSON vs nats (x)"]["edge_ceiling"] == 3.0
    # nats-fsync did not run: not measured, neither met nor missed
    assert peer["push 100-item JSON vs nats-fsync (x)"]["met"] is None


def test_ratios_to_a_peer_have_cpu_per_message_and_no_commits() -> None:
    got = {(r["variant"], r["vs"]): r for r in ratios(_rows())}
    r = got["batch 1", "rabbitmq-quorum"]
    assert r["msgs_per_s"] == 2.0 and r["cpu_us_per_msg"] == 1.5
    assert r["commits_per_s"] is None and r["wal_bytes_per_msg"] is None


def test_report_shows_the_peers_and_why_one_was_skipped(tmp_path: Path) -> None:
    rows = [{**r, "rounds": 1} for r in _rows()]
    suite = SimpleNamespace(args=SimpleNamespace(consume_batch=100), rss_peak=0.0,
                            pss_peak=0.0)
    doc = {"command": "python -m bench.suite --quick", "status": "ok",
           "summary": {"rows": rows, "ratios": ratios(rows),
                       "targets": targets(rows, suite)},  # type: ignore[arg-type]
           "peers": {"nats-fsync": {"status": "skipped", "server": None,
                                    "reason": "nats-server v2.9.10 rejects sync_interval",
                                    "durability": DURABILITY["nats-fsync"]},
                     "nats": {"status": "ran", "server": "nats-server v2.9.10",
                              "client": "nats-py 2.16.0", "durability": DURABILITY["nats"]}}}
    text = report.render(doc, tmp_path / "plots")
    assert "## Peers" in text and "before fsync" in text
    assert "**skipped**: nats-server v2.9.10 rejects sync_interval" in text
    assert ("| push 1-item JSON vs rabbitmq-quorum (x) | **MET** | 2.00x | >= 1.00x | 4.00x |"
            in text)
    assert "| consume batch 100 vs nats-fsync (x) | not measured | - | >= 1.00x | - |" in text
    assert "queen-mp / rabbitmq-quorum" in text and "| CPU us/msg |" in text
    assert text.index("| nats |") < text.index("| nats-fsync |")
