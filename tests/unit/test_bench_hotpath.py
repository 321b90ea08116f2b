"""bench/hotpath.py drives the broker's hot functions with no server; a change to those
functions must keep it running (shard4 inlined ``Entry.resolve_run`` and broke push1/push100
until this test)."""

import pytest

from bench import hotpath

WORKLOADS = ("push1", "push100", "front1", "front100", "pop100", "pop100s10", "ack100", "ephack100",
             "ephpop100",
             "qpb1k")


@pytest.mark.parametrize("workload", WORKLOADS)
def test_each_workload_runs_a_round(workload):
    assert hotpath.main(["--workloads", workload, "--rounds", "1"]) == 0

