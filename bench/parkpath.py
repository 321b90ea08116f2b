"""An in-process driver of a front worker's long-poll path, for instruction counts under
callgrind (as bench/hotpath.py): ``Popper.pop`` over the real ``ParkingLot`` with a stand-in
claim (no database, no HTTP).

- ``woken``: ``--pops`` pops each claim nothing, park, are woken (``pass_baton``, as a wake
  of their key), claim one message and return it;
- ``timeout``: ``--pops`` pops with a 100 ms long poll claim nothing, park until their last
  claim may start and wait out the rest of their timeout (so the count includes the event
  loop's idle turns meanwhile: compare runs, not instructions a pop).

The rounds run inside one ``operator.call``::

    valgrind --tool=callgrind --toggle-collect=_operator_call --callgrind-out-file=/dev/null \\
        .venv/bin/python -m bench.parkpath --mode woken --pops 200
"""

from __future__ import annotations

import argparse
import asyncio
import operator
import sys
import uuid

import uvloop

from queen_mp.db import pop_procs
from queen_mp.front.parking import ParkingLot
from queen_mp.front.popper import Popper, PopRequest


class _Board:
    """A wake board whose words never move (wakes come from ``pass_baton``)."""

    def value(self, bucket: int) -> int:
        return 0

    def snapshot(self) -> bytes:
        return b""


class _Popper(Popper):
    """Claims nothing, or one message for a queue in ``fill``."""

    def __init__(self) -> None:
        super().__init__(pool=None, lot=ParkingLot(_Board(), 3600),  # type: ignore[arg-type]
                         max_parked=1 << 20)
        self.fill: set[str] = set()

    async def _claim(self, r: PopRequest, lease: uuid.UUID | None,
                     claim_ms: int) -> pop_procs.ClaimResult:
        if r.queue in self.fill:
            self.fill.discard(r.queue)
            return pop_procs.ClaimResult(
                [pop_procs.Claim(r.queue, 1, "p", 1, 1, 1, None, False)], None)
        return pop_procs.ClaimResult([], None)


def _request(queue: str, timeout_ms: int) -> PopRequest:
    return PopRequest(tenant=bytes(16), queue=queue, partition=None, namespace=None, task=None,
                      group="g", batch=1, partitions=1, wait=True, timeout_ms=timeout_ms,
                      auto_ack=True, sub_mode="all", sub_from=None)


async def _woken(p: _Popper, requests: list[PopRequest]) -> None:
    tasks = [asyncio.ensure_future(p.pop(r)) for r in requests]
    for _ in range(3):
        await asyncio.sleep(0)  # each claimed nothing and parked
    p.fill.update(r.queue for r in requests if r.queue is not None)
    for key in list(p.lot._queues):
        p.lot.pass_baton(key)
    if not all(x is not None for x in await asyncio.gather(*tasks)):
        raise AssertionError("a woken pop claimed nothing")


async def _timed_out(p: _Popper, requests: list[PopRequest]) -> None:
    if any(x is not None for x in await asyncio.gather(*(p.pop(r) for r in requests))):
        raise AssertionError("a pop claimed")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="a front worker's long-poll path, in process")
    ap.add_argument("--mode", choices=("woken", "timeout"), default="woken")
    ap.add_argument("--pops", type=int, default=200)
    a = ap.parse_args(argv)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    p = _Popper()
    loop.run_until_complete(_woken(p, [_request(f"w{i}", 30_000) for i in range(10)]))  # warm
    if a.mode == "woken":
        requests = [_request(f"q{i}", 30_000) for i in range(a.pops)]
        operator.call(loop.run_until_complete, _woken(p, requests))
    else:
        requests = [_request(f"t{i}", 100) for i in range(a.pops)]
        operator.call(loop.run_until_complete, _timed_out(p, requests))
    loop.run_until_complete(p.lot.close())
    loop.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
