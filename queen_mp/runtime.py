"""What the supervisor decided at boot that its children must share.

Unlike ``Config`` (user settings), these are facts of one running instance: the names of the
shared-memory objects, the number of worker slots, the boot time. The supervisor exports them as
``QMP_*`` variables; children rebuild the same ``Runtime`` from their environment.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Runtime"]


@dataclass(frozen=True)
class Runtime:
    """Shared-memory naming and sizes of one broker instance."""

    prefix: str
    slots: int
    shards: int
    ring_bytes: int
    started_at: float
    metrics_dir: str

    @classmethod
    def new(cls, slots: int, shards: int, ring_bytes: int, metrics_dir: str) -> Runtime:
        # NOTE(queen): POSIX shm names are short on some systems; pid + clock keeps them unique
        # across instances on one host and across restarts of one instance.
        prefix = f"/qmp{os.getpid():x}{int(time.time()) & 0xFFFFFF:x}"
        return cls(prefix, slots, shards, ring_bytes, time.time(), metrics_dir)

    def to_env(self) -> dict[str, str]:
        return {"QMP_SHM_PREFIX": self.prefix, "QMP_SLOTS": str(self.slots),
                "QMP_SHARDS": str(self.shards), "QMP_RING_BYTES": str(self.ring_bytes),
                "QMP_STARTED_AT": repr(self.started_at),
                "PROMETHEUS_MULTIPROC_DIR": self.metrics_dir}

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Runtime:
        env = os.environ if env is None else env
        return cls(env["QMP_SHM_PREFIX"], int(env["QMP_SLOTS"]), int(env["QMP_SHARDS"]),
                   int(env["QMP_RING_BYTES"]), float(env["QMP_STARTED_AT"]),
                   env["PROMETHEUS_MULTIPROC_DIR"])

    # --- names of the shared objects
    def request_ring(self, slot: int, shard: int) -> str:
        return f"{self.prefix}-q{slot}-{shard}"

    def reply_ring(self, slot: int, shard: int) -> str:
        return f"{self.prefix}-r{slot}-{shard}"

    def shard_doorbell(self, shard: int) -> str:
        return f"{self.prefix}-bs{shard}"

    def slot_doorbell(self, slot: int) -> str:
        return f"{self.prefix}-bw{slot}"

    @property
    def slot_table(self) -> str:
        return f"{self.prefix}-slots"

    @property
    def heartbeat(self) -> str:
        return f"{self.prefix}-hb"

    @property
    def wake_board(self) -> str:
        return f"{self.prefix}-wake"

    @property
    def flags_board(self) -> str:
        return f"{self.prefix}-flags"
