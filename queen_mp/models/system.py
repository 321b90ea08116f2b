"""What one front worker can see of its instance's processes, from shared memory only.

The slot table (queen_mp/ipc/slots.py) names each front worker's pid and how many processes
held its slot (the generation); the heartbeat board (queen_mp/ipc/heartbeat.py) names each
shard's pid, its last beat and how many times it booted. ``GET /api/v1/status/system`` answers
these, so the console's System page shows restarts without asking the supervisor.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ShardState", "WorkerState"]


@dataclass(frozen=True, slots=True)
class WorkerState:
    """One front worker slot: ``pid`` 0 when free; ``generation`` counts its claims."""

    slot: int
    pid: int
    generation: int

    @property
    def restarts(self) -> int:
        return max(0, self.generation - 1)


@dataclass(frozen=True, slots=True)
class ShardState:
    """One shard: ``beat_age_ms`` None when no process owns the entry."""

    index: int
    pid: int
    beat_age_ms: int | None
    boots: int

    @property
    def restarts(self) -> int:
        return max(0, self.boots - 1)
