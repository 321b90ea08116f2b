"""Memory of a live broker's processes under parked long polls: at rest, with ``--parked`` pops
parked, and after they are released, ``--rounds`` times.

The suite's ``wake`` section (bench/consume.py ``run_wake``) sets the broker's peak PSS: 1,000
long-poll pops parked on 1,000 queues (one pop a queue, autoAck, ``subscriptionMode=new``,
``wait=true``), spread over the front workers. This parks the same pops on one broker
(``--workers``, ``--shards``; the suite runs 2 and 1) with nothing else running, and prints each
process's PSS, Private_Dirty and RSS (``/proc/<pid>/smaps_rollup``) at each step, so a change to
what a parked pop holds reads as MB a worker. A release is what the suite does: one message to
every queue (two 500-item pushes), then ``--settle`` seconds for the front workers' quiet-tick
trim (queen_mp/heap.py ``HeapTrim``) before the sample.

``--load 1,10,100,1000`` runs the suite's push cells first, one after the other on the same
broker (bench/loadgen.py, 64 connections, ``--load-s`` each), each sampled every 0.2 s
meanwhile (the highest summed PSS shown: ``peak pushing N``) and after ``--settle``:
what the pops then park on is what the earlier loads left. ``--consume 1,4,16`` then drains,
for each count, ``--consume-msgs`` messages pre-filled over 100 partitions of a fresh queue
with that many consumers (bench/consume.py ``consumer_loop``: pop batch 100, one ack per
batch; ``--consume-groups`` consumer groups each, as the suite's fanout), at most
``--consume-s`` each, sampled after ``--settle`` as the push loads are (``--pop-partitions``,
``--mixed``: as the suite's mixed and fanout). ``--maps`` prints each front worker's and
shard's mappings of 512 KiB or more private dirty pages after each load.

The suite's PSS peak is its wake section's push burst (16 connections of 1-item pushes) with
the pops parked, which meets the 30 s long polls timing out and asked again all at once:
``--repark --timeout-ms 8000 --burst-s 12`` does the same (a pop answered 204 asked again until
its message came; the burst outlasting the timeout), the tree sampled every 0.2 s during the burst.

With ``--diag DIR`` the broker runs with a ``sitecustomize`` of this script's on its
``PYTHONPATH`` (the product is not changed): every forked child starts ``tracemalloc`` and a
thread that, when asked, dumps a snapshot and the gc-tracked objects' counts by type; the
front workers' and shards' growth from rest to parked is printed by allocation site and by
type.
tracemalloc costs memory of its own: read PSS from a run without ``--diag``. ``--depth 0``
starts no tracemalloc (whose hooks hide pymalloc from ``sys._debugmallocstats``): each sample
then prints the front workers' pymalloc arenas, the memory they hold and how much of it is
free (blocks free in used pools, and empty pools), the fragmentation a peak leaves, and glibc's
heap (``mallinfo2``: bytes in use and free in it, and in blocks mapped on their own).
``--mid-diag`` adds a snapshot halfway through each push load: what a worker holds live at a
load's peak, not what the load left. Each process's USS (Private_Clean + Private_Dirty) is
shown beside its PSS: the PSS of pages shared with other Python processes on the machine moves
with them; its anonymous pages' PSS (``Pss_Anon``: the heap, the arenas, what the children share
of the supervisor's by fork) does not, and the tree's sum of it is shown with the total.
``--port`` gives the broker a port of its own::

    PYTHONPATH=<tree> .venv/bin/python -m bench.parkmem --dsn 'host=... dbname=<yours>'
    PYTHONPATH=<tree> .venv/bin/python -m bench.parkmem --dsn '...' --diag /tmp/parkdiag
    PYTHONPATH=<tree> .venv/bin/python -m bench.parkmem --load 1,10,100,1000 --rounds 1 \
        --diag /tmp/parkdiag --depth 0
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import secrets
import sys
import tempfile
import time
import tracemalloc
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import psycopg
from psycopg import sql

from bench import push as pb
from bench.consume import (
    Arm,
    Http,
    OpStats,
    cancel_all,
    consumer_loop,
    payload,
    push_body,
    push_to_all,
)
from bench.loadgen import LoadSpec, run_load

#: what the broker's children run when ``--diag`` is given (written as its sitecustomize.py)
_SITECUSTOMIZE = '''
import os, sys, threading, time


def _glibc_heap():
    """glibc's mallinfo2 as lines of the arenas file: its heap's bytes in use and free, and
    its mapped blocks' (empty without glibc)."""
    from queen_mp.heap import glibc_heap
    m = glibc_heap()
    if m is None:
        return ""
    return (f"glibc heap = {m.arena}\\nglibc in use = {m.uordblks}\\nglibc free = {m.fordblks}\\n"
            f"glibc mapped = {m.hblkhd}\\nglibc mapped blocks = {m.hblks}\\n")


