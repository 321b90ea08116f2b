-- 008_ephemeral.sql: ephemeral queues (api.md "Ephemeral queues", /api/v1/ephemeral/*).
--
-- Tables: queen.eph_config (LOGGED), queen.eph_queues, queen.eph_partitions, queen.eph_groups,
-- queen.eph_cursors, queen.eph_leases, queen.eph_messages (all UNLOGGED).
--
-- Why UNLOGGED: an ephemeral queue trades durability for cost. Writes to an unlogged table
-- produce no WAL, so a push, pop or ack that only touches these tables commits without a WAL
-- flush (no fsync) and is not replicated. Every broker instance over the same database shares
-- them, so a message pushed through one instance is popped through another. PostgreSQL empties
-- unlogged tables after a crash (an immediate stop, a power loss) and a standby has none of
-- their rows: that is the documented meaning of "ephemeral" (docs/operations.md). A clean
-- restart of PostgreSQL keeps them.
--
-- The declared configuration (POST /api/v1/ephemeral/configure) is the one durable part: it
-- lives in the logged queen.eph_config, so a declared queue comes back configured and empty.
--
-- No foreign keys: the functions of sql/functions/ephemeral.sql keep the rows of one
-- (tenant, queue) together, always under the queue row's lock (eph_queues FOR UPDATE), and a
-- logged table may not reference an unlogged one anyway.

CREATE TABLE queen.eph_config (
    tenant     uuid        NOT NULL,
    queue      text        NOT NULL,
    options    jsonb       NOT NULL,   -- as validated by queen_mp/models/ephemeral.py
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, queue)
);

-- One row per live queue (declared or implicit): the ring's counters and its incarnation.
CREATE UNLOGGED TABLE queen.eph_queues (
    tenant       uuid        NOT NULL,
    queue        text        NOT NULL,
    epoch        text        NOT NULL,  -- 16 hex digits, new at creation and at reset: ids of
                                        -- an older incarnation ack as 'stale'
    next_seq     int8        NOT NULL DEFAULT 0,  -- last seq given to a message of this queue
    depth        int8        NOT NULL DEFAULT 0,  -- messages stored
    bytes        int8        NOT NULL DEFAULT 0,  -- their payload bytes
    drops_bounds int8        NOT NULL DEFAULT 0,  -- dropped by maxLength/maxBytes (dropOldest)
    drops_ttl    int8        NOT NULL DEFAULT 0,  -- dropped by ttlSeconds
    drops_retry  int8        NOT NULL DEFAULT 0,  -- dropped after retryLimit redeliveries
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, queue)
);

-- The partitions a queue has had messages in, with the last seq pushed to each.
CREATE UNLOGGED TABLE queen.eph_partitions (
    tenant    uuid NOT NULL,
    queue     text NOT NULL,
    partition text NOT NULL,
    last_seq  int8 NOT NULL,
    PRIMARY KEY (tenant, queue, partition)
);

-- The consumer groups that have popped a queue ('__QUEUE_MODE__' for group-less pops): a
-- message is deleted once every one of them is past it.
CREATE UNLOGGED TABLE queen.eph_groups (
    tenant uuid NOT NULL,
    queue  text NOT NULL,
    grp    text NOT NULL,
    PRIMARY KEY (tenant, queue, grp)
);

-- A group's position in one partition: every seq <= pos was handed out to it. No row = 0.
CREATE UNLOGGED TABLE queen.eph_cursors (
    tenant    uuid NOT NULL,
    queue     text NOT NULL,
    grp       text NOT NULL,
    partition text NOT NULL,
    pos       int8 NOT NULL,
    PRIMARY KEY (tenant, queue, grp, partition)
);

-- Delivered and not yet acknowledged, per group: redelivered once lease_until has passed.
CREATE UNLOGGED TABLE queen.eph_leases (
    tenant      uuid        NOT NULL,
    queue       text        NOT NULL,
    grp         text        NOT NULL,
    seq         int8        NOT NULL,
    partition   text        NOT NULL,
    attempts    int4        NOT NULL,
    lease_until timestamptz NOT NULL,
    PRIMARY KEY (tenant, queue, grp, seq)
);
CREATE INDEX eph_leases_due_idx ON queen.eph_leases (tenant, queue, grp, lease_until);
-- "does any group still hold a lease on this message" (a message is deleted once none does)
CREATE INDEX eph_leases_seq_idx ON queen.eph_leases (tenant, queue, seq);

CREATE UNLOGGED TABLE queen.eph_messages (
    tenant     uuid        NOT NULL,
    queue      text        NOT NULL,
    seq        int8        NOT NULL,   -- per queue, in push commit order
    partition  text        NOT NULL,
    payload    text        NOT NULL,   -- the JSON text, returned verbatim
    bytes      int4        NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, queue, seq)
);
CREATE INDEX eph_messages_partition_idx ON queen.eph_messages (tenant, queue, partition, seq);
