"""Shared-memory IPC between front workers and shards: SPSC rings, doorbells, worker slots."""

from queen_mp.ipc.doorbell import AsyncDoorbellWaiter, Doorbell
from queen_mp.ipc.ring import PendingWrite, Ring, RingCorrupt, RingFull
from queen_mp.ipc.slots import NoFreeSlot, SlotTable

__all__ = [
    "AsyncDoorbellWaiter",
    "Doorbell",
    "NoFreeSlot",
    "PendingWrite",
    "Ring",
    "RingCorrupt",
    "RingFull",
    "SlotTable",
]
