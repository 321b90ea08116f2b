"""bench/hotpath.py drives the broker's hot functions with no server; a change to those
functions must keep it running (shard4 inlined ``Entry.resolve_run`` and broke push1/push100
until this test)."""

import pytest

from bench import hotpath

WORKLOADS = ("push1", "push100", "front1", "front100", "front100u", "pop100", "pop100s10",
             "ack100", "ephack100", "ephpop100", "qpb1k", "frontqpb1k")


@pytest.mark.parametrize("workload", WORKLOADS)
def test_each_workload_runs_a_round(workload):
    assert hotpath.main(["--workloads", workload, "--rounds", "1"]) == 0



def test_front100u_ids_take_the_number_scans_quote_lookup():
    """front100u exists to count the scan's branch that looks a shape up among the quotes:
    its transactionIds must show one (and front100's none)."""
    from queen_mp.models import items

    assert not items._no_long_number_bulk(hotpath.push_body(100, 1, uuid_txns=True))
    assert items._no_long_number_bulk(hotpath.push_body(100, 1))
