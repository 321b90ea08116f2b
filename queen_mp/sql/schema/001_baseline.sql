-- schema/001_baseline.sql: the queen-mp data model (schema `queen`).
--
-- The end state of the versioned chain that preceded the function families (sql/001 ..
-- sql/135, see legacy_chain.sha256), functions aside: a database migrated by that chain is
-- adopted as having applied this file (queen_mp/db/migrations.py).
--
-- Tables created (all in schema queen):
--   queues, log_partitions, log_segments, log_txns, log_consumers, consumer_groups_meta,
--   log_dlq, kv, timers, system_settings
-- Triggers and their functions (derived queue names, the log_partitions cascade, the settings
--   NOTIFY) live in functions/triggers.sql and functions/system.sql.
-- Rows inserted: system_settings maintenance_mode = false, pop_maintenance_mode = false,
--   settings_version = 0.
-- queen.schema_migrations and queen.schema_functions belong to the migration runner and are
--   NOT created here.
--
-- Lock order: DDL only, runs inside the migration runner's per-file transaction; no row locks.
--   At runtime the cascade trigger deletes segments/txns rows of deleted partitions only; it
--   runs after the partition rows themselves are locked by the DELETE (so after any push
--   holding them has committed).
--   The one global runtime lock order that every later procedure must follow is
--   (1) provisioning inserts (queues ordered by (tenant, name), then log_partitions ordered by
--   (queue_id, name)), (2) log_partitions rows ascending by id, (3) log_consumers rows ascending
--   by (partition_id, consumer_group). See design.md invariant 4.
--
-- SQLSTATEs raised: constraints declared here raise the usual
--   23505 (unique), 23503 (foreign key), 23514 (check) and 23502 (not null).
--
-- Ownership of data: deleting a queen.queues row removes ALL of that queue's data by cascade:
--   log_partitions (FK) -> log_consumers (FK), log_segments and log_txns (statement-level
--   AFTER DELETE / AFTER TRUNCATE trigger on log_partitions, not an FK: see below);
--   consumer_groups_meta (FK); log_dlq (FK on queue_id; log_dlq.partition_id deliberately has
--   NO foreign key, so a DLQ row survives segment retention, but never its queue); timers (FK).
--
-- Collation: every identifier-like text column (queue, partition, group, KV ns/key, timer key)
--   is COLLATE "C": byte order, cheaper comparisons, and prefix scans (KV getPrefix) can walk the
--   primary key with key >= prefix AND key < next_prefix.

CREATE SCHEMA IF NOT EXISTS queen;

-- ---------------------------------------------------------------------------------------------
-- queues: one row per (tenant, queue). Every option of api.md section 4, typed, with defaults.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE queen.queues (
    id                          bigserial   PRIMARY KEY,
    tenant                      uuid        NOT NULL
                                    DEFAULT '00000000-0000-0000-0000-000000000000',
    name                        text COLLATE "C" NOT NULL
                                    CHECK (octet_length(name) BETWEEN 1 AND 255),
    namespace                   text COLLATE "C" NOT NULL, -- filled by trigger when NULL on insert
    task                        text COLLATE "C",   -- idem; NULL = the name has no task part
    -- options (api.md 4); seconds unless stated
    lease_time                  int4        NOT NULL DEFAULT 300  CHECK (lease_time >= 0),
    retry_limit                 int4        NOT NULL DEFAULT 3    CHECK (retry_limit >= 0),
    dead_letter_queue           boolean     NOT NULL DEFAULT true,
    dlq_after_max_retries       boolean     NOT NULL DEFAULT true,
    dedup_window                int4        NOT NULL DEFAULT 3600 CHECK (dedup_window >= 0),
    retention_seconds           int4        NOT NULL DEFAULT 0    CHECK (retention_seconds >= 0),
    completed_retention_seconds int4        NOT NULL DEFAULT 0
                                    CHECK (completed_retention_seconds >= 0),
    encryption_enabled          boolean     NOT NULL DEFAULT false,
    delayed_processing          int4        NOT NULL DEFAULT 0    CHECK (delayed_processing >= 0),
    window_buffer               int4        NOT NULL DEFAULT 0    CHECK (window_buffer >= 0),
    priority                    int4        NOT NULL DEFAULT 0,
    max_size                    int8        NOT NULL DEFAULT 0    CHECK (max_size >= 0),
    retry_delay                 int4        NOT NULL DEFAULT 1000,  -- milliseconds
    ttl                         int4        NOT NULL DEFAULT 3600,
    max_wait_time_seconds       int4        NOT NULL DEFAULT 0,
    retention_enabled           boolean     NOT NULL DEFAULT false,
    created_at                  timestamptz NOT NULL DEFAULT now(),
    updated_at                  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT queues_tenant_name_key UNIQUE (tenant, name)
);

