"""Prometheus metrics in multiprocess mode.

Every front worker and every shard writes its samples into ``PROMETHEUS_MULTIPROC_DIR``, which
the supervisor sets before anything imports prometheus_client (the client picks its value mode
at import). Metric objects are therefore built after fork, by ``Metrics()``, never at import
time, and are not registered in the default registry: the scrape endpoint collects the files.
"""

from __future__ import annotations

import asyncio
import json
import os
import struct
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["FUSION_ERROR_REASONS", "OTHER_QUEUES_LABEL", "OTHER_TENANTS_LABEL", "QUEUE_GAUGES",
           "QUEUE_SNAPSHOT", "Metrics", "QueueGaugeCollector", "QueueRow", "Tally",
           "mark_process_dead", "render_latest", "write_queue_snapshot"]

_FUSION_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


_pid = os.getpid()


def _refresh_pid() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_refresh_pid)


def _cached_pid() -> int:
    return _pid


def _use_cached_pid() -> None:
    """Multiprocess values ask for the process id on every ``inc``/``set``/``observe``;
    prometheus_client's default, ``os.getpid``, is a system call each time (glibc no longer
    caches it), 7.8% of a front worker's GIL-held samples under 1-item pushes (py-spy). The
    pid kept here is refreshed in every forked child, so processes running at once still get
    distinct ids, as the client requires. Must run before this process builds a metric."""
    from prometheus_client import values

    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and not getattr(
            values.ValueClass, "queen_cached_pid", False):
        values.ValueClass = values.MultiProcessValue(process_identifier=_cached_pid)
        values.ValueClass.queen_cached_pid = True


Labels = tuple[str, ...]

#: The label values every labelled family is created with at zero, so that a fresh broker's
#: first scrape already has each series a dashboard or an alert names (an absent series is a
#: blank panel and an alert that cannot fire). Fusion errors are labelled by the class name of
#: the failure: the database errors of queen_mp/db/errors.py (tests/unit/test_metrics_zero.py
#: checks the names), anything else is labelled as it comes.
FUSION_ERROR_REASONS = ("Unavailable", "OutcomeUnknown", "StatementTimeout", "Conflict",
                        "MaintenanceOn", "StatementError", "DatabaseError")
_PUSH_STATUSES = ("queued", "duplicate", "buffered", "failed")
_ADMISSION_CODES = ("overloaded", "storage_full")
_SCRAPE_ROUTE = "/metrics/prometheus"

#: Label of the per-queue series beyond ``QUEEN_METRICS_QUEUE_CAP`` (summed, or the worst of
#: them for ages), and of every tenant's but the default one's: ``/metrics/prometheus`` is
#: public, so it never names another tenant's queue or group (docs/api.md 1.5).
OTHER_QUEUES_LABEL = "(other)"
OTHER_TENANTS_LABEL = "(other tenants)"

#: The per-queue gauges (name -> help, labels). Not per-process samples: shard 0 of each
#: instance computes them every ``QUEEN_METRICS_QUEUE_S`` with one SQL call
#: (``queen.queue_gauges_v1``, bounded to the cap by the database) and writes them to
#: ``QUEUE_SNAPSHOT`` in the metrics directory; every scrape reads that file.
QUEUE_GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "queen_queue_depth": (
        "Messages not yet consumed by every group (docs/api.md 5, pending without a group).",
        ("queue",)),
    "queen_queue_oldest_unconsumed_age_seconds": (
        "Age of the oldest message some group (or, with no group, anyone) has not consumed; "
        "0 when none.", ("queue",)),
    "queen_consumer_lag_messages": (
        "Messages a consumer group has not consumed yet, over the queue's partitions.",
        ("queue", "group")),
    "queen_consumer_lag_seconds": (
        "Age of the oldest message a consumer group has not consumed yet; 0 when caught up.",
        ("queue", "group")),
    "queen_dlq_depth": ("Dead-letter rows per queue.", ("queue",)),
}
#: File name of the per-queue gauges' snapshot inside the metrics directory (prometheus_client
#: reads only its ``*.db`` files there).
QUEUE_SNAPSHOT = "queue-gauges.json"


