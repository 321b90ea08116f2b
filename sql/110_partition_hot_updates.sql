-- 110_partition_hot_updates.sql: every allocation update of log_partitions can be HOT.
--
-- Drops: queen.log_partitions_last_write_at_idx (001_schema.sql).
--
-- Why: 001 kept last_write_at indexed and had log_push_one_v1 change it at most once a second
-- per partition, so that allocations stay HOT updates. Under a steady load over many
-- partitions each partition is written about once a second or less often, so nearly every
-- allocation moved last_write_at: 269 of 3,732 updates were HOT in a 40 s run of 1,000-item
-- QPB1 pushes over 4,000 partitions, every other one added an entry to each of the table's
-- three indexes, and the partition lookup of a push bundle slowed from 0.7 to 4.7 ms per call
-- as the dead entries piled up. No statement filters or sorts on last_write_at (it is only
-- shown by the resources routes), and the index was never scanned (idx_scan 0). Without it no
-- column an allocation changes is indexed. The 1-second quantisation of last_write_at stays:
-- the resources routes show it, and it keeps the column's meaning.
--
-- Lock: DROP INDEX takes an ACCESS EXCLUSIVE lock on log_partitions for a moment; the
-- migration runner applies it before the broker serves.

DROP INDEX IF EXISTS queen.log_partitions_last_write_at_idx;
