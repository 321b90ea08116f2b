-- 009_ephemeral_rows.sql: ephemeral queues without a hot queue row (issue 27 item 4).
--
-- Tables: queen.eph_counts (new, UNLOGGED), queen.eph_seq (new UNLOGGED sequence);
--   queen.eph_queues loses its counters (next_seq, depth, bytes, drops_*);
--   queen.eph_partitions gets a number (id), and queen.eph_messages one key on (that
--   number, seq) instead of two wide ones;
--   queen.eph_leases is replaced: one row per delivery instead of one per message.
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
-- Messages are found by (partition number, seq) everywhere, so one index serves every path;
-- a pop writes one lease row per partition it took from and its ack deletes it, so per
-- message a push writes one index entry, and a pop and its ack none.

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

-- A partition's number: its messages' key is (pid, seq), two int8, where 008's key and index
-- were (tenant, queue, seq) and (tenant, queue, partition, seq). On a busy machine an unlogged
-- table took 1.7x as long to insert 200,000 rows, and 2x to delete them in batches of 100,
-- under the wide key.
ALTER TABLE queen.eph_partitions ADD COLUMN id int8;
UPDATE queen.eph_partitions SET id = nextval('queen.eph_seq');
ALTER TABLE queen.eph_partitions ALTER COLUMN id SET NOT NULL;
ALTER TABLE queen.eph_messages ADD COLUMN pid int8;
UPDATE queen.eph_messages m SET pid = p.id
  FROM queen.eph_partitions p
 WHERE p.tenant = m.tenant AND p.queue = m.queue AND p.partition = m.partition;
ALTER TABLE queen.eph_messages ALTER COLUMN pid SET NOT NULL;
ALTER TABLE queen.eph_messages DROP CONSTRAINT eph_messages_pkey;
DROP INDEX queen.eph_messages_partition_idx;
ALTER TABLE queen.eph_messages ADD PRIMARY KEY (pid, seq);

-- One lease row per delivery (the messages of one partition that one pop gave one group),
-- not per message. A lease of 008 becomes a delivery of its one message under a new dlv: the
-- ids handed out before this migration no longer match, so those messages are redelivered
-- when their lease expires (never lost).
ALTER TABLE queen.eph_leases RENAME TO eph_leases_008;
ALTER INDEX queen.eph_leases_due_idx RENAME TO eph_leases_008_due_idx;
CREATE UNLOGGED TABLE queen.eph_leases (
    tenant      uuid        NOT NULL,
    queue       text        NOT NULL,
    grp         text        NOT NULL,
    dlv         int8        NOT NULL,  -- a value of queen.eph_seq; its messages' ids end with it
    partition   text        NOT NULL,
    seqs        int8[]      NOT NULL,  -- its messages not yet acknowledged, ascending
    atts        int4[]      NOT NULL,  -- how many times each was delivered
    lease_until timestamptz NOT NULL,  -- then redelivered ('-infinity': claimable now)
    PRIMARY KEY (tenant, queue, grp, dlv)
);
CREATE INDEX eph_leases_due_idx ON queen.eph_leases (tenant, queue, grp, lease_until);
INSERT INTO queen.eph_leases (tenant, queue, grp, dlv, partition, seqs, atts, lease_until)
SELECT l.tenant, l.queue, l.grp, nextval('queen.eph_seq'), l.partition, ARRAY[l.seq],
       ARRAY[l.attempts], l.lease_until
  FROM queen.eph_leases_008 l;
DROP TABLE queen.eph_leases_008;