class Tally:
    """Metric updates of one event-loop turn, written to the samples once at its end.

    PERF(metrics): every multiprocess sample update packs and writes its value into the
    process's mmap file under a lock, and ``labels()`` validates and looks its child up each
    time: under 1-item pushes a front worker spent 12% of its samples (py-spy) on the six
    updates of each request. Here a request adds to a dict; the turn's sums go out in one
    callback, scheduled on the running loop with the first update (``call_soon``: before the
    answers of that turn are written to their sockets, which uvicorn also schedules so, so a
    scrape that follows an answer sees what it counted). Outside a running loop an update is
    written at once.

    A sampled gauge (``sample``) is read at each flush and written only when it changed: a
    figure that moves with every request (admission's bytes in flight) costs nothing per
    request, and a sequential client's flushes, which see it back at its resting value, write
    nothing.
    """

    def __init__(self) -> None:
        self._counts: dict[tuple[Any, Labels], float] = {}
        self._observed: dict[tuple[Any, Labels], list[float]] = {}
        self._samples: dict[Any, tuple[Callable[[], float], float | None]] = {}
        self._children: dict[tuple[Any, Labels], Any] = {}
        self._due = False

    # PERF(metrics): the callers test ``_due`` themselves: a call less per update
    def inc(self, counter: Any, labels: Labels = (), amount: float = 1) -> None:
        """``counter.labels(*labels).inc(amount)``, at the end of the turn."""
        key = (counter, labels)
        self._counts[key] = self._counts.get(key, 0) + amount
        if not self._due:
            self._schedule()

    def observe(self, histogram: Any, labels: Labels, value: float) -> None:
        """``histogram.labels(*labels).observe(value)``, at the end of the turn."""
        key = (histogram, labels)
        seen = self._observed.get(key)
        if seen is None:
            self._observed[key] = [value]
        else:
            seen.append(value)
        if not self._due:
            self._schedule()

    def sample(self, gauge: Any, read: Callable[[], float]) -> None:
        """From now on, ``gauge.set(read())`` (an unlabelled gauge) at the end of every turn
        that flushes, if the value changed since the last write; the first write is due at
        the end of this turn."""
        self._samples[gauge] = (read, None)
        if not self._due:
            self._schedule()

    def _schedule(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        self._due = True
        loop.call_soon(self.flush)

    def _child(self, metric: Any, labels: Labels) -> Any:
        if not labels:
            return metric
        key = (metric, labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def flush(self) -> None:
        """Write what the turn counted (the loop calls it; tests may too)."""
        self._due = False
        counts, self._counts = self._counts, {}
        observed, self._observed = self._observed, {}
        for (metric, labels), amount in counts.items():
            self._child(metric, labels).inc(amount)
        for (metric, labels), values in observed.items():
            child = self._child(metric, labels)
            # PERF(metrics): Histogram.observe's own two writes (sum, first bucket at or
            # above the value), summed over the turn: one write per bucket touched.
            child._sum.inc(sum(values))
            per_bucket: dict[int, int] = {}
            for value in values:
                i = bisect_left(child._upper_bounds, value)
                per_bucket[i] = per_bucket.get(i, 0) + 1
            for i, n in per_bucket.items():
                child._buckets[i].inc(n)
        samples = self._samples
        for gauge, (read, written) in samples.items():
            value = read()
            if value != written:
                samples[gauge] = (read, value)
                gauge.set(value)


_DOUBLE = struct.Struct("d").pack


class _FileSample:
    """A multiprocess counter sample that only its owner adds to, written into the
    process's samples file by one slice store (its timestamp stays 0.0, as ``inc`` leaves it).

    PERF(metrics): a value's ``inc`` takes the client's lock, checks the pid (a Python call)
    and writes through two more; a shard adds to its bundle samples once per bundle, from its
    event loop alone. The value's own total is kept in step, so ``get`` and a later ``inc``
    see it. The file is looked up at each write: it is mapped anew when it grows."""

    __slots__ = ("file", "pos", "value")

    def __init__(self, value: Any) -> None:
        self.value = value
        self.file = value._file
        self.pos = self.file._positions[value._key]

    def add(self, amount: float) -> None:
        value = self.value
        value._value += amount
        pos = self.pos
        self.file._m[pos:pos + 8] = _DOUBLE(value._value)


class _PlainSample:
    """A sample of a value without a file (outside multiprocess mode): its own ``inc``."""

    __slots__ = ("add",)

    def __init__(self, value: Any) -> None:
        self.add = value.inc


def _sample(value: Any) -> _FileSample | _PlainSample:
    return _FileSample(value) if getattr(value, "_multiprocess", False) else _PlainSample(value)


class Metrics:
    """The broker's metric families; one instance per process."""

    def __init__(self, instance: str = "") -> None:
        _use_cached_pid()
        from prometheus_client import Counter, Gauge, Histogram

        self.instance = instance
        #: the process's batched updates of the hot paths (see Tally)
        self.tally = Tally()
        kw: dict[str, Any] = {"registry": None}
        # NOTE(queen): an info metric: join on it to tell instances apart beyond the scrape
        # target (several instances behind one address, or a renamed host).
        self.instance_info = Gauge(
            "queen_instance_info", "This broker instance: its QUEEN_INSTANCE_ID and version.",
            ["instance_id", "version"], multiprocess_mode="max", **kw)
        from queen_mp import __version__
        self.instance_info.labels(instance, __version__).set(1)
        self.http_requests = Counter(
            "queen_http_requests", "HTTP requests answered, by route template and status.",
            ["route", "status"], **kw)
        self.http_latency = Histogram(
            "queen_http_request_duration_seconds", "HTTP request latency by route template.",
            ["route"], buckets=_LATENCY_BUCKETS, **kw)
        self.batch_items_fired = Counter(
            "queen_batch_items_fired", "Frames committed by push fusion bundles.", **kw)
        self.fusion_items_per_batch = Histogram(
            "queen_fusion_items_per_batch", "Frames per committed push bundle.",
            buckets=_FUSION_BUCKETS, **kw)
        self.fusion_commits = Counter(
            "queen_fusion_commits", "Push bundles committed.", **kw)
        self.fusion_segments = Counter(
            "queen_fusion_segments", "Segments written by push bundles.", **kw)
        self.fusion_errors = Counter(
            "queen_fusion_bundle_errors", "Push bundles that failed, by error class.",
            ["reason"], **kw)
        self.dedup_read_backs = Counter(
            "queen_dedup_read_backs", "Partitions whose stored transaction hashes a shard read "
            "back into its dedup filter, by result (ok, failed).", ["result"], **kw)
        self.dedup_sql_probes = Counter(
            "queen_dedup_sql_probes", "Pushed segments whose dedup check read stored hashes "
            "in SQL: the shard's filter could not vouch for every stored offset below them "
            "(a partition it forgot past QUEEN_DEDUP_FILTER_ENTRIES or has not held since "
            "its start, rows another writer added, a fingerprint match), so the probe read "
            "those still inside the dedup window, about 0.3 us of PostgreSQL CPU a hash.",
            **kw)
        self.pg_statement_timeouts = Counter(
            "queen_pg_statement_timeouts", "Statements past QUEEN_PG_STATEMENT_TIMEOUT_MS or "
            "cancelled by the server (SQLSTATE 57014).", **kw)
        self.pg_cancels = Counter(
            "queen_pg_cancels", "Out-of-band cancel requests sent for a statement past its "
            "deadline, by result (sent, failed).", ["result"], **kw)
        self.pg_quarantines = Counter(
            "queen_pg_quarantines", "Connections closed and replaced because a statement "
            "overran its deadline (never reused while the server may still run it).", **kw)
        self.pg_pool_connections = Gauge(
            "queen_pg_pool_connections", "Front workers' pooled PostgreSQL connections by "
            "state (in_use, idle).", ["state"], multiprocess_mode="livesum", **kw)
        self.pg_pool_max = Gauge(
            "queen_pg_pool_max", "Front workers' pool capacity (QUEEN_PG_POOL_SIZE each).",
            multiprocess_mode="livesum", **kw)
        self.pg_pool_waiting = Gauge(
            "queen_pg_pool_waiting", "Requests waiting for a pooled PostgreSQL connection.",
            multiprocess_mode="livesum", **kw)
        self.disk_used_percent = Gauge(
            "queen_disk_used_percent", "Use of the filesystems of the spool (and of the "
            "embedded cluster), as admission measures it.", multiprocess_mode="livemax", **kw)
        self.disk_high_percent = Gauge(
            "queen_disk_high_percent", "QUEEN_DISK_HIGH_PCT: above it pushes answer 507.",
            multiprocess_mode="livemax", **kw)
        self.dedup_filter_entries = Gauge(
            "queen_dedup_filter_entries", "Transaction hashes the shards' dedup filters hold.",
            multiprocess_mode="livesum", **kw)
        self.dedup_filter_spilled_entries = Gauge(
            "queen_dedup_filter_spilled_entries", "Of queen_dedup_filter_entries, those in "
            "the shards' spill files on local disk (QUEEN_DEDUP_SPILL_BYTES).",
            multiprocess_mode="livesum", **kw)
        self.messages_pushed = Counter(
            "queen_messages_pushed", "Push items by verdict.", ["status"], **kw)
        self.messages_popped = Counter(
            "queen_messages_popped", "Messages delivered by pops.", **kw)
        self.messages_acked = Counter(
            "queen_messages_acked", "Messages whose cursor advanced by an ack.", **kw)
        self.messages_evicted = Counter(
            "queen_messages_evicted", "Messages deleted unconsumed by housekeeping because "
            "they waited longer than their queue's maxWaitTimeSeconds.", **kw)
        self.ack_fusion_commits = Counter(
            "queen_ack_fusion_commits", "Ack fusion flushes committed.", **kw)
        self.ack_fusion_rows = Counter(
            "queen_ack_fusion_rows", "Cursor advances committed by ack fusion.", **kw)
        self.ack_registry = Counter(
            "queen_ack_registry_lookups", "Ack registry lookups by result (hit, miss).",
            ["result"], **kw)
        self.spool_pending = Gauge(
            "queen_spool_pending", "Records waiting in the disk spool.",
            multiprocess_mode="max", **kw)
        self.maintenance_mode = Gauge(
            "queen_maintenance_mode", "1 while push (kind=push) or pop maintenance is on.",
            ["kind"], multiprocess_mode="max", **kw)
        self.parked_pops = Gauge(
            "queen_parked_pops", "Long polls parked in front workers.",
            multiprocess_mode="livesum", **kw)
        self.shard_restarts = Counter(
            "queen_shard_restarts", "Shard processes restarted by the supervisor.", **kw)
        self.admission_bytes = Gauge(
            "queen_admission_bytes", "Write request bytes admitted and in flight.",
            multiprocess_mode="livesum", **kw)
        self.admission_rejected = Counter(
            "queen_admission_rejected", "Write requests refused at admission, by code "
            "(overloaded, storage_full).", ["code"], **kw)
        self._zero_labels()
        # push_bundle's samples, resolved at its first call in this process
        self._push_pid = -1
        self._push_fixed: tuple[Any, ...] = ()
        self._push_buckets: list[Any] = []

    def _zero_labels(self) -> None:
        """Create every known child at zero (``FUSION_ERROR_REASONS``): a multiprocess child
        is written to this process's file when it is made, so it is scraped from now on."""
        for counter, values in (
                (self.fusion_errors, FUSION_ERROR_REASONS),
                (self.dedup_read_backs, ("ok", "failed")),
                (self.ack_registry, ("hit", "miss")),
                (self.messages_pushed, _PUSH_STATUSES),
                (self.admission_rejected, _ADMISSION_CODES),
                (self.pg_cancels, ("sent", "failed")),
                (self.maintenance_mode, ("push", "pop")),
                (self.pg_pool_connections, ("in_use", "idle"))):
            for value in values:
                counter.labels(value)
        # NOTE(queen): routes are counted when answered, so the very first scrape of an idle
        # broker would miss the request families it itself is about to add
        self.http_requests.labels(_SCRAPE_ROUTE, "200")
        self.http_latency.labels(_SCRAPE_ROUTE)

    def push_bundle(self, segments: int, frames: int, probed: int = 0) -> None:
        """A committed push bundle of ``segments`` segments storing ``frames`` frames, of which
        ``probed`` segments read stored hashes in SQL: its commit, segment, frame and probe
        counters and its frames histogram, in one call.

        PERF(metrics): the samples written straight into this process's file
        (``_FileSample``): through their values' ``inc`` each took a lock, a pid check and
        two Python calls, 36.7k instructions a bundle on a shard (bench/shardpath.py)."""
        if self._push_pid != _pid:
            self._push_samples()
        histogram = self.fusion_items_per_batch
        bucket = self._push_buckets[bisect_left(histogram._upper_bounds, frames)]
        commits, fused, fired, total, probes = self._push_fixed
        commits.add(1)
        fused.add(segments)
        fired.add(frames)
        total.add(frames)
        bucket.add(1)
        if probed:
            probes.add(probed)

    def _push_samples(self) -> None:
        """``push_bundle``'s samples, (re)resolved in this process (after a fork, the values
        move to the child's file at their first use; ``get`` is one)."""
        histogram = self.fusion_items_per_batch
        values = (self.fusion_commits._value, self.fusion_segments._value,
                  self.batch_items_fired._value, histogram._sum, self.dedup_sql_probes._value)
        for value in values:
            value.get()
        self._push_fixed = tuple(map(_sample, values))
        self._push_buckets = [_sample(b) for b in histogram._buckets]
        self._push_pid = _pid

    def db_event(self, event: str) -> None:
        """A database event (queen_mp/db/errors.py ``on_event``): counted at the turn's end."""
        if event == "statement_timeout":
            self.tally.inc(self.pg_statement_timeouts)
        elif event == "quarantine":
            self.tally.inc(self.pg_quarantines)
        elif event in ("cancel_sent", "cancel_failed"):
            self.tally.inc(self.pg_cancels, (event.removeprefix("cancel_"),))


#: one per-queue series: (gauge, queue label, group label or None, value)
QueueRow = tuple[str, str, str | None, float]


def write_queue_snapshot(directory: str, rows: Iterable[QueueRow], at: float) -> None:
    """Replace the per-queue gauges' snapshot (atomically: a scrape reads the old or the new)."""
    path = os.path.join(directory, QUEUE_SNAPSHOT)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"at": at, "rows": [list(r) for r in rows]}, f, separators=(",", ":"))
    os.replace(tmp, path)


