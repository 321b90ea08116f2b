"""The fault matrix (issue 29): each fault under load, then a drain and the per-message ledger.

One broker (2 front workers, 2 shards; two for the faults of TWO_INSTANCES) over a PostgreSQL
cluster of the run's own, which the PostgreSQL faults stop and start, or over a pg_auto_failover
formation (tests/chaos/autofailover.py) whose primary the failover faults take away. Each
fault gets a queue of its own: 3 producers (3 items a request over 50 partitions, retrying
with the same transactionIds) and two consumer groups (manual acks; autoAck) run
``before_s``, the fault happens, the load goes on ``after_s``, then the producers stop and the
consumers drain. A fault that takes the broker down restarts it on the same port, data
directory and spool.

``python -m tests.chaos.matrix`` (``make chaos``) runs every fault ``--rounds`` times and
writes docs/reliability.md; tests/chaos/test_matrix.py runs one round of the reduced set in
``make test``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from psycopg.conninfo import make_conninfo

from bench.ledger import check_offsets
from queen_mp.db.embedded import EmbeddedPostgres
from tests.brokerharness import REPO, Broker, launch, process_tree, start_broker
from tests.chaos.autofailover import Formation
from tests.chaos.ledger import Verdict, judge
from tests.chaos.netproxy import NetProxy
from tests.chaos.workload import Consumer, Producer, _Shared
from tests.integration.test_maintenance import set_maintenance, wait_drained
from tests.pgharness import make_database, make_temp_dir

__all__ = ["FAULTS", "QUICK", "Rig", "Row", "run_fault"]

CONFIGURE = "/api/v1/configure"
LEASE_S = 1


@dataclass
class Rig:
    """The broker instances under test (one, or two over the same database) and the cluster
    under them (a server of the run's own, or a pg_auto_failover formation); faults replace
    what they restart."""

    brokers: list[Broker]
    pg: EmbeddedPostgres | None
    dsn: str  # direct (the formation's multi-host URI), for the ledger's checks
    proxy: NetProxy | None = None  # between the brokers and PostgreSQL, for fault 7
    formation: Formation | None = None  # fault 4

    @property
    def broker(self) -> Broker:
        return self.brokers[0]

    @property
    def urls(self) -> list[str]:
        return [b.url for b in self.brokers]

    def restart(self, index: int = 0) -> None:
        """The same command, environment (port, data dir, spool) and log as before."""
        old = self.brokers[index]
        proc = launch(old.env, old.log_path)
        new = self.brokers[index] = Broker(old.url, proc, old.data_dir, old.log_path, old.env)
        new.wait_healthy(60)
        new.wait_all_started()


# ------------------------------------------------------------------------------------ faults
def kill_front_worker(rig: Rig, quick: bool) -> None:
    os.kill(rig.broker.front_worker_pids()[0], signal.SIGKILL)  # the arbiter forks another


def kill_shard(rig: Rig, quick: bool) -> None:
    os.kill(rig.broker.shard_pids()[0], signal.SIGKILL)  # the supervisor restarts it


def kill_broker(rig: Rig, quick: bool, index: int = 0) -> None:
    victim = rig.brokers[index]
    for pid in reversed(process_tree(victim.proc.pid)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    victim.proc.wait()
    rig.restart(index)


def kill_second_instance(rig: Rig, quick: bool) -> None:
    """Fault 5: the survivor serves meanwhile, acks of the dead one's leases included."""
    assert len(rig.brokers) == 2, "this fault needs a rig of two instances"
    kill_broker(rig, quick, index=1)


def sigterm_broker(rig: Rig, quick: bool) -> None:
    rig.broker.proc.send_signal(signal.SIGTERM)
    rig.broker.proc.wait(60)
    rig.restart()


def postgres_outage(rig: Rig, quick: bool) -> None:
    assert rig.pg is not None, "this fault needs a rig of one server"
    rig.pg.stop(mode="immediate")
    time.sleep(3.0 if quick else 10.0)
    rig.pg.start()


def network_fault(rig: Rig, quick: bool, mode: str) -> None:
    """Fault 7: statements past their deadline are cancelled out of band and their
    connections quarantined; clients hear 503 timeout / outcome_unknown or buffered."""
    assert rig.proxy is not None, "this fault needs a proxied rig"
    rig.proxy.delay_s = 0.3
    rig.proxy.mode = mode
    time.sleep(4.0 if quick else 8.0)
    rig.proxy.mode = "pass"


def maintenance_toggles(rig: Rig, quick: bool) -> None:
    """Fault 8; with two instances each switch is made on the other one than the last, so
    every instance also follows switches it learns from PostgreSQL (NOTIFY)."""
    seconds = 0.5 if quick else 1.0
    for k in range(6):
        set_maintenance(rig.brokers[k % len(rig.brokers)], enabled=k % 2 == 0)
        time.sleep(seconds)


def failover(rig: Rig, quick: bool, how: str) -> float:
    """Fault 4: the primary's host dies (``crash``) or its service is stopped (``stop``);
    pg_auto_failover promotes the secondary; the host comes back and rejoins as a secondary
    (so the next round fails over the other way, with synchronous replication again).
    Returns when the primary was gone: the recovery time counts from there, not from the
    moment the action began (pushes sent while the kill was under way may commit)."""
    formation = rig.formation
    assert formation is not None, "this fault needs a pg_auto_failover rig"
    old = formation.primary  # known since the formation settled: the fault strikes at once
    if how == "crash":
        formation.crash(old)
    else:
        formation.stop_service(old)
    struck = time.monotonic()
    formation.wait_promoted(old)
    formation.rejoin(old)
    formation.wait_settled()
    return struck


#: what each fault does (``quick``: the reduced matrix's shorter outage and maintenance)
FAULTS: dict[str, tuple[str, Callable[[Rig, bool], float | None]]] = {
    "kill-worker": ("kill -9 of one front worker", kill_front_worker),
    "kill-shard": ("kill -9 of one shard", kill_shard),
    "kill-broker": ("kill -9 of the whole broker, restarted", kill_broker),
    "sigterm": ("SIGTERM of the broker under load, restarted", sigterm_broker),
    "pg-outage": ("PostgreSQL stopped 10 s (3 s quick, immediate), started again",
                  postgres_outage),
    "maintenance": ("push maintenance on and off three times", maintenance_toggles),
    "maintenance-2": ("two instances, round-robin clients: push maintenance on and off three "
                      "times, each switch on the other instance", maintenance_toggles),
    "kill-instance": ("two instances, round-robin clients: kill -9 of one, restarted",
                      kill_second_instance),
    "net-blackhole": ("network to PostgreSQL drops everything 8 s (4 s quick)",
                      lambda rig, quick: network_fault(rig, quick, "blackhole")),
    "net-delay": ("network to PostgreSQL delays every packet 300 ms for 8 s (4 s quick)",
                  lambda rig, quick: network_fault(rig, quick, "delay")),
    "failover-crash": ("pg_auto_failover: kill -9 of the primary's pg_autoctl and postmaster, "
                       "secondary promoted by the monitor, old primary rejoined",
                       lambda rig, quick: failover(rig, quick, "crash")),
    "failover-stop": ("pg_auto_failover: `pg_autoctl stop --immediate` of the primary, "
                      "secondary promoted by the monitor, old primary rejoined",
                      lambda rig, quick: failover(rig, quick, "stop")),
}
#: faults that need a rig of two instances
TWO_INSTANCES = frozenset({"kill-instance", "maintenance-2"})
#: faults that need the broker's connections to go through the rig's NetProxy
PROXIED = frozenset({"net-blackhole", "net-delay"})
#: faults that need a pg_auto_failover formation under the broker
FAILOVER = frozenset({"failover-crash", "failover-stop"})
#: the statement deadline of a proxied rig: short, so a fault drives the cancel and quarantine
PROXIED_STATEMENT_TIMEOUT_MS = 1500
#: the reduced matrix of `make test` (issue 29: faults 1, 2, 3 and 8)
QUICK = ("kill-worker", "kill-shard", "kill-broker", "sigterm", "pg-outage", "maintenance")


@dataclass
class Row:
    fault: str
    what: str
    verdict: Verdict
    recovery_s: float | None  # from the fault to the first push sent after it answered queued
    cut_pushes: int  # push requests whose answer never came


def run_fault(rig: Rig, fault: str, *, quick: bool = True) -> Row:
    """One fault under its own queue's load, judged; ``quick``: the reduced matrix's
    timings."""
    before_s, after_s = (0.8, 1.2) if quick else (3.0, 5.0)
    what, action = FAULTS[fault]
    queue = f"chaos-{fault}-{uuid.uuid4().hex[:6]}"
    shared = _Shared()
    urls = rig.urls
    # NOTE(queen): a pop whose answer a fault cut leaves its lease to expire before the
    # messages come again: short leases, redelivered at once, and a drain that waits longer.
    with httpx.Client(base_url=urls[0], timeout=30) as http:
        http.post(CONFIGURE, json={"queue": queue, "options": {
            "leaseTime": LEASE_S, "retryDelay": 0}}).raise_for_status()
    producers = [Producer(urls, queue, f"{fault}-{k}", shared) for k in range(3)]
    consumers = [Consumer(urls, queue, "manual", shared, idle_s=LEASE_S + 1.5),
                 Consumer(urls, queue, "auto", shared, auto_ack=True, idle_s=LEASE_S + 1.5)]
    for t in (*producers, *consumers):
        t.start()
    time.sleep(before_s)
    started = time.monotonic()
    for p in producers:
        p.first_ok_after = started
    struck = action(rig, quick) or started
    time.sleep(after_s)
    for p in producers:
        p.give_up_at = time.monotonic() + 30
    shared.stop.set()
    for p in producers:
        p.join(60)
        assert not p.is_alive(), f"{p.name} hung"
    for b in rig.brokers:
        wait_drained(b, timeout=90)
    for c in consumers:
        c.draining.set()
    for c in consumers:
        c.join(120)
        assert not c.is_alive(), f"{c.name} did not finish its drain"
    pushed = [x for p in producers for x in p.pushed]
    verdict = judge(pushed, consumers, check_offsets(rig.dsn, queue), shared.errors,
                    shared.cut)
    recovered = [t for p in producers if (t := p.recovered_at(struck)) is not None]
    return Row(fault, what, verdict, min(recovered) - struck if recovered else None,
               shared.cut.get("push", 0))


@contextlib.contextmanager
def rig(tmp: Path, instances: int = 1, proxied: bool = False,
        failover: bool = False) -> Iterator[Rig]:
    """A private cluster (a pg_auto_failover formation when ``failover``) and ``instances``
    brokers on it (through a NetProxy when ``proxied``); all gone afterwards."""
    base = make_temp_dir("queen-chaos-")
    pg = formation = None
    try:
        if failover:
            formation = Formation(base / "formation")
            formation.start()
            dsn = formation.uri()  # every node, the writable one chosen by libpq
        else:
            pg = EmbeddedPostgres(base / "pg", fsync=False)
            pg.start()
            dsn = make_database(pg.dsn)
        r = Rig([], pg, dsn, formation=formation)
        settings = {"QUEEN_PUSH_TIMEOUT_MS": "4000"}
        broker_dsn = dsn
        if proxied:
            assert pg is not None
            r.proxy = NetProxy("127.0.0.1", pg.port)
            broker_dsn = make_conninfo(dsn, host="127.0.0.1", port=r.proxy.port)
            settings["QUEEN_PG_STATEMENT_TIMEOUT_MS"] = str(PROXIED_STATEMENT_TIMEOUT_MS)
        try:
            for _ in range(instances):
                r.brokers.append(start_broker(tmp, broker_dsn, **settings))
            yield r
        finally:
            for b in r.brokers:
                b.stop()
            if r.proxy is not None:
                r.proxy.close()
    finally:
        if pg is not None:
            with contextlib.suppress(Exception):
                pg.stop(mode="immediate")
        if formation is not None:
            formation.close()
        shutil.rmtree(base, ignore_errors=True)


# ------------------------------------------------------------------------------- the report
def table(rows: list[Row]) -> str:
    head = ("| fault | accepted | delivered (manual / auto) | lost | duplicated | unanswered "
            "| redelivered | order | client errors | recovery s |\n"
            "|---|---:|---:|---:|---:|---:|---:|---|---|---:|")
    lines = [head]
    for r in rows:
        v = r.verdict
        m, a = v.groups
        lost = f"{m.lost} / {a.lost}" + (f" (+{a.lost_explained} autoAck cut)"
                                          if a.lost_explained else "")
        errors = ", ".join(f"{k} x{n}" for k, n in sorted(v.errors.items())) or "none"
        rec = f"{r.recovery_s:.2f}" if r.recovery_s is not None else "-"
        order = ", ".join(part for part in (
            f"{v.order.reordered} reordered" if v.order.reordered else "",
            f"{m.out_of_order + a.out_of_order} delivered out of order"
            if m.out_of_order + a.out_of_order else "",
            f"{v.order.after_buffered} after a buffered one" if v.order.after_buffered else "",
        ) if part) or "kept"
        lines.append(f"| {r.what} | {v.accepted} | {m.delivered} / {a.delivered} | {lost} | "
                     f"{m.duplicated} / {a.duplicated} | {v.unanswered} | {m.redelivered} | "
                     f"{order} | {errors} | {rec} |")
    return "\n".join(lines)


LEGEND = """\
Columns: *accepted*, items answered `queued`, `duplicate` or `buffered` (each producer retries a
request that failed with the same transactionIds until every item is accepted); *delivered*,
distinct messages each consumer group received; *lost*, accepted and never delivered (autoAck
messages taken by a pop whose outcome is unknown, its answer cut or a 503 timeout, are counted
apart: at-most-once is what autoAck means); *duplicated*, delivered again after a successful
ack (or twice under autoAck);
*unanswered*, items still not accepted when the run gave up (30 s after the load stopped);
*redelivered*, deliveries again after an ack that did not succeed (the lease expired);
*order*, per producer and partition: *kept* when every item was stored above the items its
producer sent before it and each group received every partition in offset order; *N reordered*
(a failure) counts items stored below an earlier item that had been answered `queued` or
`duplicate`, *N delivered out of order* (a failure) first deliveries below an offset the group
had already received, *N after a buffered one* (a failure) items stored before an earlier item
of their producer that was answered `buffered` and stored when the spool drained ("-": rows
from before the matrix checked order);
*client errors*, what the clients saw, by route and kind (ConnectError: refused, nothing sent;
ReadError and RemoteProtocolError: the answer was cut; 503 timeout and outcome_unknown: the
broker does not know whether it applied); *recovery s*, from the fault's start (for the
failover rows: from the moment the primary's processes were gone) to the first push answered
`queued` that was sent after it. Offsets are checked to tile every partition without gap or
overlap. Any loss, duplicate, offset or order failure fails the run.
"""


OUTSIDE = """\
## Outside this table

- The spool's disk filling up (fault 6) is tests/integration/test_spool_full.py: a tmpfs of
  8 MiB under the spool, pushes answer 507 above the high-water mark, every `buffered` item is
  stored once after the drain, and pushes are taken again once the drain has freed the disk.
- The network faults (7) are made by a TCP proxy of the test's own between the broker and
  PostgreSQL (tests/chaos/netproxy.py): these machines' kernels have no netem.
- A producer's order is kept across spools (queen_mp/front/spoolhold.py, docs/architecture.md
  "Spool and order"): while an instance's spool holds records its pushes wait for the drain
  (5 s at most, then they are spooled too) until a closing pass of the drain ends the hold;
  while another live instance's spool does, pushes wait likewise, and a drain stores only
  records older than every other instance's oldest (`queen.spool_holds`). Across hosts the
  order is the accept time by each host's clock; items buffered while PostgreSQL was
  unreachable (faults 3 and 4) are ordered within their instance, and across instances once
  their hold is published.
- The failover rows (fault 4) run on a pg_auto_failover formation of the run's own
  (tests/chaos/autofailover.py: a monitor, a primary and a secondary, synchronous replication,
  the package's default timings); the broker's DSN is the formation's multi-host URI. Their
  recovery time is mostly the monitor's: it declares the primary unhealthy after
  `pgautofailover.node_considered_unhealthy_timeout` (20 s) and waits
  `pgautofailover.primary_demote_timeout` (30 s) before promoting (docs/operations.md).
"""


def head_commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                          capture_output=True, text=True).stdout.strip() or "unknown"


