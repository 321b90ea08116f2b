"""Disk spool: durable fallback for pushes PostgreSQL cannot take, and its reader (the drain
that replays it through the push path is the front worker's: queen_mp/front/spooldrain.py)."""

from queen_mp.spool.spool import (
    DEFAULT_MAX_FILE_BYTES,
    MAX_RECORD_BYTES,
    SpoolBusyError,
    SpoolDecodeError,
    SpoolError,
    SpoolItem,
    SpoolPosition,
    SpoolReader,
    SpoolStats,
    SpoolWriteError,
    SpoolWriter,
    spool_stats,
)

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "MAX_RECORD_BYTES",
    "SpoolBusyError",
    "SpoolDecodeError",
    "SpoolError",
    "SpoolItem",
    "SpoolPosition",
    "SpoolReader",
    "SpoolStats",
    "SpoolWriteError",
    "SpoolWriter",
    "spool_stats",
]