-- namespace / task pops (api.md 2.2) and the resources listings
CREATE INDEX queues_tenant_namespace_task_idx ON queen.queues (tenant, namespace, task);
CREATE INDEX queues_tenant_task_idx ON queen.queues (tenant, task) WHERE task IS NOT NULL;

-- ---------------------------------------------------------------------------------------------
-- log_partitions: the allocator row. Updated on every push (last_offset), so:
--   * fillfactor 50 leaves room on the page for HOT updates;
--   * no column an allocation changes is indexed, so every allocation can be a HOT update
--     (last_write_at, which log_push_one_v1 moves at most once a second, had an index until
--     old migration 110 dropped it: never scanned, and it made allocations non-HOT);
--   * last_created_at (NOT indexed) carries the created_at of the newest segment, so the push
--     path can keep segment created_at monotone per partition even across a wall-clock step.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE queen.log_partitions (
    id               bigserial   PRIMARY KEY,
    queue_id         int8        NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    name             text COLLATE "C" NOT NULL CHECK (octet_length(name) BETWEEN 1 AND 255),
    last_offset      int8        NOT NULL DEFAULT 0 CHECK (last_offset >= 0),
    -- lowest offset still covered by log_txns (the transactionId sidecar)
    txns_start       int8        NOT NULL DEFAULT 1 CHECK (txns_start >= 1),
    -- lowest offset still covered by log_segments
    log_start_offset int8        NOT NULL DEFAULT 1 CHECK (log_start_offset >= 1),
    -- quantised to 1 s by the push path; NULL = never written
    last_write_at    timestamptz,
    -- created_at of the newest segment (exact, monotone); NULL = never written
    last_created_at  timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT log_partitions_queue_name_key UNIQUE (queue_id, name)
) WITH (fillfactor = 50);

-- ---------------------------------------------------------------------------------------------
-- log_segments: one row per pushed segment. payload = the chunks of api.md 3.2, stored exactly
-- as sent (already zstd-compressed): STORAGE EXTERNAL keeps large payloads out of line WITHOUT
-- a pglz attempt (pointless on compressed data, and it costs CPU on the hot path). Small
-- payloads still stay inline (EXTERNAL only changes what happens above the TOAST threshold).
-- created_at is monotone per partition in offset order, so time-based walks are forward walks
-- of the primary key: no created_at index.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE queen.log_segments (
    partition_id int8        NOT NULL,  -- -> log_partitions.id, cascade by trigger (functions/triggers.sql)
    base_offset  int8        NOT NULL CHECK (base_offset >= 1),
    msg_count    int4        NOT NULL CHECK (msg_count >= 1),
    created_at   timestamptz NOT NULL,
    payload      bytea       NOT NULL,
    PRIMARY KEY (partition_id, base_offset)
);
ALTER TABLE queen.log_segments ALTER COLUMN payload SET STORAGE EXTERNAL;

-- ---------------------------------------------------------------------------------------------
-- log_txns: the transactionId sidecar, one row per pushed segment (always written, dedup or
-- not). hashes = 16 x msg_count bytes of xxh3_128, frame order: the hash at byte 16*k belongs
-- to offset base_offset + k. Random bytes do not compress: STORAGE EXTERNAL as well.
-- Purged on its own clock (GREATEST(dedup window, completed retention, 900 s)), which then
-- advances log_partitions.txns_start.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE queen.log_txns (
    partition_id int8        NOT NULL,  -- -> log_partitions.id, cascade by trigger (functions/triggers.sql)
    base_offset  int8        NOT NULL CHECK (base_offset >= 1),
    msg_count    int4        NOT NULL CHECK (msg_count >= 1),
    created_at   timestamptz NOT NULL,
    hashes       bytea       NOT NULL CHECK (octet_length(hashes) = 16 * msg_count),
    PRIMARY KEY (partition_id, base_offset)
);
ALTER TABLE queen.log_txns ALTER COLUMN hashes SET STORAGE EXTERNAL;

