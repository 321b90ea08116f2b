"""Which shard owns what (design.md): a partition's pushes go to the shard of
hash(tenant, queue, partition), its acks and ack-registry entries to the shard of
hash(partition id). Every process computes the same answer, so there is no routing table."""

from __future__ import annotations

import xxhash

__all__ = ["ack_shard", "push_shard"]


def push_shard(tenant: bytes, queue: str, partition: str, shards: int) -> int:
    key = b"%b%b\x1f%b" % (tenant, queue.encode(), partition.encode())
    return xxhash.xxh3_64_intdigest(key) % shards


def ack_shard(partition_id: int, shards: int) -> int:
    return xxhash.xxh3_64_intdigest(partition_id.to_bytes(8, "little")) % shards