def _child():
    import gc, json, pickle, tracemalloc
    out = os.environ["PARKMEM_DIAG"]
    depth = int(os.environ.get("PARKMEM_DEPTH", "6"))
    if depth:  # 0: no tracemalloc (its hooks hide pymalloc's arenas from the stats)
        tracemalloc.start(depth)
    me, done = os.getpid(), set()

    def watch():
        while True:
            time.sleep(0.2)
            try:
                tags = [n[4:] for n in os.listdir(out) if n.startswith("ask-")]
            except OSError:
                continue
            for tag in tags:
                if tag in done:
                    continue
                done.add(tag)
                counts = {}
                for o in gc.get_objects():
                    name = type(o).__qualname__
                    counts[name] = counts.get(name, 0) + 1
                snap = tracemalloc.take_snapshot() if depth else None
                # pymalloc's arenas (sys._debugmallocstats writes to fd 2, lent for the call)
                with open(f"{out}/{me}-{tag}.arenas", "w") as f:
                    err = os.dup(2)
                    try:
                        sys.stderr.flush()
                        os.dup2(f.fileno(), 2)
                        sys._debugmallocstats()
                    finally:
                        os.dup2(err, 2)
                        os.close(err)
                    f.write(_glibc_heap())
                if snap is not None:
                    with open(f"{out}/{me}-{tag}.tm", "wb") as f:
                        pickle.dump(snap, f, pickle.HIGHEST_PROTOCOL)
                with open(f"{out}/{me}-{tag}.json.tmp", "w") as f:
                    json.dump(counts, f)
                os.rename(f"{out}/{me}-{tag}.json.tmp", f"{out}/{me}-{tag}.json")

    threading.Thread(target=watch, daemon=True, name="parkmem").start()


if os.environ.get("PARKMEM_DIAG"):
    os.register_at_fork(after_in_child=_child)