-- ---------------------------------------------------------------------------------------------
-- log_consumers: cursor + lease per (partition, consumer group). Updated on every pop and ack;
-- fillfactor 50 for HOT. Only lease_id is indexed among the columns that change (and only while
-- a lease is live); the cursor advance itself stays HOT.
--   committed_offset   every offset <= it is consumed (0 = nothing committed)
--   lease_id           the live lease (shared by all partitions one pop claimed); NULL = none
--   worker_id          the lease holder (the ack/renew procedures match on it)
--   released_lease_id  the most recently released lease, kept for ack repeat safety (api 2.4)
--   batch_start/end    the leased batch, inclusive offsets
--   attempt_count      delivery attempts of the batch starting at batch_start (deliveryAttempt)
--   batch_retry_count  retry budget consumed by explicit `failed` acks of the current head
-- ---------------------------------------------------------------------------------------------
CREATE TABLE queen.log_consumers (
    partition_id      int8        NOT NULL REFERENCES queen.log_partitions (id) ON DELETE CASCADE,
    consumer_group    text COLLATE "C" NOT NULL,
    committed_offset  int8        NOT NULL DEFAULT 0 CHECK (committed_offset >= 0),
    lease_id          uuid,
    worker_id         text,
    lease_expires_at  timestamptz,
    leased_at         timestamptz,
    released_lease_id uuid,
    batch_start       int8,
    batch_end         int8,
    attempt_count     int4        NOT NULL DEFAULT 0,
    batch_retry_count int4        NOT NULL DEFAULT 0,
    total_consumed    int8        NOT NULL DEFAULT 0,
    last_consumed_at  timestamptz,
    last_popped_at    timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    next_offset       int8,
    next_created_at   timestamptz,
    PRIMARY KEY (partition_id, consumer_group)
) WITH (fillfactor = 50);

COMMENT ON COLUMN queen.log_consumers.next_offset IS
    'The offset after the last claim of this cursor (sql/130_pop_candidate_order.sql).';
COMMENT ON COLUMN queen.log_consumers.next_created_at IS
    'created_at of the segment holding next_offset; NULL when the claim reached the end.';

-- live leases by lease id (lease extend, requiredLeases, pop bookkeeping)
CREATE INDEX log_consumers_lease_id_idx ON queen.log_consumers (lease_id)
    WHERE lease_id IS NOT NULL;
-- a group's cursors everywhere (consumer-group routes); consumer_group never changes
CREATE INDEX log_consumers_group_idx ON queen.log_consumers (consumer_group, partition_id);

-- ---------------------------------------------------------------------------------------------
-- consumer_groups_meta: a group's start point, recorded once per (queue, group) at its first
-- pop and used for partitions created later too (api.md 2.2 "First start", 2.10).
--   subscription_mode  'all' | 'new' | 'new-only' | 'timestamp' (as recorded by the pop path)
--   subscription_from  the start time: first message created at or after it; NULL = log start
-- ---------------------------------------------------------------------------------------------
CREATE TABLE queen.consumer_groups_meta (
    queue_id          int8        NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    consumer_group    text COLLATE "C" NOT NULL,
    subscription_mode text        NOT NULL DEFAULT 'all',
    subscription_from timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    updated_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, consumer_group)
);
CREATE INDEX consumer_groups_meta_group_idx ON queen.consumer_groups_meta (consumer_group);

-- ---------------------------------------------------------------------------------------------
-- log_dlq: dead letters. A payload SNAPSHOT, no foreign key into segments or partitions
-- (partition_id is a plain int8), so a row outlives segment retention; queue_id cascades, so
-- deleting the queue deletes its dead letters (api.md 5).
--   created_at          when the row was filed (failedAt)
--   message_created_at  the original message's createdAt (its segment's created_at)
--   payload             the message payload bytes as stored in the frame (possibly encrypted:
--                       see `encrypted`); the frame fields are kept in their own columns
-- ---------------------------------------------------------------------------------------------
CREATE TABLE queen.log_dlq (
    id                 bigserial   PRIMARY KEY,
    tenant             uuid        NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    queue_id           int8        NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    partition_id       int8        NOT NULL,
    partition_name     text COLLATE "C" NOT NULL,
    consumer_group     text COLLATE "C" NOT NULL,
    "offset"           int8        NOT NULL,
    message_id         uuid        NOT NULL,
    transaction_id     text        NOT NULL,
    trace_id           uuid,
    producer_sub       text,
    encrypted          boolean     NOT NULL DEFAULT false,
    payload            bytea,
    error              text,
    retry_count        int4        NOT NULL DEFAULT 0,
    message_created_at timestamptz,
    created_at         timestamptz NOT NULL DEFAULT now()
);
-- GET /dlq order is (failedAt, partitionId, offset), optionally per queue
CREATE INDEX log_dlq_queue_created_idx
    ON queen.log_dlq (queue_id, created_at, partition_id, "offset");
