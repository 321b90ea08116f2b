-- 006_streams.sql: the Streams SDK's durable state (docs/api.md "Streams"; client-contract.md
-- 1.11): registered queries, their operator state per source partition, and the ledger that
-- makes a retried cycle answer instead of applying twice.
--
-- Tables created (schema queen):
--   stream_queries  one row per (tenant, name): the query's id, source and sink queue names and
--                   the config hash of its operator chain (the guard against a redeployed chain
--                   reading state an older chain wrote)
--   stream_state    one row per (query, source partition, key): an operator's JSON state
--   stream_cycles   one row per committed cycle that acked its source under a lease, keyed by
--                   (query, partition, lease, acked message): a repeat of that cycle (the client retries after
--                   503 outcome_unknown or a lost answer) finds it and changes nothing
--
-- Functions: functions/streams.sql (stream_register_v1, stream_state_get_v1, stream_cycle_v1).
--
-- Lock order: DDL only. At runtime stream_cycle_v1 serialises the cycles of one (query,
--   partition) with a transaction advisory lock taken before any row lock, then follows the
--   global order through the procedures it calls (see functions/streams.sql); stream_state and
--   stream_cycles rows are written last.
--
-- No foreign key to log_partitions: an FK check takes FOR KEY SHARE on the partition row, after
--   the consumer row lock of the cycle's ack, which would break the global lock order (design.md
--   invariant 4). A partition id that no longer exists only leaves unread rows behind.
--
-- SQLSTATEs raised: the usual constraint ones (23505, 23514, 23502, 23503).

CREATE TABLE queen.stream_queries (
    id           uuid        PRIMARY KEY,
    tenant       uuid        NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    name         text COLLATE "C" NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 255),
    source_queue text COLLATE "C" NOT NULL CHECK (octet_length(source_queue) BETWEEN 1 AND 255),
    sink_queue   text COLLATE "C" CHECK (octet_length(sink_queue) BETWEEN 1 AND 255),
    config_hash  text        NOT NULL CHECK (octet_length(config_hash) BETWEEN 1 AND 255),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT stream_queries_tenant_name_key UNIQUE (tenant, name)
);

-- key: an operator's state key (window keys join tag, window and user key with U+001F)
CREATE TABLE queen.stream_state (
    query_id     uuid        NOT NULL REFERENCES queen.stream_queries (id) ON DELETE CASCADE,
    partition_id int8        NOT NULL,
    key          text COLLATE "C" NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 1024),
    value        jsonb       NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query_id, partition_id, key)
);

-- ack_hash: xxh3_128 of the acked message's transactionId (two cycles under one lease, a
--   partial ack then the rest, ack different messages); result: the answer the cycle gave
--   (without the repeat flag), given again to a repeat
CREATE TABLE queen.stream_cycles (
    query_id     uuid        NOT NULL REFERENCES queen.stream_queries (id) ON DELETE CASCADE,
    partition_id int8        NOT NULL,
    lease_id     uuid        NOT NULL,
    ack_hash     bytea       NOT NULL CHECK (octet_length(ack_hash) = 16),
    committed_at timestamptz NOT NULL DEFAULT now(),
    result       jsonb       NOT NULL,
    PRIMARY KEY (query_id, partition_id, lease_id, ack_hash)
);
-- the ledger's own purge (stream_cycle_v1 deletes a shard's rows past their retention)
CREATE INDEX stream_cycles_age_idx ON queen.stream_cycles (query_id, partition_id, committed_at);