def report(rows: list[Row], rounds: int, commit: str) -> str:
    return (
        "# Reliability: the fault matrix\n\n"
        f"`make chaos` (`python -m tests.chaos.matrix --rounds {rounds} --docs "
        f"docs/reliability.md`), run {time.strftime('%Y-%m-%d', time.gmtime())} at commit "
        f"{commit}: each fault of tests/chaos/matrix.py {rounds} times under load (3 producers, "
        "a manual-ack and an autoAck consumer group, 50 partitions, one broker with 2 front "
        "workers and 2 shards over a PostgreSQL cluster of the run's own, a pg_auto_failover "
        "formation for the failover rows), then a drain and the "
        "per-message ledger of tests/chaos/ledger.py. `make test` runs one quick round "
        "(tests/chaos/test_matrix.py).\n\n" + LEGEND + "\n" + table(rows) + "\n\n" + OUTSIDE)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--docs", default=None, help="write the table into this markdown file")
    a = ap.parse_args()
    # a stopped run still stops its brokers and cluster (the finally blocks below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    commit = head_commit()  # the code that runs, whatever lands meanwhile
    rows: list[Row] = []
    faults = a.faults.split(",")
    tmp = make_temp_dir("queen-chaos-broker-")
    try:
        for instances, proxied, failover in ((1, False, False), (2, False, False),
                                             (1, True, False), (1, False, True)):
            todo = [f for f in faults if (f in TWO_INSTANCES) == (instances == 2)
                    and (f in PROXIED) == proxied and (f in FAILOVER) == failover]
            if not todo:
                continue
            with rig(tmp, instances, proxied, failover) as r:
                for _ in range(a.rounds):
                    for fault in todo:
                        row = run_fault(r, fault, quick=False)
                        print(f"{fault}: {'OK' if row.verdict.ok else 'FAILED'} "
                              f"{row.verdict.summary()}", flush=True)
                        rows.append(row)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(table(rows))
    if a.docs:
        Path(a.docs).write_text(report(rows, a.rounds, commit))
    return 0 if all(r.verdict.ok for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