CREATE INDEX log_dlq_created_idx ON queen.log_dlq (created_at, partition_id, "offset");
-- retry / delete by (partitionId, transactionId); per (partition, group, offset) lookups
CREATE INDEX log_dlq_partition_txn_idx ON queen.log_dlq (partition_id, transaction_id);
CREATE INDEX log_dlq_partition_group_offset_idx
    ON queen.log_dlq (partition_id, consumer_group, "offset");

-- ---------------------------------------------------------------------------------------------
-- kv: versioned key/value store (api.md 2.5 KV ops). version starts at 1, +1 per write.
-- expires_at NULL = forever. ns/key are COLLATE "C" so getPrefix is a primary key range walk.
-- ---------------------------------------------------------------------------------------------
CREATE TABLE queen.kv (
    tenant     uuid        NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    ns         text COLLATE "C" NOT NULL CHECK (octet_length(ns) BETWEEN 1 AND 255),
    key        text COLLATE "C" NOT NULL CHECK (octet_length(key) BETWEEN 1 AND 1024),
    value      jsonb       NOT NULL,
    version    int8        NOT NULL DEFAULT 1 CHECK (version >= 1),
    expires_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, ns, key)
);
CREATE INDEX kv_expires_at_idx ON queen.kv (expires_at) WHERE expires_at IS NOT NULL;

-- ---------------------------------------------------------------------------------------------
-- timers (api.md 2.5 Timer ops). At fire_at a pending timer pushes payload into
-- (queue, partition) with transaction_id and the message_id minted at scheduling.
--   payload       the decoded bytes of the op's base64 `payload`: compact JSON bytes, or their
--                 zstd frame when payload_zstd (bytea, not jsonb, so the bytes are kept exactly)
--   state         'pending' -> 'fired' | 'cancelled'; fired rows are kept
--                 QUEEN_TIMER_FIRED_RETENTION_S so late calls can answer too_late
-- ---------------------------------------------------------------------------------------------
CREATE TABLE queen.timers (
    tenant         uuid        NOT NULL DEFAULT '00000000-0000-0000-0000-000000000000',
    queue_id       int8        NOT NULL REFERENCES queen.queues (id) ON DELETE CASCADE,
    timer_key      text COLLATE "C" NOT NULL CHECK (octet_length(timer_key) BETWEEN 1 AND 1024),
    fire_at        timestamptz NOT NULL,
    payload        bytea,
    payload_zstd   boolean     NOT NULL DEFAULT false,
    partition      text COLLATE "C" NOT NULL DEFAULT 'Default',
    transaction_id text        NOT NULL,
    message_id     uuid        NOT NULL,
    producer_sub   text,
    state          text        NOT NULL DEFAULT 'pending'
                       CHECK (state IN ('pending', 'fired', 'cancelled')),
    attempts       int4        NOT NULL DEFAULT 0,
    fired_at       timestamptz,
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (queue_id, timer_key)
);
-- due timers
CREATE INDEX timers_due_idx ON queen.timers (fire_at) WHERE state = 'pending';
-- purge of fired / cancelled rows after their retention
CREATE INDEX timers_done_idx ON queen.timers (updated_at) WHERE state <> 'pending';

-- ---------------------------------------------------------------------------------------------
-- system_settings: cluster-wide flags, seen by every instance (api.md 5).
-- ---------------------------------------------------------------------------------------------
CREATE TABLE queen.system_settings (
    key        text        PRIMARY KEY,
    value      jsonb       NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO queen.system_settings (key, value) VALUES
    ('maintenance_mode', 'false'::jsonb),
    ('pop_maintenance_mode', 'false'::jsonb),
    ('settings_version', '0'::jsonb)
ON CONFLICT (key) DO NOTHING;
