"""Prometheus metrics in multiprocess mode.

Every front worker and every shard writes its samples into ``PROMETHEUS_MULTIPROC_DIR``, which
the supervisor sets before anything imports prometheus_client (the client picks its value mode
at import). Metric objects are therefore built after fork, by ``Metrics()``, never at import
time, and are not registered in the default registry: the scrape endpoint collects the files.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["Metrics", "mark_process_dead", "render_latest"]

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


class Metrics:
    """The broker's metric families; one instance per process."""

    def __init__(self, instance: str = "") -> None:
        _use_cached_pid()
        from prometheus_client import Counter, Gauge, Histogram

        self.instance = instance
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
        self.dedup_filter_entries = Gauge(
            "queen_dedup_filter_entries", "Transaction hashes the shards' dedup filters hold.",
            multiprocess_mode="livesum", **kw)
        self.messages_pushed = Counter(
            "queen_messages_pushed", "Push items by verdict.", ["status"], **kw)
        self.messages_popped = Counter(
            "queen_messages_popped", "Messages delivered by pops.", **kw)
        self.messages_acked = Counter(
            "queen_messages_acked", "Messages whose cursor advanced by an ack.", **kw)
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
        self.dlq_depth = Gauge(
            "queen_dlq_depth", "Dead-letter rows per queue.", ["queue"],
            multiprocess_mode="max", **kw)
        self.shard_restarts = Counter(
            "queen_shard_restarts", "Shard processes restarted by the supervisor.", **kw)
        self.admission_bytes = Gauge(
            "queen_admission_bytes", "Write request bytes admitted and in flight.",
            multiprocess_mode="livesum", **kw)
        self.admission_rejected = Counter(
            "queen_admission_rejected", "Write requests refused at admission, by code "
            "(overloaded, storage_full).", ["code"], **kw)


def render_latest(multiproc_dir: str | None = None) -> bytes:
    """Collect every process's samples: the body of ``/metrics/prometheus``."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=multiproc_dir or os.environ["PROMETHEUS_MULTIPROC_DIR"])
    return generate_latest(registry)


def mark_process_dead(pid: int) -> None:
    """Drop a dead child's live gauges (called by whoever reaps it)."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(pid)
