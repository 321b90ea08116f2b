-- 014_lease_table.sql: a lease's cursors are found through a table of leases, not an index on
-- log_consumers.lease_id (issue 26).
--
-- Tables: queen.log_leases (new): one row per leasing pop, its lease id, tenant, group and
--   claimed partitions; written by the pop, read by lease renewal and requiredLeases, deleted
--   by housekeeping once no cursor holds the lease live (functions/pop.sql, retention.sql).
-- Indexes: queen.log_consumers_lease_id_idx dropped.
--
-- Why: a claim writes lease_id, and an indexed column written makes the cursor update a
-- non-HOT one: every index of log_consumers gets a new entry at each claim, and the ack that
-- releases the lease cannot be HOT either. Without the index a claim's update is HOT
-- (bench/popsql.py under callgrind, PostgreSQL 15); the lease row costs one insert a pop.
-- The leases cursors hold at the upgrade are listed here: live ones stay renewable, expired ones
-- are reclaimed as before.

CREATE TABLE queen.log_leases (
    lease_id       uuid PRIMARY KEY,
    tenant         uuid NOT NULL,            -- the popping tenant (its queues' tenant)
    consumer_group text COLLATE "C" NOT NULL,
    partition_ids  int8[] NOT NULL           -- the claimed partitions
);

INSERT INTO queen.log_leases (lease_id, tenant, consumer_group, partition_ids)
SELECT c.lease_id, q.tenant, c.consumer_group, array_agg(c.partition_id ORDER BY c.partition_id)
FROM queen.log_consumers c
JOIN queen.log_partitions lp ON lp.id = c.partition_id
JOIN queen.queues q ON q.id = lp.queue_id
WHERE c.lease_id IS NOT NULL
GROUP BY c.lease_id, q.tenant, c.consumer_group
ON CONFLICT (lease_id) DO NOTHING;

DROP INDEX queen.log_consumers_lease_id_idx;
