-- 003_traces.sql: message traces (POST /api/v1/traces and its reads) and the fencing-token
-- sequence of locks (POST /api/v1/locks).
--
-- Tables created (schema queen):
--   message_traces       one row per recorded trace event, keyed by seq (insertion order =
--                        the time order the reads answer in)
--   message_trace_names  the names of each trace (traceNames), one row per (trace, name), for
--                        the by-name and names reads of one tenant
-- Sequence created:
--   lock_token_seq       the token of every lock permit written (functions/locks.sql): a
--                        permit row's KV version IS its token, and taking each one from this
--                        sequence makes a later holder's token always higher than an earlier
--                        one's, across releases, expiries and purges (plain KV versions restart
--                        at 1 after a delete or an expiry, which would let a replaced holder's
--                        guard pass).
--
-- Who deletes traces (functions/traces.sql header):
--   * the queue's deletion: message_traces.queue_id cascades (FK), and the names cascade from
--     their trace (FK);
--   * retention: retention_partition_v1 (functions/retention.sql) deletes the traces of the
--     offsets below the partition's new log start when it deletes segments.
--   partition_id deliberately has no foreign key (a trace insert would otherwise share-lock the
--   partition allocator row that every push updates, as the baseline explains for segments).
--
-- Lock order: DDL only. At runtime a trace is inserted under a key-share lock of its queue row
--   (trace_record_v1, functions/traces.sql) and deleted by retention after its partition row
--   (one partition row, then that partition's traces), outside the consumer and kv lock spaces.
--
-- SQLSTATEs raised: the usual constraint ones (23503, 23505, 23514).

CREATE SEQUENCE queen.lock_token_seq AS int8 START WITH 1;

CREATE TABLE queen.message_traces (
    seq            bigserial   PRIMARY KEY,
    id             uuid        NOT NULL,
    tenant         uuid        NOT NULL,
    queue_id       int8        NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    partition_id   int8        NOT NULL,
    "offset"       int8        NOT NULL,   -- the message's offset (or an upper bound, see traces.sql)
    transaction_id text        NOT NULL,
    consumer_group text COLLATE "C" NOT NULL,
    event_type     text        NOT NULL,
    data           jsonb       NOT NULL,
    names          text[] COLLATE "C" NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp()
);
-- the traces of one message, in order
CREATE INDEX message_traces_message_idx
    ON queen.message_traces (partition_id, transaction_id, seq);
-- retention: the traces below a partition's log start
CREATE INDEX message_traces_offset_idx ON queen.message_traces (partition_id, "offset");
-- the queue delete's cascade
CREATE INDEX message_traces_queue_idx ON queen.message_traces (queue_id);

CREATE TABLE queen.message_trace_names (
    trace_seq  int8        NOT NULL REFERENCES queen.message_traces (seq) ON DELETE CASCADE,
    name       text COLLATE "C" NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 255),
    tenant     uuid        NOT NULL,
    PRIMARY KEY (trace_seq, name)
);
-- by-name pages of one tenant, in trace order
CREATE INDEX message_trace_names_name_idx
    ON queen.message_trace_names (tenant, name, trace_seq);
