"""Every shared-memory object of one broker instance, created and removed in one place.

Per (worker slot, shard): a request ring (slot -> shard) and a reply ring (shard -> slot).
Per shard and per slot: a doorbell rung by producers. Plus the slot table, the shard
heartbeat board, the wake board of parked pops and the flags board (maintenance switches,
drain state). Only the supervisor creates and unlinks; children attach by name.
"""

from __future__ import annotations

from queen_mp.ipc.doorbell import Doorbell
from queen_mp.ipc.flags import FlagsBoard
from queen_mp.ipc.heartbeat import HeartbeatBoard
from queen_mp.ipc.ring import Ring
from queen_mp.ipc.slots import SlotTable
from queen_mp.ipc.wakeboard import WakeBoard
from queen_mp.runtime import Runtime

__all__ = ["create_all", "reply_ring_bytes", "unlink_all"]


def reply_ring_bytes(request_ring_bytes: int) -> int:
    """Verdicts are ~9 bytes a frame against ~250 for the frames themselves: a reply ring an
    eighth of its request ring still holds the verdicts of every request it can carry, and
    each of its pages counts twice in the resident memory (worker and shard map it)."""
    return max(64 * 1024, request_ring_bytes // 8)


def create_all(rt: Runtime) -> None:
    """Create every object (replacing leftovers of a crashed instance with the same names)."""
    try:
        for slot in range(rt.slots):
            for shard in range(rt.shards):
                Ring.create(rt.request_ring(slot, shard), rt.ring_bytes, replace=True).close()
                Ring.create(rt.reply_ring(slot, shard), reply_ring_bytes(rt.ring_bytes),
                            replace=True).close()
            Doorbell.create(rt.slot_doorbell(slot), replace=True).close()
        for shard in range(rt.shards):
            Doorbell.create(rt.shard_doorbell(shard), replace=True).close()
        SlotTable.create(rt.slot_table, rt.slots, replace=True).close()
        HeartbeatBoard.unlink(rt.heartbeat)
        HeartbeatBoard.create(rt.heartbeat, rt.shards).close()
        WakeBoard.unlink(rt.wake_board)
        WakeBoard.create(rt.wake_board).close()
        FlagsBoard.unlink(rt.flags_board)
        FlagsBoard.create(rt.flags_board).close()
    except BaseException:
        unlink_all(rt)
        raise


def unlink_all(rt: Runtime) -> None:
    """Remove every object; absent ones are ignored, so this is safe after a partial create."""
    for slot in range(rt.slots):
        for shard in range(rt.shards):
            Ring.unlink_name(rt.request_ring(slot, shard))
            Ring.unlink_name(rt.reply_ring(slot, shard))
        Doorbell.unlink_name(rt.slot_doorbell(slot))
    for shard in range(rt.shards):
        Doorbell.unlink_name(rt.shard_doorbell(shard))
    SlotTable.unlink_name(rt.slot_table)
    HeartbeatBoard.unlink(rt.heartbeat)
    WakeBoard.unlink(rt.wake_board)
    FlagsBoard.unlink(rt.flags_board)
