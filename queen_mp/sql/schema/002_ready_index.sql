-- 002_ready_index.sql: an index of the cursors that have something to deliver, so that a pop
-- finds its next partition in one index probe whatever the number of partitions of its queue.
--
-- Tables: queen.log_consumers gains queue_id (its partition's queue, never changes) and
--   ready_at (created_at of the oldest message the cursor has not consumed; NULL = caught up),
--   and the partial index log_consumers_ready_idx (queue_id, consumer_group, ready_at,
--   partition_id) WHERE ready_at IS NOT NULL. queen.consumer_groups_meta gains started: the
--   group's cursor rows on the queue were created from its recorded start (false: a record
--   made by a subscription call, or kept by a delete, whose start the next pop makes).
--
-- Why: every pop read every partition of its queue and that partition's cursor to find the
-- partitions with pending data (about 3.6 us a partition: 18 ms a pop at 5,000 partitions,
-- 275 ms at 50,000; issue 26). A pop now walks the index in api.md 2.2's order (oldest
-- pending data first) and stops at its first claim.
--
-- Who keeps the two columns true (functions/triggers.sql, functions/groups.sql):
--   * a BEFORE trigger on log_consumers fills queue_id on insert and recomputes ready_at
--     whenever committed_offset moves (every ack, autoAck pop, seek, subscription, DLQ
--     hand-off), so no writer of the cursor has to know about it;
--   * an AFTER UPDATE statement trigger on log_partitions sets ready_at on the caught-up
--     cursors of every partition whose last_offset grew (every allocator: push bundles, the
--     transaction wire, timers, DLQ retry);
--   * every (partition, group) pair of a started group (consumer_groups_meta.started) has its
--     cursor row: the start creates them for the queue's partitions (group_start_v1, at the
--     group's first pop), a partition's creation creates them for the queue's started groups;
--   * queen.log_ready_repair_v1 (run when the function families are applied, and by
--     housekeeping) creates what a broker of an older build left missing.
-- ready_at may be set while nothing is pending (a pop that finds so clears it); it is never
-- NULL while something is: NULL is only written under a FOR SHARE lock of the partition row,
-- which no allocator can hold at the same time (functions/triggers.sql says why that is
-- enough).
--
-- The families' repair fills queue_id and ready_at in the transaction that installs the
-- triggers. Here a record counts as started when the group has a cursor on the queue: an older
-- build created them one by one as its pops found data, and the repair creates the rest.

ALTER TABLE queen.log_consumers
    ADD COLUMN queue_id int8,
    ADD COLUMN ready_at timestamptz;

COMMENT ON COLUMN queen.log_consumers.queue_id IS
    'The queue of partition_id (set on insert by trigger; NULL only on rows an older build '
    'inserted, until queen.log_ready_repair_v1 runs).';
COMMENT ON COLUMN queen.log_consumers.ready_at IS
    'created_at of the oldest message not consumed yet; NULL = caught up (only written under '
    'a FOR SHARE lock of the partition row). May be set while caught up: a pop clears it.';

CREATE INDEX log_consumers_ready_idx
    ON queen.log_consumers (queue_id, consumer_group, ready_at, partition_id)
    WHERE ready_at IS NOT NULL;

ALTER TABLE queen.consumer_groups_meta
    ADD COLUMN started boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN queen.consumer_groups_meta.started IS
    'The group has a cursor row on every partition of the queue, created at its recorded start '
    '(queen.group_start_v1); false until its next pop when a subscription call made the record '
    'or a delete kept it.';

UPDATE queen.consumer_groups_meta m
SET started = true
WHERE EXISTS (SELECT 1
              FROM queen.log_partitions lp
              JOIN queen.log_consumers c ON c.partition_id = lp.id
              WHERE lp.queue_id = m.queue_id AND c.consumer_group = m.consumer_group);