'''


#: the front's protocol class: one instance an open HTTP connection
_PROTOCOL = "CorkedHttpToolsProtocol"


def _fields(pid: int) -> dict[str, int]:
    """Pss, Pss_Anon, Private_Clean, Private_Dirty and Rss of ``pid`` in kB (zeros once it is
    gone)."""
    out = {"Pss": 0, "Pss_Anon": 0, "Private_Clean": 0, "Private_Dirty": 0, "Rss": 0}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                name, _, rest = line.partition(b":")
                key = name.decode()
                if key in out:
                    out[key] = int(rest.split()[0])
    except OSError:
        pass
    return out


def _role(pid: int, root: int) -> str:
    if pid == root:
        return "supervisor"
    try:
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        comm = "gone"
    return comm if comm.startswith("qmp-") else f"worker {pid}"


def big_mappings(pid: int, min_kb: int = 512) -> list[str]:
    """``pid``'s mappings with at least ``min_kb`` of private dirty pages: size, dirty, name."""
    out: list[str] = []
    head: list[str] = []
    try:
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                first = line.split(None, 1)[0]
                if "-" in first and not first.endswith(":"):
                    head = line.split()
                elif first == "Private_Dirty:" and int(line.split()[1]) >= min_kb:
                    lo, hi = (int(x, 16) for x in head[0].split("-"))
                    name = head[5] if len(head) > 5 else "[anon]"
                    out.append(f"{(hi - lo) // 1024}k/{line.split()[1]}k {Path(name).name}")
    except OSError:
        pass
    return out


def sample(root: int) -> dict[str, dict[str, int]]:
    """Each broker process's memory by role (kB)."""
    return {_role(p, root): _fields(p) for p in pb.process_tree(root)}


def _drop(server_dsn: str, name: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))


async def parked_count(url: str) -> float:
    """The broker's parked pops (-1: the scrape failed; a worker under ``--diag`` is slow)."""
    def read() -> float:
        try:
            status, body = pb.http_get(url + "/metrics/prometheus", timeout=30)
        except OSError:
            return -1.0
        if status != 200:
            return -1.0
        return sum(float(line.split()[-1]) for line in body.decode().splitlines()
                   if line.startswith("queen_parked_pops"))
    return await asyncio.to_thread(read)


class Diag:
    """Asks the broker's children (``_SITECUSTOMIZE``) for snapshots and compares them."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.site = out / "site"
        self.site.mkdir(parents=True, exist_ok=True)
        (self.site / "sitecustomize.py").write_text(_SITECUSTOMIZE)

    async def ask(self, tag: str, pids: list[int]) -> None:
        """Snapshots of ``pids`` at ``tag``; prints each one's arenas."""
        (self.out / f"ask-{tag}").touch()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                (self.out / f"{p}-{tag}.json").exists() for p in pids):
            await asyncio.sleep(0.2)
        for p in pids:
            print(f"  worker {p} {tag}: {self.arenas(p, tag)}", flush=True)

    def arenas(self, pid: int, tag: str) -> str:
        """``pid``'s pymalloc arenas at ``tag``: what a worker keeps of a peak shows here, as
        arenas held for a few live blocks (CPython frees an arena only once it is empty)."""
        text = (self.out / f"{pid}-{tag}.arenas").read_text()
        stat = {}
        for line in text.splitlines():
            name, eq, value = line.rpartition("=")
            if eq and value.replace(",", "").strip().isdigit():
                stat[name.strip()] = int(value.replace(",", ""))
        pools, empty = 0, 0  # its line: "N unused pools * SIZE bytes = TOTAL"
        for line in text.splitlines():
            if line.split()[1:3] == ["unused", "pools"]:
                pools, empty = int(line.split()[0]), int(line.rpartition("=")[2].replace(",", ""))
        mb = 1 << 20
        return (f"{stat.get('# arenas allocated current', 0)} arenas: live blocks "
                f"{stat.get('# bytes in allocated blocks', 0) / mb:.1f} MB, free blocks "
                f"{stat.get('# bytes in available blocks', 0) / mb:.1f} MB, {pools} empty pools "
                f"{empty / mb:.1f} MB; glibc heap {stat.get('glibc heap', 0) / mb:.1f} MB "
                f"(in use {stat.get('glibc in use', 0) / mb:.1f}, free "
                f"{stat.get('glibc free', 0) / mb:.1f}), mapped "
                f"{stat.get('glibc mapped', 0) / mb:.1f} MB in "
                f"{stat.get('glibc mapped blocks', 0)}")

    def connections(self, pid: int, before: str, after: str) -> int:
        """The HTTP connections ``pid`` gained from ``before`` to ``after`` (its protocols)."""
        c0, c1 = (json.loads((self.out / f"{pid}-{t}.json").read_text()) for t in (before, after))
        return max(0, c1.get(_PROTOCOL, 0) - c0.get(_PROTOCOL, 0))

    def report(self, pid: int, before: str, after: str, per: int, top: int) -> None:
        if not (self.out / f"{pid}-{after}.tm").exists():  # --depth 0
            return
        with open(self.out / f"{pid}-{before}.tm", "rb") as f:
            s0: tracemalloc.Snapshot = pickle.load(f)
        with open(self.out / f"{pid}-{after}.tm", "rb") as f:
            s1: tracemalloc.Snapshot = pickle.load(f)
        # the watcher's own frames and the snapshot machinery are not the broker's
        keep = [tracemalloc.Filter(False, tracemalloc.__file__),
                tracemalloc.Filter(False, "<frozen importlib._bootstrap>")]
        s0, s1 = s0.filter_traces(keep), s1.filter_traces(keep)
        total = sum(d.size_diff for d in s1.compare_to(s0, "filename"))
        print(f"\n### worker {pid}: tracemalloc {before} -> {after}: {total / 1024:+,.0f} KiB, "
              f"{total / per:+,.0f} B a pop ({per} pops)")
        for d in s1.compare_to(s0, "traceback")[:top]:
            if d.size_diff <= 0:
                continue
            print(f"{d.size_diff / per:+8,.0f} B/pop {d.count_diff / per:+6.2f} blocks/pop: "
                  + " < ".join(f"{Path(f.filename).name}:{f.lineno}"
                               for f in reversed(d.traceback)))
        c0 = json.loads((self.out / f"{pid}-{before}.json").read_text())
        c1 = json.loads((self.out / f"{pid}-{after}.json").read_text())
        grown = Counter({k: c1.get(k, 0) - c0.get(k, 0) for k in c1})
        print("gc-tracked objects a pop: " + ", ".join(
            f"{k} {v / per:+.2f}" for k, v in grown.most_common(25) if v > 0))


async def consume_load(url: str, queue: str, consumers: int, groups: int, msgs: int,
                       seconds: float, mixed: bool, partitions: int) -> tuple[int, float]:
    """``msgs`` messages pushed over 100 partitions of ``queue`` (1,000-item requests), then
    drained by ``consumers`` consumers in each of ``groups`` groups (pop batch 100 over up to
    ``partitions`` partitions, one ack a batch) for at most ``seconds``; ``mixed``: for
    ``seconds``, while the suite's mixed pushes (16 connections of 10 items) feed it. Returns
    (messages acked, msgs/s)."""
    http = Http(url, timeout=120)
    try:
        for s in range(0, msgs, 1000):
            body = push_body([(queue, f"p-{i % 100:03d}", f"{queue}-{i}", payload(queue, i))
                              for i in range(s, min(msgs, s + 1000))])
            status, answer = await http.request("POST", "/api/v1/push", body)
            if status != 201:
                raise RuntimeError(f"prefill of {queue}: {status} {answer[:300]!r}")
    finally:
        http.close()
    arm, st = Arm("queen-mp", url), OpStats()
    https = [Http(url) for _ in range(consumers * groups)]
    t0 = time.monotonic()
    feed = asyncio.create_task(asyncio.to_thread(run_load, LoadSpec(
        url, connections=16, procs=1, items=10, duration=seconds, partitions=100,
        queue=queue))) if mixed else None
    tasks = [asyncio.create_task(consumer_loop(arm, h, queue, 100, partitions, f"g{i % groups}", st,
                                               lambda *_: None, 0.0, wait_ms=1000))
             for i, h in enumerate(https)]
    while time.monotonic() - t0 < seconds and (mixed or st.acked < msgs * groups):
        await asyncio.sleep(0.1)
    if feed is not None:
        await feed
    await cancel_all(tasks)
    for h in https:
        h.close()
    return st.acked, st.acked / (time.monotonic() - t0)


async def load_peak(spec: LoadSpec, root: int) -> tuple[dict, dict[str, dict[str, int]]]:
    """``run_load(spec)`` with the tree sampled every 0.2 s meanwhile: its result, and the
    sample of the highest summed PSS."""
    done = asyncio.Event()
    peak: dict[str, dict[str, int]] = {}

    async def sampler() -> None:
        nonlocal peak
        while not done.is_set():
            now = sample(root)
            if sum(m["Pss"] for m in now.values()) > sum(m["Pss"] for m in peak.values()):
                peak = now
            await asyncio.sleep(0.2)

    watch = asyncio.create_task(sampler())
    try:
        run = await asyncio.to_thread(run_load, spec)
    finally:
        done.set()
        await watch
    return run, peak


async def burst(url: str, queue: str, seconds: float, root: int,
                rest: dict[str, dict[str, int]]) -> None:
    """The suite's wake-section push burst with the pops parked (its probe 5, where ``make
    bench`` sets the broker's PSS peak): 16 connections of 1-item pushes over 100 partitions;
    the tree sampled every 0.2 s, its highest summed PSS shown."""
    run, peak = await load_peak(LoadSpec(url, connections=16, procs=1, items=1,
                                         duration=seconds, partitions=100, queue=queue), root)
    show(f"burst peak ({run['msgs_per_s'] / 1000:.1f}k/s)", peak, rest)


def show(label: str, mem: dict[str, dict[str, int]], base: dict[str, dict[str, int]] | None
         ) -> None:
    total = sum(m["Pss"] for m in mem.values())
    parts = []
    for role, m in sorted(mem.items()):
        delta = "" if base is None or role not in base else \
            f" ({(m['Pss'] - base[role]['Pss']) / 1024:+.1f})"
        parts.append(f"{role} {m['Pss'] / 1024:.1f}{delta} [anon {m['Pss_Anon'] / 1024:.1f} dirty "
                     f"{m['Private_Dirty'] / 1024:.1f} uss "
                     f"{(m['Private_Dirty'] + m['Private_Clean']) / 1024:.1f}]")
    anon = sum(m["Pss_Anon"] for m in mem.values())
    print(f"{label:<22} PSS {total / 1024:6.1f} MB (anon {anon / 1024:5.1f}): "
          + "; ".join(parts), flush=True)


async def run(args: argparse.Namespace) -> int:
    rid = secrets.token_hex(3)
    own_db = args.dsn is None
    name = f"{args.db_prefix}{rid}_park"
    dsn = pb.create_database(args.server_dsn, name) if own_db else args.dsn
    tmp = Path(tempfile.mkdtemp(prefix="queen-parkmem-"))
    diag = Diag(Path(args.diag) / rid) if args.diag else None
    env = pb._clean_env()
    port = args.port or pb.free_port()
    env.update({"QUEEN_PORT": str(port), "QUEEN_DATA_DIR": str(tmp),
                "QUEEN_WORKERS": str(args.workers), "QUEEN_V2_FUSION_SHARDS": str(args.shards),
                "QUEEN_LOG_LEVEL": "info", "QUEEN_SHUTDOWN_TIMEOUT_S": "20",
                "QUEEN_PG_DSN": dsn})
    env.update(kv.split("=", 1) for kv in args.env)
    if diag is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(diag.site), env.get("PYTHONPATH", "")) if p)
        env["PARKMEM_DIAG"] = str(diag.out)
        env["PARKMEM_DEPTH"] = str(args.depth)
    srv = pb.Server("queen-mp", f"http://127.0.0.1:{port}",
                    pb._spawn([sys.executable, "-m", "queen_mp.processes.cli", "serve"], env,
                              tmp / "broker.log"), tmp / "broker.log", dsn)
    root = srv.proc.pid
    try:
        await asyncio.to_thread(srv.wait_ready)
        queues = [f"park-{rid}-{i:04d}" for i in range(args.parked)]
        await push_to_all(srv.url, queues, f"{rid}-mk")  # the queues exist before the pops
        await asyncio.sleep(args.settle)
        rest = sample(root)
        show("at rest", rest, None)
        workers = [p for p in pb.process_tree(root)
                   if _role(p, root).startswith("worker")]
        # the shards too: what a shard keeps of the loads is part of the peak
        watched = workers + [p for p in pb.process_tree(root)
                             if _role(p, root).startswith("qmp-shard")]
        if diag is not None:
            await diag.ask("rest", watched)

        async def checkpoint(tag: str) -> None:
            """After a load: the big mappings (``--maps``) and the snapshots (``--diag``)."""
            if args.maps:
                for p in watched:
                    print(f"  {_role(p, root)}: " + ", ".join(big_mappings(p)), flush=True)
            if diag is not None:
                await diag.ask(tag, watched)

        for items in args.load:
            mid = None
            if diag is not None and args.mid_diag:  # a snapshot halfway through the load
                async def halfway(tag: str = f"mid{items}") -> None:
                    await asyncio.sleep(args.load_s / 2)
                    await diag.ask(tag, watched)
                mid = asyncio.create_task(halfway())
            run, peak = await load_peak(LoadSpec(
                srv.url, items=items, duration=args.load_s, queue=f"load-{rid}"), root)
            if mid is not None:
                await mid
            show(f"peak pushing {items}", peak, rest)
            await asyncio.sleep(args.settle)
            show(f"pushed {items} ({run['msgs_per_s'] / 1000:.1f}k/s)", sample(root), rest)
            await checkpoint(f"pushed{items}")
        for consumers in args.consume:
            acked, rate = await consume_load(srv.url, f"cons-{rid}-{consumers}", consumers,
                                             args.consume_groups, args.consume_msgs,
                                             args.consume_s, args.mixed,
                                             args.pop_partitions)
            await asyncio.sleep(args.settle)
            show(f"consumed x{consumers} ({rate / 1000:.1f}k/s)", sample(root), rest)
            if acked < args.consume_msgs * args.consume_groups:
                print(f"  {acked} of {args.consume_msgs * args.consume_groups} acked", flush=True)
            await checkpoint(f"consumed{consumers}")
        tail = (f"?batch=1&consumerGroup=park&subscriptionMode=new&autoAck=true&wait=true"
                f"&timeout={args.timeout_ms}")
        for r in range(1, args.rounds + 1):
            https = [Http(srv.url, timeout=args.timeout_ms / 1000 + 30) for _ in queues]
            sem = asyncio.Semaphore(100)

            async def opener(h: Http, sem: asyncio.Semaphore = sem) -> None:
                async with sem:
                    await h.connect()

            await asyncio.gather(*(opener(h) for h in https))
            await asyncio.sleep(1.0)
            show(f"round {r}: connected", sample(root), rest)
            answers: Counter[int] = Counter()

            async def pop(q: str, h: Http, answers: Counter[int] = answers) -> None:
                while True:  # --repark: asked again at once, as the suite's wake section
                    status, _ = await h.request(
                        "GET", f"/api/v1/pop/queue/{quote(q, safe='')}" + tail)
                    answers[status] += 1
                    # until its message came: a pop timing out while the release is on its
                    # way asks again (a flag set before the push ended such a cohort with
                    # 204s alone, read as undelivered)
                    if not args.repark or status != 204:
                        return

            tasks = []
            for q, h in zip(queues, https, strict=True):
                tasks.append(asyncio.create_task(pop(q, h)))
                if args.pace and len(tasks) % args.pace == 0:
                    await asyncio.sleep(0.25)  # this batch parks before the next one comes
            t0 = time.monotonic()
            count = 0.0
            while time.monotonic() - t0 < args.park_wait:
                count = await parked_count(srv.url)
                if count >= args.parked:
                    break
                await asyncio.sleep(0.25)
            await asyncio.sleep(1.0)
            parked = sample(root)
            show(f"round {r}: {count:.0f} parked", parked, rest)
            if diag is not None and r == 1:
                await diag.ask("parked", watched)
            if args.burst_s > 0:
                await burst(srv.url, f"burst-{rid}", args.burst_s, root, rest)
                if diag is not None and r == 1:
                    await diag.ask("burst", watched)
            await push_to_all(srv.url, queues, f"{rid}-rel{r}")
            await asyncio.wait(tasks, timeout=30)
            if any(not t.done() for t in tasks) or set(answers) != {200}:
                print(f"  release: answers {dict(answers)}, "
                      f"{sum(not t.done() for t in tasks)} unanswered", flush=True)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for h in https:
                h.close()
            await asyncio.sleep(args.settle)
            show(f"round {r}: released", sample(root), rest)
            if diag is not None and r == 1:
                await diag.ask("released", watched)
        if diag is not None:
            for p in watched:
                if args.load:
                    if args.mid_diag:
                        diag.report(p, "rest", f"mid{args.load[-1]}", 1, args.top)
                    diag.report(p, "rest", f"pushed{args.load[-1]}", 1, args.top)
                if args.consume:
                    diag.report(p, f"pushed{args.load[-1]}" if args.load else "rest",
                                f"consumed{args.consume[-1]}", 1, args.top)
                if not args.rounds:
                    continue
                per = diag.connections(p, "rest", "parked") or args.parked // len(workers)
                diag.report(p, "rest", "parked", per, args.top)
                if args.burst_s > 0:
                    diag.report(p, "parked", "burst", per, args.top)
                diag.report(p, "rest", "released", per, args.top)
        return 0
    finally:
        await asyncio.to_thread(srv.stop)
        if own_db:
            _drop(args.server_dsn, name)


def _ints(value: str) -> list[int]:
    return [int(x) for x in value.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server-dsn", default=pb.LOCAL_DSN,
                    help="where a database of its own is made (when no --dsn)")
    ap.add_argument("--dsn", default=None, help="an existing database to run the broker on")
    ap.add_argument("--db-prefix", default="queen_bench_",
                    help="the name of the database made (and dropped) for the run starts so")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--parked", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--timeout-ms", type=int, default=30000, help="each pop's long poll")
    ap.add_argument("--pace", type=int, default=0,
                    help="send the pops N at a time, 0.25 s apart (0: all at once, as the suite)")
    ap.add_argument("--park-wait", type=float, default=60.0,
                    help="seconds to wait for every pop to park")
    ap.add_argument("--settle", type=float, default=4.0,
                    help="seconds before a sample at rest or after a release")
    ap.add_argument("--diag", metavar="DIR", default=None,
                    help="tracemalloc and gc counts in the broker's children, dumped in DIR")
    ap.add_argument("--load", type=_ints, default=[],
                    metavar="N,N..", help="before the pops: push loads of N items a request "
                    "(bench/loadgen.py, 64 connections), one after the other, each sampled")
    ap.add_argument("--load-s", type=float, default=10.0, help="each push load's seconds")
    ap.add_argument("--mid-diag", action="store_true",
                    help="with --diag: also a snapshot halfway through each push load (what a "
                    "worker holds live at a load's peak)")
    ap.add_argument("--port", type=int, default=0, help="the broker's port (0: a free one)")
    ap.add_argument("--consume", type=_ints, default=[], metavar="C,C..",
                    help="after the push loads: drain a pre-filled queue with C consumers (pop "
                    "batch 100 + ack), one after the other, each sampled")
    ap.add_argument("--consume-msgs", type=int, default=20000,
                    help="messages pre-filled for each --consume drain")
    ap.add_argument("--consume-groups", type=int, default=1,
                    help="consumer groups draining each --consume queue (C consumers each)")
    ap.add_argument("--consume-s", type=float, default=10.0,
                    help="each --consume drain's cap in seconds")
    ap.add_argument("--pop-partitions", type=int, default=1,
                    help="partitions a --consume pop may claim (the suite's mixed and fanout: 10)")
    ap.add_argument("--mixed", action="store_true",
                    help="each --consume drain runs --consume-s with the suite's mixed pushes "
                    "(16 connections of 10 items) into its queue")
    ap.add_argument("--repark", action="store_true",
                    help="a pop answered (a wake, its --timeout-ms) is asked again at once until "
                    "the release, as the suite's wake section: with --burst-s past --timeout-ms "
                    "the burst meets the wave of timed-out pops parking again (the suite's peak)")
    ap.add_argument("--burst-s", type=float, default=0.0,
                    help="with the pops parked: a push burst of this many seconds (16 "
                    "connections, 1 item a request, as the suite's wake section), peak shown")
    ap.add_argument("--maps", action="store_true",
                    help="after each load, the front workers' and shards' mappings of "
                    "512 KiB or more private dirty pages")
    ap.add_argument("--env", action="append", default=[], metavar="QUEEN_X=V",
                    help="a setting for the broker (repeatable), e.g. "
                    "QUEEN_DEDUP_FILTER_ENTRIES=0 to leave the shard's filter out")
    ap.add_argument("--depth", type=int, default=6,
                    help="tracemalloc's frames (--diag); 0: none, for pymalloc's arena figures")
    ap.add_argument("--top", type=int, default=25, help="allocation sites shown (--diag)")
    return asyncio.run(run(ap.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
