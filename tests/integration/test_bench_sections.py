"""Smoke runs of the suite's streams, ephemeral and partitions sections (bench/streams.py,
bench/ephemeral.py, bench/ephemeral_sql.py, bench/partitions.py) with tiny sizes: the figures
they report are there and consistent, and the streams run's window counts add up to the
events pushed."""

from __future__ import annotations

import asyncio

from bench import ephemeral, ephemeral_sql, partitions, streams
from bench.push import RoleCpu


def test_the_streams_section_counts_every_event_and_times_its_cycles(broker, db_dsn):
    args = streams.parse_args(["--events", "300", "--partitions", "2", "--batch-size", "50",
                               "--timeout", "90"])
    f = streams.measure(broker, db_dsn, args)
    assert f.ok, f
    assert f.counted == f.events == 300
    assert f.cycles >= 300 // 50  # at least one cycle per batch, plus the window flushes
    assert 0 < f.cycle_p50_ms <= f.cycle_p99_ms <= f.cycle_max_ms
    assert f.events_per_s > 0
    assert f.cpu_broker_us_per_event > 0 and f.cpu_pg_us_per_event > 0
    assert "| 300 | 2 | 50 |" in streams.render(f)


def test_the_ephemeral_section_measures_both_kinds_and_each_consumer_count(broker, db_dsn):
    args = ephemeral.parse_args(["--duration", "0.5", "--batches", "10", "--connections", "2",
                                 "--consumers", "1,2", "--pop-batch", "20",
                                 "--pop-backlog", "300"])
    cells = asyncio.run(ephemeral._run(broker.url, db_dsn, args, RoleCpu(broker.proc.pid,
                                                                          db_dsn)))
    assert [(c.kind, c.op, c.connections) for c in cells] == [
        (k, op, n) for k in ("durable", "ephemeral")
        for op, n in (("push", 2), ("pop/ack", 1), ("pop/ack", 2))]
    assert all(c.errors == 0 for c in cells), cells
    assert all(c.msgs > 0 for c in cells), cells  # the backlog gives every pop cell work
    assert all(c.cpu_pg_us_per_msg is not None for c in cells if c.msgs)
    assert "| ephemeral | pop/ack | 20 | 2 |" in ephemeral.render(cells)


def test_the_sql_level_ephemeral_bench_drains_what_it_pushed(pg_server_dsn):
    """Every message pushed is popped and acked (once per group), the queue left empty (the
    bench asserts it), in a database of its own that it drops."""
    rows = ephemeral_sql.run(ephemeral_sql.parse_args(["--server-dsn", pg_server_dsn,
                                                       "--messages", "400"]))
    assert [(r.op, r.batch, r.groups, r.msgs) for r in rows] == [
        ("push", 1, 1, 100), ("push x4", 1, 1, 100), ("pop+ack", 100, 1, 200),
        ("push", 100, 1, 400), ("push x4", 100, 1, 400), ("pop+ack", 100, 1, 800),
        ("push", 100, 2, 400), ("pop+ack", 100, 2, 800),
        ("push", 100, 1, 400), ("push x4", 100, 1, 400), ("pop+ack", 70, 1, 800)]
    assert all(r.cpu_us_per_msg >= 0 and r.wall_us_per_msg > 0 for r in rows), rows
    assert "| pop+ack | 100 | 2 | 800 |" in ephemeral_sql.render(rows)


def test_the_suite_runs_the_streams_section_in_a_process_of_its_own(pg_server_dsn):
    """The client's Queen installs signal handlers (main thread only): the suite's thread
    gets the figures from a child process, which drops its database after."""
    f = streams.run_in_child(["--server-dsn", pg_server_dsn, "--events", "200",
                              "--partitions", "2", "--batch-size", "50", "--timeout", "90"])
    assert f.ok and f.counted == f.events == 200, f


def test_the_partitions_section_drains_and_measures_pops_beside_live_leases(pg_server_dsn):
    f = partitions.run(partitions.parse_args([
        "--server-dsn", pg_server_dsn, "--small", "2", "--large", "20", "--drain", "10",
        "--pops", "5", "--leases", "5"]))
    assert (f.small.partitions, f.large.partitions) == (2, 20)
    assert f.drain_partitions == 10 and f.drain_pops == 11  # the last pop finds nothing
    assert f.drain_cpu.client_us > 0 and min(vars(f.drain_cpu).values()) >= 0, f.drain_cpu
    assert f.first_group_claimed == 1
    assert f.drain_ready_reads > 0, f  # the drain's pops read the ready index's 10 entries
    assert len(f.drain_slowest) == 3 and f.drain_slowest[0][1] >= f.drain_slowest[2][1], f
    assert (f.unleased.partitions, f.leased.partitions, f.live_leases) == (25, 30, 5)
    for pop in (f.small, f.large, f.unleased, f.leased):
        assert pop.pops == 5 and 0 < pop.p50_ms <= pop.p99_ms, pop
    assert "| 5 live leases (leased pop + ack) | 30 | 5 |" in partitions.render(f)
