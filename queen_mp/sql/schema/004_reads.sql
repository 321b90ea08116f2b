-- 004_reads.sql: what the offset reads, partition discovery and the maxWaitTimeSeconds
-- eviction need (api.md 2.15, 4).
--
-- Tables: queen.queue_evictions, one row per queue that has had messages evicted by its
--   maxWaitTimeSeconds (functions/retention.sql): how many, and when last. Written by
--   housekeeping only, read by the queue's stats (GET /api/v1/resources/queues/{queue}); a
--   table of its own, so the eviction never writes the queues row that pushes read.
-- Indexes: log_partitions_queue_id_idx (queue_id, id): a queue's partitions in creation
--   order, the order and the page cursor of POST /api/v1/partitions/changed
--   (functions/reads.sql). Neither column ever changes, so the allocator's update of the row
--   stays HOT.

CREATE TABLE queen.queue_evictions (
    queue_id        int8        PRIMARY KEY REFERENCES queen.queues (id) ON DELETE CASCADE,
    evicted         int8        NOT NULL DEFAULT 0 CHECK (evicted >= 0),
    last_evicted_at timestamptz NOT NULL DEFAULT now()
);

COMMENT ON TABLE queen.queue_evictions IS
    'Messages of the queue deleted unconsumed because they waited longer than its '
    'maxWaitTimeSeconds (housekeeping, functions/retention.sql).';

CREATE INDEX log_partitions_queue_id_idx ON queen.log_partitions (queue_id, id);
