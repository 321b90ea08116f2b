-- 009_ephemeral_rows.sql: ephemeral queues without a hot queue row (issue 27 item 4).
--
-- Tables: queen.eph_counts (new, UNLOGGED), queen.eph_seq (new UNLOGGED sequence);
--   queen.eph_queues loses its counters (next_seq, depth, bytes, drops_*);
--   queen.eph_messages and queen.eph_leases get one key each instead of a key and an index.
--
-- Why: every call of 008's functions locked its queue's eph_queues row and updated it, so the
-- calls of one queue ran one at a time in PostgreSQL (with 4 consumers of one queue, waits on
-- that row were 70% of the sampled backend time, and PostgreSQL spent 131 us of CPU per
-- message popped and acked against 52 us with one consumer). Now:
--   * seqs come from queen.eph_seq; a push holds its partition's row while it takes one
--     value and commits, so seqs grow in commit order within a partition (what a cursor needs);
--   * depth, bytes and drop counts are summed over up to 16 rows per queue (eph_counts), each
--     call adding its change to the row of its backend (pg_backend_pid() % 16);
--   * reset and delete exclude the other calls of their queue with a transaction advisory lock
--     (exclusive for them, shared for the others), not a row lock.
-- Messages are found by (partition, seq) everywhere, and leases by seq (and group), so one
-- index each serves every path: per message, a push writes one index entry and a pop two.

CREATE UNLOGGED SEQUENCE queen.eph_seq;  -- NO CACHE: values are handed out in call order

SELECT setval('queen.eph_seq', coalesce((SELECT max(q.next_seq) FROM queen.eph_queues q), 0) + 1);

CREATE UNLOGGED TABLE queen.eph_counts (
    tenant       uuid NOT NULL,
    queue        text NOT NULL,
    slot         int2 NOT NULL,             -- pg_backend_pid() % 16 of the writers
    depth        int8 NOT NULL DEFAULT 0,   -- these rows' sums: messages stored,
    bytes        int8 NOT NULL DEFAULT 0,   -- their payload bytes,
    drops_bounds int8 NOT NULL DEFAULT 0,   -- dropped by maxLength/maxBytes (dropOldest),
    drops_ttl    int8 NOT NULL DEFAULT 0,   -- by ttlSeconds,
    drops_retry  int8 NOT NULL DEFAULT 0,   -- after retryLimit redeliveries
    PRIMARY KEY (tenant, queue, slot)
);

INSERT INTO queen.eph_counts (tenant, queue, slot, depth, bytes, drops_bounds, drops_ttl,
                              drops_retry)
SELECT q.tenant, q.queue, 0, q.depth, q.bytes, q.drops_bounds, q.drops_ttl, q.drops_retry
  FROM queen.eph_queues q;

ALTER TABLE queen.eph_queues
    DROP COLUMN next_seq, DROP COLUMN depth, DROP COLUMN bytes, DROP COLUMN drops_bounds,
    DROP COLUMN drops_ttl, DROP COLUMN drops_retry;

ALTER TABLE queen.eph_messages DROP CONSTRAINT eph_messages_pkey;
DROP INDEX queen.eph_messages_partition_idx;
ALTER TABLE queen.eph_messages ADD PRIMARY KEY (tenant, queue, partition, seq);

ALTER TABLE queen.eph_leases DROP CONSTRAINT eph_leases_pkey;
DROP INDEX queen.eph_leases_seq_idx;
ALTER TABLE queen.eph_leases ADD PRIMARY KEY (tenant, queue, seq, grp);
