-- admin.sql: queue configuration, queue deletion, and the read side of the admin/ops routes
-- (api.md 2.7, 4, 5: /configure, /resources/*, /status*, 1.9 for namespace/task).
--
-- Functions (each takes the caller's tenant first; another tenant's queues are absent):
--   queen.queue_options_v1(queen.queues) -> jsonb
--       every api.md 4 option of one queue row, camelCase keys, stored values.
--   queen.queue_configure_v1(uuid, text, text, text, jsonb) -> jsonb
--       create the queue if needed and update ONLY the options present (api.md 2.7).
--   queen.queue_delete_v1(uuid, text) -> boolean
--       delete a queue with everything under it; true = it existed.
--   queen.queue_purge_v1(uuid, text) -> jsonb | NULL
--       remove a queue's messages and keep the queue (options, partitions and their offsets,
--       consumer groups); NULL = no such queue.
--   queen.queue_lock_log_v1(int8) -> void
--       steps 2 and 3 of the delete's and the purge's lock order (below).
--   queen.admin_scope_v1(uuid, text, text, text) -> SETOF queen.queues
--       the tenant's queues, filtered by name / namespace / task (NULL = any).
--   queen.admin_partition_stats_v1(uuid, int8) -> table: per partition of one queue its
--       offsets and exact message counts (total, pending, processing). Shared by the listings.
--   queen.admin_group_pending_v1(uuid, int8, text) -> table: per partition of one queue the
--       exact pending count of ONE consumer group.
--   queen.admin_overview_v1(uuid) -> one row            GET /resources/overview
--   queen.admin_queues_v1(uuid, text, text, text, int4, int8) -> table
--       one page of queues with their counts            GET /resources/queues, /status
--   queen.admin_queue_v1(uuid, text) -> 0 or 1 row      the queue, its options, DLQ rows
--   queen.admin_queue_groups_v1(uuid, int8) -> table    per-group summary of one queue
--   queen.admin_queue_cursors_v1(uuid, int8) -> table   every cursor of one queue
--   queen.admin_depth_v1(uuid, text, text) -> table     GET /resources/queues/{q}/depth
--   queen.admin_namespaces_v1(uuid) -> table            GET /resources/namespaces
--   queen.admin_tasks_v1(uuid) -> table                 GET /resources/tasks
--   queen.admin_partitions_v1(uuid, text, int4, int8) -> table   GET /resources/partitions
--   queen.admin_segment_from_v1(int8, timestamptz) -> int8
--       base offset of the first segment created at or after a time (binary search).
--   queen.admin_throughput_v1(uuid, text, text, text, timestamptz, timestamptz, int4) -> table
--       messages ingested per time bucket               GET /status, /status/analytics
--   queen.admin_leases_v1(uuid, text, text, text) -> one row      live leases
--   queen.admin_dlq_summary_v1(uuid, text, text, text, timestamptz, timestamptz, int4) -> jsonb
--   Calls queen.log_cursor_before_v1 (pop.sql).
--
-- Tables touched:
--   queen.queues                INSERT ... ON CONFLICT DO NOTHING, UPDATE of option columns,
--                               namespace, task, updated_at (configure); DELETE (delete);
--                               read (everything else)
--   queen.log_partitions        read; SELECT ... FOR UPDATE and DELETE by cascade (delete)
--   queen.log_consumers         read; SELECT ... FOR UPDATE and DELETE by cascade (delete)
--   queen.log_segments, queen.log_txns   read (segments: throughput); DELETE by the
--                               log_partitions statement trigger (delete); log_segments
--                               DELETE below the cut (purge)
--   queen.log_partitions        also UPDATE log_start_offset (purge)
--   queen.message_traces        DELETE below the new log start (purge)
--   queen.log_consumers         also UPDATE of the cursors below the new log start (purge:
--                               cursor, lease, ready_at through pop.sql's log_ready_at_v1)
--   queen.consumer_groups_meta, queen.log_dlq, queen.timers   read; DELETE by cascade (delete)
--
-- Lock order (design.md invariant 4; schema/001_baseline.sql header):
--   queue_configure_v1 locks ONE queues row and nothing else: the provisioning INSERT (tier 1
--     of the global order), then an UPDATE of non-key columns, which takes FOR NO KEY UPDATE:
--     it does not conflict with the FOR KEY SHARE locks that foreign key checks of pushes,
--     pops, DLQ filings and timers take on the queue row, so configure never waits for them
--     nor they for it. Concurrent configures of one queue serialise on the row.
--   queue_delete_v1 takes, in this order:
--     1. the queues row, FOR UPDATE (tier 1: the provisioning level);
--     2. every log_partitions row of the queue, ascending by id, FOR UPDATE (tier 2). This
--        waits for every in-flight push (and DLQ replay) holding one of them: those commit
--        first, their segments are then deleted with the partition;
--     3. every log_consumers row of the queue, ascending by (partition_id, consumer_group),
--        FOR UPDATE (tier 3): waits for in-flight acks/pops holding a cursor;
--     4. DELETE of the queue row, whose cascades re-take the locks already held: log_partitions
--        (FK) -> log_consumers (FK), log_segments and log_txns (statement trigger);
--        consumer_groups_meta, log_dlq, timers (FK).
--     A transaction that takes a FOR KEY SHARE lock on the queue row (an FK check: inserting a
--     log_dlq, timers or consumer_groups_meta row, or a new partition) AFTER it already holds
--     one of this queue's partition or consumer rows inverts that order: today the ack path's
--     DLQ filing does (consumer row, then log_dlq insert). Racing a delete of the same queue,
--     PostgreSQL's deadlock detector aborts one of the two with 40P01 (nothing committed;
--     the broker retries a delete that lost, see queen_mp/http/dbcall.py).
--   queue_purge_v1 takes, in this order:
--     1. the queues row, FOR KEY SHARE (tier 1): a delete of the queue waits for the purge (or
--        the purge finds it gone); configure (FOR NO KEY UPDATE) and the FK checks of pushes
--        do not conflict with it;
--     2. every log_partitions row of the queue, ascending by id, FOR UPDATE (tier 2), as the
--        delete: in-flight pushes commit first and their messages are purged too;
--     3. every log_consumers row of the queue, ascending by (partition_id, consumer_group),
--        FOR UPDATE (tier 3), as the delete, before any row is changed. The races the delete
--        may lose with 40P01 (its note above) it may lose too, and is retried alike.
--   Every other function here is read-only and takes no row lock.
--
-- SQLSTATEs raised:
--   22023  invalid_parameter_value: NULL tenant or queue name (configure, delete); an unknown
--          option key, an option of the wrong JSON type or out of its api.md 4 range; an empty
--          namespace (configure); a limit below 1 or a negative offset (pages); a NULL time
--          or from >= to, a bucket below 1 s, or more than 100000 buckets (throughput, dlq
--          summary). Option errors carry the option key as the error's COLUMN field.
--   40001  serialization_failure: configure found its queue deleted three times in a row by
--          concurrent deletes (nothing committed; retryable).
--   40P01 / 55P03 are not raised here but may reach the caller through the row locks of
--          queue_delete_v1 and queue_purge_v1 (nothing committed; a retry is safe).
--
-- Isolation: READ COMMITTED; each function is one statement of the caller (autocommit), or a
-- part of a REPEATABLE READ read-only transaction when the broker wants several reads to share
-- one snapshot (queue detail).
--
-- Definitions (api.md 5):
--   retained    messages still in the log: last_offset - log_start_offset + 1
--   pending     without a group: per partition, last_offset minus the LOWEST cursor of the
--               partition's groups (every retained message when it has no cursor); a cursor
--               below the log start counts from the log start (where it resumes). With a group:
--               last_offset minus that group's cursor; a partition the group has no cursor on
--               yet counts from where its first pop would start: its subscription record's
--               start (log_cursor_before_v1), else the log start. Exact at the statement's
--               snapshot.
--   processing  messages inside live leases: per cursor with lease_id set and
--               lease_expires_at > now(), batch_end - committed_offset (the leased batch not
--               yet acked). Summed over groups: a message leased by two groups counts twice.
--   ingested    messages per bucket of segment created_at (their commit time). Only RETAINED
--               segments are counted: retention shrinks old buckets; duplicates (never stored)
--               are not counted; a DLQ replay counts as a new message.
--   processed   NOT computed here: the broker keeps no per-minute consumption record
--               (log_consumers holds one last_consumed_at and a running total per cursor, not
--               a history). The HTTP layer answers null for it.
--   Times of buckets are aligned on 2000-01-01T00:00:00Z (whole UTC minutes, hours, days).

-- ---------------------------------------------------------------------------------------------
-- queue_options_v1: the api.md 4 options of a queue row, as stored (leaseTime 0 stays 0 here;
-- the pop path reads it as 60).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.queue_options_v1(q queen.queues) RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT jsonb_build_object(
        'leaseTime', q.lease_time,
        'retryLimit', q.retry_limit,
        'deadLetterQueue', q.dead_letter_queue,
        'dlqAfterMaxRetries', q.dlq_after_max_retries,
        'dedupWindow', q.dedup_window,
        'retentionSeconds', q.retention_seconds,
        'completedRetentionSeconds', q.completed_retention_seconds,
        'encryptionEnabled', q.encryption_enabled,
        'delayedProcessing', q.delayed_processing,
        'windowBuffer', q.window_buffer,
        'priority', q.priority,
        'maxSize', q.max_size,
        'retryDelay', q.retry_delay,
        'ttl', q.ttl,
        'maxWaitTimeSeconds', q.max_wait_time_seconds,
        'retentionEnabled', q.retention_enabled)
$$;

-- ---------------------------------------------------------------------------------------------
-- queue_configure_v1: create-or-update.
--   p_namespace  NULL = keep (a new queue gets the derived value); else the new namespace
--   p_task       NULL = keep (a new queue gets the derived value); '' = no task; else the task
--   p_options    a JSON object of camelCase api.md 4 keys (the broker has already mapped
--                snake_case aliases and dropped unknown keys); a JSON null value = not given.
--                Types: int options take a JSON integer in range, bool options a JSON boolean.
-- Result:
--   {"created": bool, "queueId": int8, "queue": text, "namespace": text, "task": text|null,
--    "options": queue_options_v1(row)}
-- Sends NOTIFY queen_config_v1 '{"tenant": uuid, "queue": text, "queueId": int8}' at commit,
-- for instances that cache queue options (none LISTENs on it yet).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.queue_configure_v1(p_tenant uuid, p_queue text, p_namespace text,
                                         p_task text, p_options jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_options jsonb := COALESCE(p_options, '{}'::jsonb);
    v_key     text;
    v_val     jsonb;
    v_kind    text;
    v_num     numeric;
    v_min     numeric;
    v_max     numeric;
    v_id      int8;
    v_created boolean;
    v_row     queen.queues;
    v_tries   int4 := 0;
BEGIN
    IF p_tenant IS NULL OR p_queue IS NULL THEN
        RAISE EXCEPTION 'queue_configure_v1: tenant and queue name required'
            USING ERRCODE = '22023';
    END IF;
    IF p_namespace = '' THEN
        RAISE EXCEPTION 'queue_configure_v1: empty namespace' USING ERRCODE = '22023',
            COLUMN = 'namespace';
    END IF;
    IF jsonb_typeof(v_options) <> 'object' THEN
        RAISE EXCEPTION 'queue_configure_v1: options must be a JSON object'
            USING ERRCODE = '22023', COLUMN = 'options';
    END IF;

    -- 1. Validate every given option (api.md 4): u4 = int4 >= 0, i4 = any int4,
    --    u8 = int8 >= 0, bool = JSON boolean.
    FOR v_key, v_val IN SELECT e.key, e.value FROM jsonb_each(v_options) e LOOP
        CONTINUE WHEN jsonb_typeof(v_val) = 'null';
        v_kind := CASE v_key
            WHEN 'leaseTime' THEN 'u4'          WHEN 'retryLimit' THEN 'u4'
            WHEN 'dedupWindow' THEN 'u4'        WHEN 'retentionSeconds' THEN 'u4'
            WHEN 'completedRetentionSeconds' THEN 'u4'
            WHEN 'delayedProcessing' THEN 'u4'  WHEN 'windowBuffer' THEN 'u4'
            WHEN 'retryDelay' THEN 'u4'         WHEN 'ttl' THEN 'u4'
            WHEN 'maxWaitTimeSeconds' THEN 'u4'
            WHEN 'priority' THEN 'i4'
            WHEN 'maxSize' THEN 'u8'
            WHEN 'deadLetterQueue' THEN 'bool'  WHEN 'dlqAfterMaxRetries' THEN 'bool'
            WHEN 'encryptionEnabled' THEN 'bool' WHEN 'retentionEnabled' THEN 'bool'
        END;
        IF v_kind IS NULL THEN
            RAISE EXCEPTION 'queue_configure_v1: unknown option %', v_key
                USING ERRCODE = '22023', COLUMN = v_key;
        END IF;
        IF v_kind = 'bool' THEN
            IF jsonb_typeof(v_val) <> 'boolean' THEN
                RAISE EXCEPTION 'queue_configure_v1: option % must be a boolean', v_key
                    USING ERRCODE = '22023', COLUMN = v_key;
            END IF;
            CONTINUE;
        END IF;
        IF jsonb_typeof(v_val) <> 'number' THEN
            RAISE EXCEPTION 'queue_configure_v1: option % must be an integer', v_key
                USING ERRCODE = '22023', COLUMN = v_key;
        END IF;
        v_num := v_val::numeric;
        -- NOTE(admin): bounds computed apart: a CASE's THEN would end the IF condition
        v_min := CASE v_kind WHEN 'i4' THEN -2147483648 ELSE 0 END;
        v_max := CASE v_kind WHEN 'u8' THEN 9223372036854775807 ELSE 2147483647 END;
        IF v_num <> trunc(v_num) OR v_num < v_min OR v_num > v_max THEN
            RAISE EXCEPTION 'queue_configure_v1: option % = % is not an integer in range',
                v_key, v_num USING ERRCODE = '22023', COLUMN = v_key;
        END IF;
    END LOOP;

    -- 2. Provision (tier 1), then update only what was given. The INSERT does not lock an
    --    existing row; the UPDATE does (FOR NO KEY UPDATE). A delete committing between the
    --    two makes the UPDATE find nothing: provision again.
    LOOP
        v_id := NULL;
        INSERT INTO queen.queues (tenant, name) VALUES (p_tenant, p_queue)
        ON CONFLICT (tenant, name) DO NOTHING
        RETURNING id INTO v_id;
        v_created := v_id IS NOT NULL;

        UPDATE queen.queues q SET
            namespace = COALESCE(p_namespace, q.namespace),
            task = CASE WHEN p_task IS NULL THEN q.task ELSE nullif(p_task, '') END,
            lease_time = COALESCE((v_options ->> 'leaseTime')::int4, q.lease_time),
            retry_limit = COALESCE((v_options ->> 'retryLimit')::int4, q.retry_limit),
            dead_letter_queue = COALESCE((v_options ->> 'deadLetterQueue')::boolean,
                                         q.dead_letter_queue),
            dlq_after_max_retries = COALESCE((v_options ->> 'dlqAfterMaxRetries')::boolean,
                                             q.dlq_after_max_retries),
            dedup_window = COALESCE((v_options ->> 'dedupWindow')::int4, q.dedup_window),
            retention_seconds = COALESCE((v_options ->> 'retentionSeconds')::int4,
                                         q.retention_seconds),
            completed_retention_seconds = COALESCE(
                (v_options ->> 'completedRetentionSeconds')::int4,
                q.completed_retention_seconds),
            encryption_enabled = COALESCE((v_options ->> 'encryptionEnabled')::boolean,
                                          q.encryption_enabled),
            delayed_processing = COALESCE((v_options ->> 'delayedProcessing')::int4,
                                          q.delayed_processing),
            window_buffer = COALESCE((v_options ->> 'windowBuffer')::int4, q.window_buffer),
            priority = COALESCE((v_options ->> 'priority')::int4, q.priority),
            max_size = COALESCE((v_options ->> 'maxSize')::int8, q.max_size),
            retry_delay = COALESCE((v_options ->> 'retryDelay')::int4, q.retry_delay),
            ttl = COALESCE((v_options ->> 'ttl')::int4, q.ttl),
            max_wait_time_seconds = COALESCE((v_options ->> 'maxWaitTimeSeconds')::int4,
                                             q.max_wait_time_seconds),
            retention_enabled = COALESCE((v_options ->> 'retentionEnabled')::boolean,
                                         q.retention_enabled),
            updated_at = now()
        WHERE q.tenant = p_tenant AND q.name = p_queue
        RETURNING q.* INTO v_row;
        EXIT WHEN FOUND;

        v_tries := v_tries + 1;
        IF v_tries >= 3 THEN
            RAISE EXCEPTION 'queue_configure_v1: queue % deleted concurrently, retry', p_queue
                USING ERRCODE = '40001';
        END IF;
    END LOOP;

    PERFORM pg_notify('queen_config_v1', jsonb_build_object(
        'tenant', p_tenant, 'queue', v_row.name, 'queueId', v_row.id)::text);

    RETURN jsonb_build_object(
        'created', v_created,
        'queueId', v_row.id,
        'queue', v_row.name,
        'namespace', v_row.namespace,
        'task', v_row.task,
        'options', queen.queue_options_v1(v_row));
END
$$;

-- ---------------------------------------------------------------------------------------------
-- queue_lock_log_v1: a queue's partition rows, ascending by id, FOR UPDATE (a push in flight
-- commits first), then its cursor rows, ascending by (partition_id, consumer_group), FOR
-- UPDATE: steps 2 and 3 of queue_delete_v1's and queue_purge_v1's lock order (header), which
-- hold the queue row already.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.queue_lock_log_v1(p_queue_id int8) RETURNS void
LANGUAGE plpgsql VOLATILE
AS $$
BEGIN
    PERFORM 1 FROM queen.log_partitions lp
    WHERE lp.queue_id = p_queue_id
    ORDER BY lp.id
    FOR UPDATE;
    PERFORM 1 FROM queen.log_consumers c
    JOIN queen.log_partitions lp ON lp.id = c.partition_id
    WHERE lp.queue_id = p_queue_id
    ORDER BY c.partition_id, c.consumer_group
    FOR UPDATE OF c;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- queue_delete_v1: the queue and everything under it (segments, sidecar, cursors and leases,
-- subscription records, DLQ rows, timers). Lock order in the header. false = no such queue of
-- this tenant (nothing done).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.queue_delete_v1(p_tenant uuid, p_queue text) RETURNS boolean
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_id int8;
BEGIN
    IF p_tenant IS NULL OR p_queue IS NULL THEN
        RAISE EXCEPTION 'queue_delete_v1: tenant and queue name required'
            USING ERRCODE = '22023';
    END IF;

    -- 1. the queue row
    SELECT q.id INTO v_id FROM queen.queues q
    WHERE q.tenant = p_tenant AND q.name = p_queue
    FOR UPDATE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;

    -- 2. its partition rows, 3. its cursor rows
    PERFORM queen.queue_lock_log_v1(v_id);

    -- 4. the row; cascades do the rest (schema/001_baseline.sql "Ownership of data")
    DELETE FROM queen.queues q WHERE q.id = v_id;
    RETURN true;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- queue_purge_v1: the messages of a queue go, the queue stays (api.md 5.1, queenctl queues purge).
--   Per partition, every segment up to the last offset is deleted and log_start_offset moves
--   past it, as retention does: offsets are never reused (a new push continues the sequence,
--   offset readers see the log start move); a cursor below the new log start moves to just
--   before it (where a seek to the beginning puts it), so every group's lag drops to 0; groups,
--   subscriptions and options are untouched. What stays:
--   * a live lease's batch and everything after its first offset (the log is contiguous from
--     its start): retention never deletes inside a live lease either; `kept` counts them;
--   * dead-letter rows (api.md 2.8 deletes them) and the transactionId sidecar, so a message
--     pushed again inside dedupWindow is still a duplicate, as after retention.
-- Result: {"partitions": n, "purged": messages removed, "kept": messages left in leases}.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.queue_purge_v1(p_tenant uuid, p_queue text) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_id     int8;
    v_now    timestamptz := now();
    v_part   record;
    v_cut    int8;
    v_leased int8;
    v_start  int8;
    v_parts  int4 := 0;
    v_purged int8 := 0;
    v_kept   int8 := 0;
BEGIN
    IF p_tenant IS NULL OR p_queue IS NULL THEN
        RAISE EXCEPTION 'queue_purge_v1: tenant and queue name required'
            USING ERRCODE = '22023';
    END IF;

    -- 1. the queue row
    SELECT q.id INTO v_id FROM queen.queues q
    WHERE q.tenant = p_tenant AND q.name = p_queue
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    -- 2. its partition rows, 3. its cursor rows
    PERFORM queen.queue_lock_log_v1(v_id);

    FOR v_part IN
        SELECT lp.id, lp.last_offset, lp.log_start_offset FROM queen.log_partitions lp
        WHERE lp.queue_id = v_id
        ORDER BY lp.id
    LOOP
        v_parts := v_parts + 1;
        SELECT min(c.batch_start) INTO v_leased
        FROM queen.log_consumers c
        WHERE c.partition_id = v_part.id AND c.lease_id IS NOT NULL
          AND c.lease_expires_at > v_now;
        v_cut := v_part.last_offset;
        IF v_leased IS NOT NULL THEN
            v_cut := LEAST(v_cut, v_leased - 1);
        END IF;
        v_start := v_part.log_start_offset;
        IF v_cut >= v_start THEN
            WITH gone AS (
                DELETE FROM queen.log_segments s
                WHERE s.partition_id = v_part.id AND s.base_offset >= v_part.log_start_offset
                  AND s.base_offset + s.msg_count - 1 <= v_cut
                RETURNING s.base_offset + s.msg_count AS next_off
            )
            SELECT COALESCE(max(next_off), v_start) INTO v_start FROM gone;
        END IF;
        IF v_start > v_part.log_start_offset THEN
            DELETE FROM queen.message_traces t
            WHERE t.partition_id = v_part.id AND t."offset" < v_start;
            UPDATE queen.log_partitions lp SET log_start_offset = v_start
            WHERE lp.id = v_part.id;
            -- every live batch starts above the cut, so a cursor below the new start holds
            -- no live lease (the condition says it again); an expired one goes, as a seek
            -- clears it
            UPDATE queen.log_consumers c
            SET committed_offset = v_start - 1,
                ready_at = queen.log_ready_at_v1(v_part.id, v_start - 1, NULL, NULL),
                released_lease_id = COALESCE(c.lease_id, c.released_lease_id),
                lease_id = NULL, worker_id = NULL, lease_expires_at = NULL,
                attempt_count = 0, batch_retry_count = 0
            WHERE c.partition_id = v_part.id AND c.committed_offset < v_start - 1
              AND NOT (c.lease_id IS NOT NULL AND c.lease_expires_at > v_now);
            v_purged := v_purged + (v_start - v_part.log_start_offset);
        END IF;
        v_kept := v_kept + GREATEST(v_part.last_offset - v_start + 1, 0);
    END LOOP;
    RETURN jsonb_build_object('partitions', v_parts, 'purged', v_purged, 'kept', v_kept);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_scope_v1: the tenant's queues matching the filters (NULL = any). Inlined.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_scope_v1(p_tenant uuid, p_queue text, p_namespace text,
                                     p_task text)
RETURNS SETOF queen.queues
LANGUAGE sql STABLE
AS $$
    SELECT q.* FROM queen.queues q
    WHERE q.tenant = p_tenant
      AND (p_queue IS NULL OR q.name = p_queue)
      AND (p_namespace IS NULL OR q.namespace = p_namespace)
      AND (p_task IS NULL OR q.task = p_task)
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_partition_stats_v1: every partition of one queue (of this tenant), ordered by name.
--   total       retained messages
--   pending     queue-level pending (lowest cursor; header)
--   processing  messages in live leases (header)
--   cursors     cursor rows (one per group that touched the partition); leases: live ones
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_partition_stats_v1(p_tenant uuid, p_queue_id int8)
RETURNS TABLE (
    queue_id         int8,
    partition_id     int8,
    partition_name   text,
    created_at       timestamptz,
    last_offset      int8,
    log_start_offset int8,
    last_write_at    timestamptz,
    total            int8,
    pending          int8,
    processing       int8,
    cursors          int8,
    leases           int8
)
LANGUAGE sql STABLE
AS $$
    SELECT lp.queue_id, lp.id, lp.name::text, lp.created_at, lp.last_offset,
           lp.log_start_offset, lp.last_write_at,
           GREATEST(lp.last_offset - lp.log_start_offset + 1, 0),
           GREATEST(lp.last_offset - GREATEST(COALESCE(c.low, 0), lp.log_start_offset - 1), 0),
           COALESCE(c.busy, 0)::int8, COALESCE(c.n, 0), COALESCE(c.live, 0)
    FROM queen.queues q
    JOIN queen.log_partitions lp ON lp.queue_id = q.id
    LEFT JOIN LATERAL (
        SELECT min(x.committed_offset) AS low,
               sum(GREATEST(COALESCE(x.batch_end, x.committed_offset) - x.committed_offset, 0))
                   FILTER (WHERE x.lease_id IS NOT NULL AND x.lease_expires_at > now()) AS busy,
               count(*) AS n,
               count(*) FILTER (WHERE x.lease_id IS NOT NULL
                                  AND x.lease_expires_at > now()) AS live
        FROM queen.log_consumers x
        WHERE x.partition_id = lp.id
    ) c ON true
    WHERE q.id = p_queue_id AND q.tenant = p_tenant
    ORDER BY lp.name
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_group_pending_v1: per partition of one queue, the pending count of one group (header).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_group_pending_v1(p_tenant uuid, p_queue_id int8, p_group text)
RETURNS TABLE (partition_id int8, partition_name text, has_cursor boolean, pending int8)
LANGUAGE sql STABLE
AS $$
    SELECT lp.id, lp.name::text, c.committed_offset IS NOT NULL,
           GREATEST(lp.last_offset - GREATEST(
               COALESCE(c.committed_offset,
                        CASE WHEN m.queue_id IS NULL THEN lp.log_start_offset - 1
                             ELSE queen.log_cursor_before_v1(lp.id, m.subscription_from) END),
               lp.log_start_offset - 1), 0)
    FROM queen.queues q
    JOIN queen.log_partitions lp ON lp.queue_id = q.id
    LEFT JOIN queen.log_consumers c
           ON c.partition_id = lp.id AND c.consumer_group = p_group
    LEFT JOIN queen.consumer_groups_meta m
           ON m.queue_id = q.id AND m.consumer_group = p_group
    WHERE q.id = p_queue_id AND q.tenant = p_tenant
    ORDER BY lp.name
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_overview_v1: counts over the whole tenant.
--   namespaces  distinct namespaces; tasks: distinct (namespace, task) with a task
--   consumer_groups  distinct group names with a cursor or a subscription record
--                    (__QUEUE_MODE__ included: it is a plain group)
--   dead_letter DLQ rows
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_overview_v1(p_tenant uuid)
RETURNS TABLE (
    queues          int8,
    partitions      int8,
    namespaces      int8,
    tasks           int8,
    consumer_groups int8,
    total           int8,
    pending         int8,
    processing      int8,
    dead_letter     int8
)
LANGUAGE sql STABLE
AS $$
    SELECT
        (SELECT count(*) FROM queen.queues q WHERE q.tenant = p_tenant),
        COALESCE(s.partitions, 0),
        (SELECT count(DISTINCT q.namespace) FROM queen.queues q WHERE q.tenant = p_tenant),
        (SELECT count(*) FROM (SELECT DISTINCT q.namespace, q.task FROM queen.queues q
                               WHERE q.tenant = p_tenant AND q.task IS NOT NULL) t),
        (SELECT count(*) FROM (
            SELECT c.consumer_group FROM queen.log_consumers c
            JOIN queen.log_partitions lp ON lp.id = c.partition_id
            JOIN queen.queues q ON q.id = lp.queue_id
            WHERE q.tenant = p_tenant
            UNION
            SELECT m.consumer_group FROM queen.consumer_groups_meta m
            JOIN queen.queues q ON q.id = m.queue_id
            WHERE q.tenant = p_tenant) g),
        COALESCE(s.total, 0), COALESCE(s.pending, 0), COALESCE(s.processing, 0),
        (SELECT count(*) FROM queen.log_dlq d WHERE d.tenant = p_tenant)
    FROM (
        SELECT count(*) AS partitions, sum(ps.total)::int8 AS total,
               sum(ps.pending)::int8 AS pending, sum(ps.processing)::int8 AS processing
        FROM queen.queues q
        CROSS JOIN LATERAL queen.admin_partition_stats_v1(p_tenant, q.id) ps
        WHERE q.tenant = p_tenant
    ) s
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_queues_v1: one page of the matching queues, ordered by name, with their counts.
-- p_limit NULL = all. Every row carries total_count (all matches); when the page is empty
-- (no match, or p_offset past the end) ONE row comes back with id NULL and only total_count.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_queues_v1(p_tenant uuid, p_queue text, p_namespace text,
                                      p_task text, p_limit int4, p_offset int8)
RETURNS TABLE (
    id          int8,
    name        text,
    namespace   text,
    task        text,
    priority    int4,
    created_at  timestamptz,
    updated_at  timestamptz,
    partitions  int8,
    total       int8,
    pending     int8,
    processing  int8,
    dead_letter int8,
    total_count int8
)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    IF p_limit IS NOT NULL AND p_limit < 1 OR COALESCE(p_offset, 0) < 0 THEN
        RAISE EXCEPTION 'admin_queues_v1: limit must be >= 1 and offset >= 0'
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH scope AS MATERIALIZED (
        SELECT s.id, s.name, s.namespace, s.task, s.priority, s.created_at, s.updated_at
        FROM queen.admin_scope_v1(p_tenant, p_queue, p_namespace, p_task) s
    ),
    page AS (
        SELECT * FROM scope ORDER BY scope.name LIMIT p_limit OFFSET COALESCE(p_offset, 0)
    )
    SELECT p.id, p.name::text, p.namespace::text, p.task::text, p.priority, p.created_at,
           p.updated_at, COALESCE(st.partitions, 0), COALESCE(st.total, 0),
           COALESCE(st.pending, 0), COALESCE(st.processing, 0),
           CASE WHEN p.id IS NULL THEN 0
                ELSE (SELECT count(*) FROM queen.log_dlq d WHERE d.queue_id = p.id) END,
           t.n
    FROM (SELECT count(*) AS n FROM scope) t
    LEFT JOIN page p ON true
    LEFT JOIN LATERAL (
        SELECT count(*) AS partitions, sum(ps.total)::int8 AS total,
               sum(ps.pending)::int8 AS pending, sum(ps.processing)::int8 AS processing
        FROM queen.admin_partition_stats_v1(p_tenant, p.id) ps
    ) st ON p.id IS NOT NULL
    ORDER BY p.name;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_queue_v1: the queue row with its options and its DLQ row count; no row = absent.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_queue_v1(p_tenant uuid, p_queue text)
RETURNS TABLE (
    id         int8,
    name       text,
    namespace  text,
    task       text,
    priority   int4,
    created_at timestamptz,
    updated_at  timestamptz,
    options     jsonb,
    dead_letter int8
)
LANGUAGE sql STABLE
AS $$
    SELECT q.id, q.name::text, q.namespace::text, q.task::text, q.priority, q.created_at,
           q.updated_at, queen.queue_options_v1(q),
           (SELECT count(*) FROM queen.log_dlq d WHERE d.queue_id = q.id)
    FROM queen.queues q
    WHERE q.tenant = p_tenant AND q.name = p_queue
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_queue_groups_v1: one row per group known on the queue (a cursor or a subscription
-- record), ordered by name.
--   cursors      cursor rows of the group on the queue
--   pending      exact, over EVERY partition of the queue (admin_group_pending_v1)
--   processing   messages in the group's live leases
--   members      distinct holders of live leases (worker_id, else lease_id)
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_queue_groups_v1(p_tenant uuid, p_queue_id int8)
RETURNS TABLE (
    consumer_group    text,
    cursors           int8,
    pending           int8,
    processing        int8,
    members           int8,
    total_consumed    int8,
    last_consumed_at  timestamptz,
    subscription_mode text,
    subscription_from timestamptz
)
LANGUAGE sql STABLE
AS $$
    WITH names AS (
        SELECT DISTINCT c.consumer_group::text AS g
        FROM queen.log_consumers c
        JOIN queen.log_partitions lp ON lp.id = c.partition_id
        JOIN queen.queues q ON q.id = lp.queue_id
        WHERE q.id = p_queue_id AND q.tenant = p_tenant
        UNION
        SELECT m.consumer_group::text
        FROM queen.consumer_groups_meta m
        JOIN queen.queues q ON q.id = m.queue_id
        WHERE q.id = p_queue_id AND q.tenant = p_tenant
    )
    SELECT n.g, COALESCE(cs.cursors, 0), COALESCE(pd.pending, 0), COALESCE(cs.busy, 0),
           COALESCE(cs.members, 0), COALESCE(cs.consumed, 0), cs.last_at,
           m.subscription_mode, m.subscription_from
    FROM names n
    LEFT JOIN LATERAL (
        SELECT count(*) AS cursors,
               sum(GREATEST(COALESCE(c.batch_end, c.committed_offset) - c.committed_offset, 0))
                   FILTER (WHERE c.lease_id IS NOT NULL
                             AND c.lease_expires_at > now())::int8 AS busy,
               count(DISTINCT COALESCE(c.worker_id, c.lease_id::text))
                   FILTER (WHERE c.lease_id IS NOT NULL
                             AND c.lease_expires_at > now()) AS members,
               sum(c.total_consumed)::int8 AS consumed,
               max(c.last_consumed_at) AS last_at
        FROM queen.log_consumers c
        JOIN queen.log_partitions lp ON lp.id = c.partition_id
        WHERE lp.queue_id = p_queue_id AND c.consumer_group = n.g
    ) cs ON true
    LEFT JOIN LATERAL (
        SELECT sum(gp.pending)::int8 AS pending
        FROM queen.admin_group_pending_v1(p_tenant, p_queue_id, n.g) gp
    ) pd ON true
    LEFT JOIN queen.consumer_groups_meta m
           ON m.queue_id = p_queue_id AND m.consumer_group = n.g
    ORDER BY n.g
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_queue_cursors_v1: every cursor of one queue, by (group, partition name).
--   pending       last_offset - the cursor (from the log start when below it)
--   lease_active  a live lease (lease_id set, not expired)
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_queue_cursors_v1(p_tenant uuid, p_queue_id int8)
RETURNS TABLE (
    consumer_group   text,
    partition_id     int8,
    partition_name   text,
    committed_offset int8,
    last_offset      int8,
    pending          int8,
    lease_active     boolean,
    lease_expires_at timestamptz,
    worker_id        text,
    batch_start      int8,
    batch_end        int8,
    attempt_count    int4,
    total_consumed   int8,
    last_consumed_at timestamptz,
    last_popped_at   timestamptz
)
LANGUAGE sql STABLE
AS $$
    SELECT c.consumer_group::text, lp.id, lp.name::text, c.committed_offset, lp.last_offset,
           GREATEST(lp.last_offset - GREATEST(c.committed_offset, lp.log_start_offset - 1), 0),
           (c.lease_id IS NOT NULL AND c.lease_expires_at > now()),
           c.lease_expires_at, c.worker_id, c.batch_start, c.batch_end, c.attempt_count,
           c.total_consumed, c.last_consumed_at, c.last_popped_at
    FROM queen.queues q
    JOIN queen.log_partitions lp ON lp.queue_id = q.id
    JOIN queen.log_consumers c ON c.partition_id = lp.id
    WHERE q.id = p_queue_id AND q.tenant = p_tenant
    ORDER BY c.consumer_group, lp.name
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_depth_v1: per-partition pending of one queue, queue-level (p_group NULL) or of one
-- group. No row = no such queue; a queue without partitions gives ONE row with partition_id
-- NULL and pending 0.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_depth_v1(p_tenant uuid, p_queue text, p_group text)
RETURNS TABLE (queue_id int8, partition_id int8, partition_name text, pending int8)
LANGUAGE sql STABLE
AS $$
    SELECT q.id, d.partition_id, d.partition_name, COALESCE(d.pending, 0)
    FROM queen.queues q
    LEFT JOIN LATERAL (
        SELECT ps.partition_id, ps.partition_name, ps.pending
        FROM queen.admin_partition_stats_v1(p_tenant, q.id) ps
        WHERE p_group IS NULL
        UNION ALL
        SELECT gp.partition_id, gp.partition_name, gp.pending
        FROM queen.admin_group_pending_v1(p_tenant, q.id, p_group) gp
        WHERE p_group IS NOT NULL
    ) d ON true
    WHERE q.tenant = p_tenant AND q.name = p_queue
    ORDER BY d.partition_name
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_namespaces_v1 / admin_tasks_v1: queues grouped by namespace / by (namespace, task)
-- (queues without a task are not in any task), with retained and pending message counts.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_namespaces_v1(p_tenant uuid)
RETURNS TABLE (namespace text, queues int8, partitions int8, total int8, pending int8)
LANGUAGE sql STABLE
AS $$
    SELECT q.namespace::text, count(*), sum(st.partitions)::int8,
           sum(st.total)::int8, sum(st.pending)::int8
    FROM queen.queues q
    CROSS JOIN LATERAL (
        SELECT count(*) AS partitions, COALESCE(sum(ps.total), 0) AS total,
               COALESCE(sum(ps.pending), 0) AS pending
        FROM queen.admin_partition_stats_v1(p_tenant, q.id) ps
    ) st
    WHERE q.tenant = p_tenant
    GROUP BY q.namespace
    ORDER BY q.namespace
$$;

CREATE OR REPLACE FUNCTION queen.admin_tasks_v1(p_tenant uuid)
RETURNS TABLE (namespace text, task text, queues int8, partitions int8, total int8,
               pending int8)
LANGUAGE sql STABLE
AS $$
    SELECT q.namespace::text, q.task::text, count(*), sum(st.partitions)::int8,
           sum(st.total)::int8, sum(st.pending)::int8
    FROM queen.queues q
    CROSS JOIN LATERAL (
        SELECT count(*) AS partitions, COALESCE(sum(ps.total), 0) AS total,
               COALESCE(sum(ps.pending), 0) AS pending
        FROM queen.admin_partition_stats_v1(p_tenant, q.id) ps
    ) st
    WHERE q.tenant = p_tenant AND q.task IS NOT NULL
    GROUP BY q.namespace, q.task
    ORDER BY q.task, q.namespace
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_partitions_v1: one page of the tenant's partitions (of one queue, or all with NULL),
-- ordered by (queue name, partition name). Same empty-page convention as admin_queues_v1:
-- ONE row with id NULL carrying total_count.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_partitions_v1(p_tenant uuid, p_queue text, p_limit int4,
                                          p_offset int8)
RETURNS TABLE (
    id               int8,
    queue_name       text,
    name             text,
    created_at       timestamptz,
    last_offset      int8,
    log_start_offset int8,
    last_write_at    timestamptz,
    total_count      int8
)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    IF p_limit IS NOT NULL AND p_limit < 1 OR COALESCE(p_offset, 0) < 0 THEN
        RAISE EXCEPTION 'admin_partitions_v1: limit must be >= 1 and offset >= 0'
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH scope AS MATERIALIZED (
        SELECT lp.id, q.name::text AS qname, lp.name::text AS pname, lp.created_at,
               lp.last_offset, lp.log_start_offset, lp.last_write_at
        FROM queen.queues q
        JOIN queen.log_partitions lp ON lp.queue_id = q.id
        WHERE q.tenant = p_tenant AND (p_queue IS NULL OR q.name = p_queue)
    ),
    page AS (
        SELECT * FROM scope ORDER BY scope.qname, scope.pname
        LIMIT p_limit OFFSET COALESCE(p_offset, 0)
    )
    SELECT p.id, p.qname, p.pname, p.created_at, p.last_offset, p.log_start_offset,
           p.last_write_at, t.n
    FROM (SELECT count(*) AS n FROM scope) t
    LEFT JOIN page p ON true
    ORDER BY p.qname, p.pname;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_segment_from_v1: base offset of the first segment of a partition created at or after
-- p_from; NULL if none. Segments are created_at-monotone in offset order (push.sql), so a
-- binary search over the primary key costs O(log segments) index probes instead of a walk of
-- the partition's whole history (there is no created_at index on purpose).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_segment_from_v1(p_partition_id int8, p_from timestamptz)
RETURNS int8
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_lo   int8;
    v_hi   int8;
    v_mid  int8;
    v_base int8;
    v_at   timestamptz;
BEGIN
    SELECT s.base_offset INTO v_lo FROM queen.log_segments s
    WHERE s.partition_id = p_partition_id ORDER BY s.base_offset LIMIT 1;
    IF v_lo IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT s.base_offset, s.created_at INTO v_hi, v_at FROM queen.log_segments s
    WHERE s.partition_id = p_partition_id ORDER BY s.base_offset DESC LIMIT 1;
    IF v_at < p_from THEN
        RETURN NULL;
    END IF;
    -- invariant: v_lo and v_hi are base offsets of segments, the answer lies in [v_lo, v_hi]
    -- and the segment at v_hi qualifies.
    WHILE v_lo < v_hi LOOP
        v_mid := v_lo + (v_hi - v_lo) / 2;
        SELECT s.base_offset, s.created_at INTO v_base, v_at FROM queen.log_segments s
        WHERE s.partition_id = p_partition_id AND s.base_offset <= v_mid
        ORDER BY s.base_offset DESC LIMIT 1;
        IF v_at >= p_from THEN
            v_hi := v_base;            -- v_lo <= v_base <= v_mid < v_hi
        ELSE
            SELECT s.base_offset INTO v_lo FROM queen.log_segments s
            WHERE s.partition_id = p_partition_id AND s.base_offset > v_base
            ORDER BY s.base_offset LIMIT 1;   -- v_base < new v_lo <= v_hi
        END IF;
    END LOOP;
    RETURN v_lo;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_throughput_v1: messages ingested per bucket of p_bucket_s seconds over [p_from, p_to),
-- every bucket present (0 when empty), ascending. Scope filters as admin_scope_v1. Only
-- partitions written since p_from are visited (log_partitions.last_created_at, exact), each
-- from its first segment at or after p_from (admin_segment_from_v1).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_throughput_v1(p_tenant uuid, p_queue text, p_namespace text,
                                          p_task text, p_from timestamptz, p_to timestamptz,
                                          p_bucket_s int4)
RETURNS TABLE (bucket_at timestamptz, ingested int8)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
DECLARE
    v_step   interval;
    v_origin CONSTANT timestamptz := '2000-01-01 00:00:00+00';
BEGIN
    IF p_from IS NULL OR p_to IS NULL OR p_from >= p_to OR p_bucket_s IS NULL
       OR p_bucket_s < 1 OR extract(epoch FROM p_to - p_from) / p_bucket_s > 100000 THEN
        RAISE EXCEPTION 'admin_throughput_v1: need from < to, a bucket >= 1 s and at most '
            '100000 buckets' USING ERRCODE = '22023';
    END IF;
    v_step := make_interval(secs => p_bucket_s);
    RETURN QUERY
    WITH parts AS (
        SELECT lp.id, queen.admin_segment_from_v1(lp.id, p_from) AS first_base
        FROM queen.admin_scope_v1(p_tenant, p_queue, p_namespace, p_task) q
        JOIN queen.log_partitions lp ON lp.queue_id = q.id
        WHERE lp.last_created_at >= p_from
    ),
    seg AS (
        SELECT date_bin(v_step, s.created_at, v_origin) AS b, sum(s.msg_count)::int8 AS n
        FROM parts p
        JOIN queen.log_segments s ON s.partition_id = p.id AND s.base_offset >= p.first_base
        WHERE s.created_at >= p_from AND s.created_at < p_to
        GROUP BY 1
    )
    SELECT g.b, COALESCE(seg.n, 0)::int8
    FROM generate_series(date_bin(v_step, p_from, v_origin),
                         p_to - interval '1 microsecond', v_step) AS g(b)
    LEFT JOIN seg ON seg.b = g.b
    ORDER BY g.b;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_leases_v1: live leases in scope: cursor rows with a live lease, and the distinct
-- partitions they are on.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_leases_v1(p_tenant uuid, p_queue text, p_namespace text,
                                      p_task text)
RETURNS TABLE (active int8, partitions_with_leases int8)
LANGUAGE sql STABLE
AS $$
    SELECT count(*), count(DISTINCT c.partition_id)
    FROM queen.admin_scope_v1(p_tenant, p_queue, p_namespace, p_task) q
    JOIN queen.log_partitions lp ON lp.queue_id = q.id
    JOIN queen.log_consumers c ON c.partition_id = lp.id
    WHERE c.lease_id IS NOT NULL AND c.lease_expires_at > now()
$$;

-- ---------------------------------------------------------------------------------------------
-- admin_dlq_summary_v1: DLQ rows in scope filed in [p_from, p_to):
--   {"totalMessages": n, "affectedPartitions": n,
--    "topErrors": [{"error": text|null, "count": n}, ...]}  (most frequent first, p_top at most)
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.admin_dlq_summary_v1(p_tenant uuid, p_queue text, p_namespace text,
                                           p_task text, p_from timestamptz, p_to timestamptz,
                                           p_top int4)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_total int8;
    v_parts int8;
    v_top   jsonb;
BEGIN
    IF p_from IS NULL OR p_to IS NULL OR p_from >= p_to OR p_top IS NULL OR p_top < 0 THEN
        RAISE EXCEPTION 'admin_dlq_summary_v1: need from < to and top >= 0'
            USING ERRCODE = '22023';
    END IF;
    SELECT count(*), count(DISTINCT d.partition_id) INTO v_total, v_parts
    FROM queen.admin_scope_v1(p_tenant, p_queue, p_namespace, p_task) q
    JOIN queen.log_dlq d ON d.queue_id = q.id
    WHERE d.created_at >= p_from AND d.created_at < p_to;
    SELECT COALESCE(jsonb_agg(jsonb_build_object('error', e.error, 'count', e.n)
                              ORDER BY e.n DESC, e.error), '[]'::jsonb) INTO v_top
    FROM (
        SELECT d.error, count(*) AS n
        FROM queen.admin_scope_v1(p_tenant, p_queue, p_namespace, p_task) q
        JOIN queen.log_dlq d ON d.queue_id = q.id
        WHERE d.created_at >= p_from AND d.created_at < p_to
        GROUP BY d.error
        ORDER BY count(*) DESC, d.error
        LIMIT p_top
    ) e;
    RETURN jsonb_build_object('totalMessages', v_total, 'affectedPartitions', v_parts,
                              'topErrors', v_top);
END
$$;