class QueueGaugeCollector:
    """The per-queue gauges from the snapshot shard 0 wrote. Before the first snapshot (and for
    a family without rows) each family still shows its ``OTHER_QUEUES_LABEL`` series at zero,
    so nothing that queries it is blank; ``queen_queue_gauges_timestamp_seconds`` says when the
    snapshot was taken (0: not yet)."""

    def __init__(self, directory: str) -> None:
        self.path = os.path.join(directory, QUEUE_SNAPSHOT)

    def _read(self) -> tuple[float, list[Any]]:
        try:
            with open(self.path, encoding="utf-8") as f:
                doc = json.load(f)
            return float(doc["at"]), list(doc["rows"])
        except FileNotFoundError:
            return 0.0, []
        except (OSError, ValueError, KeyError, TypeError):
            return 0.0, []  # a torn or foreign file: the zeros until the next snapshot

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        at, rows = self._read()
        families = {name: GaugeMetricFamily(name, text, labels=list(labels))
                    for name, (text, labels) in QUEUE_GAUGES.items()}
        seen: dict[str, set[tuple[str, ...]]] = {name: set() for name in QUEUE_GAUGES}
        for row in rows:
            try:
                name, queue, group, value = row
                family = families[name]
            except (KeyError, ValueError, TypeError):
                continue
            labels = (str(queue),) if group is None else (str(queue), str(group))
            if len(labels) != len(QUEUE_GAUGES[name][1]) or labels in seen[name]:
                continue
            seen[name].add(labels)
            family.add_metric(list(labels), float(value))
        for name, family in families.items():
            other = (OTHER_QUEUES_LABEL,) * len(QUEUE_GAUGES[name][1])
            if other not in seen[name]:
                family.add_metric(list(other), 0.0)
            yield family
        stamp = GaugeMetricFamily(
            "queen_queue_gauges_timestamp_seconds",
            "When shard 0 last computed the per-queue gauges (Unix time; 0 = not yet).")
        stamp.add_metric([], at)
        yield stamp


def render_latest(multiproc_dir: str | None = None) -> bytes:
    """Collect every process's samples and the per-queue gauges: the body of
    ``/metrics/prometheus``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    directory = multiproc_dir or os.environ["PROMETHEUS_MULTIPROC_DIR"]
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)
    registry.register(QueueGaugeCollector(directory))
    return generate_latest(registry)


def mark_process_dead(pid: int) -> None:
    """Drop a dead child's live gauges (called by whoever reaps it)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)
