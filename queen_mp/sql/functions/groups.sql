-- groups.sql: consumer-group administration (api.md 2.10): listings with exact lag, delete,
-- subscription moves and seeks.
--
-- Functions (each takes the caller's tenant first; a queue of another tenant is absent):
--   queen.group_cursors_v1(uuid, text) -> table: one row per cursor (partition, group) of the
--       tenant, with its exact lag; NULL group = every group. Shared by the listings below.
--   queen.group_list_v1(uuid) -> table: one row per (group, queue) known from cursors or from
--       subscription records (GET /consumer-groups).
--   queen.group_lagging_v1(uuid, int8) -> table: cursors lagging at least N seconds.
--   queen.group_delete_v1(uuid, text, text, boolean) -> (deleted_partitions, metadata_rows)
--       drop a group's cursors (with their leases) and, optionally, its subscription records;
--       NULL queue = everywhere.
--   queen.group_subscription_v1(uuid, text, text, timestamptz) -> (queues_found, meta_rows,
--       cursor_rows): record a 'timestamp' start and move the cursors not consumed from yet.
--   queen.group_seek_v1(uuid, text, text, text, timestamptz) -> int8: move every cursor of a
--       queue to the log start, the log end or a time; NULL = unknown queue.
--   queen.group_start_v1(int8[], text) -> int8: the cursor rows of a group's start on some
--       queues (every partition, at the recorded start); called by the pop and the repair.
--   queen.log_ready_repair_v1() -> int8: cursor rows and ready flags an older build left
--       missing (schema/002_ready_index.sql), on every partition; run by the function families.
--   queen.log_ready_repair_v3(int8, int4) -> (repaired, next_after): the same on a slice of
--       the partitions; housekeeping sweeps the table with it, a slice a round.
--   Calls queen.log_cursor_before_v1 and queen.log_pending_at_v1 (pop.sql).
--
-- Tables touched:
--   queen.queues                read; FOR UPDATE in group_start_v1 (see lock order)
--   queen.log_partitions        read only (last_offset, log_start_offset); see lock order
--   queen.log_segments          read only (created_at of the first unconsumed message; the
--                               segment at or after a time, through log_cursor_before_v1)
--   queen.log_consumers         read; DELETE (group_delete_v1); UPDATE cursor/lease/retry
--                               columns and ready_at (subscription, seek: pop.sql's
--                               log_ready_at_v1); INSERT missing rows with queue_id and
--                               ready_at (seek, group_start_v1, log_ready_repair_v3)
--   queen.consumer_groups_meta  read; DELETE (group_delete_v1); INSERT/UPDATE (subscription);
--                               UPDATE started (group_delete_v1 keeping the records, repair)
--
-- Lock order (design.md invariant 4; the same as log_pop_v3 in pop.sql, which records
--   the group's consumer_groups_meta row before it creates or locks any cursor row):
--   1. consumer_groups_meta rows ascending by queue_id (only one consumer_group per call);
--   2. log_consumers rows ascending by (partition_id, consumer_group): taken by one
--      SELECT ... ORDER BY partition_id FOR UPDATE before the DELETE / UPDATE that changes
--      them. group_seek_v1 first inserts the missing rows (ascending, ON CONFLICT DO NOTHING,
--      as log_pop_v3 does), then locks all of them.
--   queues rows come before everything: a first pop (and the repair) takes them FOR UPDATE
--   (ascending id), then writes the records, then inserts cursor rows (group_start_v1);
--   group_delete_v1 keeping the records takes queue rows and records FOR UPDATE before any
--   cursor; subscription's upsert waits for the queue row (FOR KEY SHARE) before it writes
--   the record. That FOR UPDATE and the FOR KEY SHARE that a partition's creation takes on
--   its queue row (log_partitions_cursors, triggers.sql) exclude each other, so every
--   partition created around a group's start gets its cursor.
--   No log_partitions row is locked explicitly. The only locks on them are the FOR KEY SHARE
--   locks of foreign key checks (cursor inserts -> log_partitions, record upserts -> queues)
--   and log_ready_at_v1's FOR SHARE SKIP LOCKED (never waits). A push holds its partition rows
--   with FOR NO KEY UPDATE, which a FOR KEY SHARE does not wait for.
--
-- SQLSTATEs raised:
--   22023  invalid_parameter_value: NULL group name; group_seek_v1 with a target other than
--          'beginning' | 'end' | 'timestamp', or 'timestamp' without a time;
--          group_subscription_v1 without a time; group_lagging_v1 with a negative minimum
--   40P01 / 55P03 / 40001 are not raised here but may reach the caller through the row locks
--          (nothing committed; a retry is safe).
--
-- Isolation: READ COMMITTED; each procedure is one transaction (the caller's autocommit
-- statement). Lag is computed against log_partitions.last_offset as visible at the statement.
--
-- Cursor semantics (schema/001_baseline.sql): committed_offset = every offset <= it is consumed. A live
-- lease is lease_id IS NOT NULL AND lease_expires_at > now(). Releasing a lease:
-- released_lease_id := lease_id (kept as it was when there is no lease), lease_id, worker_id,
-- lease_expires_at := NULL (a seek or reset redelivers at once; only an ack's release for
-- redelivery keeps a time there, which the pop's retryDelay counts from: ack.sql, pop.sql).
-- Resetting retry state: attempt_count, batch_retry_count := 0.

-- ---------------------------------------------------------------------------------------------
-- group_cursors_v1: every cursor of the tenant (of one group, or of all with p_group NULL).
--   offset_lag            last_offset - committed_offset, never below 0 (exact)
--   oldest_unconsumed_at  created_at of the message at committed_offset + 1 (its segment's
--                         commit time), or of the first retained one if retention removed it;
--                         NULL when there is no lag
--   time_lag_seconds      whole seconds from oldest_unconsumed_at to now(); 0 without lag
--   lease_active          a live lease (see the header)
-- Rows ordered by (consumer_group, queue name, partition id). Plain SQL, inlined by the planner.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.group_cursors_v1(p_tenant uuid, p_group text)
RETURNS TABLE (
    consumer_group       text,
    queue_id             int8,
    queue_name           text,
    partition_id         int8,
    partition_name       text,
    committed_offset     int8,
    last_offset          int8,
    offset_lag           int8,
    oldest_unconsumed_at timestamptz,
    time_lag_seconds     int8,
    lease_active         boolean,
    lease_id             uuid,
    worker_id            text,
    lease_expires_at     timestamptz,
    last_consumed_at     timestamptz,
    last_popped_at       timestamptz,
    total_consumed       int8,
    created_at           timestamptz
)
LANGUAGE sql STABLE
AS $$
    SELECT c.consumer_group::text, q.id, q.name::text, lp.id, lp.name::text,
           c.committed_offset, lp.last_offset,
           GREATEST(lp.last_offset - c.committed_offset, 0),
           o.at,
           CASE WHEN o.at IS NULL THEN 0
                ELSE GREATEST(floor(extract(epoch FROM now() - o.at)), 0)::int8 END,
           (c.lease_id IS NOT NULL AND c.lease_expires_at > now()),
           c.lease_id, c.worker_id, c.lease_expires_at, c.last_consumed_at, c.last_popped_at,
           c.total_consumed, c.created_at
    FROM queen.log_consumers c
    JOIN queen.log_partitions lp ON lp.id = c.partition_id
    JOIN queen.queues q ON q.id = lp.queue_id
    LEFT JOIN LATERAL (
        -- The segment covering the first unconsumed offset: the last one starting at or
        -- before it (segments are gapless above log_start_offset); the first one after it
        -- only if that finds nothing (a segment trimmed under a stale log_start_offset).
        SELECT COALESCE(
                   (SELECT s.created_at FROM queen.log_segments s
                    WHERE s.partition_id = lp.id
                      AND s.base_offset <= GREATEST(c.committed_offset + 1,
                                                    lp.log_start_offset)
                    ORDER BY s.base_offset DESC LIMIT 1),
                   (SELECT s.created_at FROM queen.log_segments s
                    WHERE s.partition_id = lp.id
                      AND s.base_offset > GREATEST(c.committed_offset + 1,
                                                   lp.log_start_offset)
                    ORDER BY s.base_offset LIMIT 1)) AS at
        WHERE lp.last_offset > c.committed_offset
    ) o ON true
    WHERE q.tenant = p_tenant
      AND (p_group IS NULL OR c.consumer_group = p_group)
    ORDER BY c.consumer_group, q.name, lp.id
$$;

-- ---------------------------------------------------------------------------------------------
-- group_list_v1: one row per (group, queue) that has a cursor or a subscription record.
--   members              distinct holders of live leases (worker_id, else lease_id)
--   partitions           the group's cursors on the queue (0 for a subscription record alone)
--   partitions_with_lag  cursors with offset_lag > 0
--   total_lag            sum of offset_lag (exact); max_time_lag: max time_lag_seconds
--   last_activity_at     latest pop or consumption of any cursor (NULL if none ever)
--   state                'Stable'; 'Lagging' if max_time_lag > 60; 'Dead' if lagging and no
--                        pop/ack for 24 h (counted from the newest cursor's creation when the
--                        group never popped)
--   subscription_*       the consumer_groups_meta row; NULL when there is none
-- Rows ordered by (group, queue name).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.group_list_v1(p_tenant uuid)
RETURNS TABLE (
    consumer_group          text,
    queue_name              text,
    members                 int8,
    partitions              int8,
    partitions_with_lag     int8,
    total_lag               int8,
    max_time_lag            int8,
    last_activity_at        timestamptz,
    state                   text,
    subscription_mode       text,
    subscription_from       timestamptz,
    subscription_created_at timestamptz
)
LANGUAGE sql STABLE
AS $$
    WITH agg AS (
        SELECT g.consumer_group, g.queue_id, g.queue_name,
               count(DISTINCT COALESCE(g.worker_id, g.lease_id::text))
                   FILTER (WHERE g.lease_active) AS members,
               count(*) AS partitions,
               count(*) FILTER (WHERE g.offset_lag > 0) AS partitions_with_lag,
               sum(g.offset_lag)::int8 AS total_lag,
               max(g.time_lag_seconds) AS max_time_lag,
               max(GREATEST(g.last_popped_at, g.last_consumed_at)) AS last_activity_at,
               max(g.created_at) AS newest_cursor_at
        FROM queen.group_cursors_v1(p_tenant, NULL) g
        GROUP BY g.consumer_group, g.queue_id, g.queue_name
    ),
    meta AS (
        SELECT m.consumer_group::text AS consumer_group, q.id AS queue_id,
               q.name::text AS queue_name, m.subscription_mode, m.subscription_from,
               m.created_at
        FROM queen.consumer_groups_meta m
        JOIN queen.queues q ON q.id = m.queue_id
        WHERE q.tenant = p_tenant
    )
    SELECT COALESCE(a.consumer_group, m.consumer_group),
           COALESCE(a.queue_name, m.queue_name),
           COALESCE(a.members, 0), COALESCE(a.partitions, 0),
           COALESCE(a.partitions_with_lag, 0), COALESCE(a.total_lag, 0),
           COALESCE(a.max_time_lag, 0), a.last_activity_at,
           CASE WHEN COALESCE(a.max_time_lag, 0) <= 60 THEN 'Stable'
                WHEN COALESCE(a.last_activity_at, a.newest_cursor_at)
                     < now() - interval '24 hours' THEN 'Dead'
                ELSE 'Lagging' END,
           m.subscription_mode, m.subscription_from, m.created_at
    FROM agg a
    FULL JOIN meta m ON m.queue_id = a.queue_id AND m.consumer_group = a.consumer_group
    ORDER BY 1, 2
$$;

-- ---------------------------------------------------------------------------------------------
-- group_lagging_v1: cursors with pending messages whose oldest one is at least p_min_seconds
-- old; most lagging first.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.group_lagging_v1(p_tenant uuid, p_min_seconds int8)
RETURNS TABLE (
    consumer_group       text,
    queue_name           text,
    partition_name       text,
    partition_id         int8,
    worker_id            text,
    offset_lag           int8,
    time_lag_seconds     int8,
    oldest_unconsumed_at timestamptz,
    last_consumed_at     timestamptz
)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    IF p_min_seconds IS NULL OR p_min_seconds < 0 THEN
        RAISE EXCEPTION 'group_lagging_v1: minimum lag must be >= 0 (got %)', p_min_seconds
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT g.consumer_group, g.queue_name, g.partition_name, g.partition_id, g.worker_id,
           g.offset_lag, g.time_lag_seconds, g.oldest_unconsumed_at, g.last_consumed_at
    FROM queen.group_cursors_v1(p_tenant, NULL) g
    WHERE g.offset_lag > 0 AND g.time_lag_seconds >= p_min_seconds
    ORDER BY g.time_lag_seconds DESC, g.consumer_group, g.queue_name, g.partition_id;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- group_delete_v1: drop a group's cursors, and its leases with them, on one queue (p_queue)
-- or everywhere (NULL); with p_delete_metadata also its subscription records there. An
-- unknown group or queue deletes nothing (both counts 0).
--   deleted_partitions  cursor rows deleted
--   metadata_rows       consumer_groups_meta rows deleted (0 when p_delete_metadata is false)
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.group_delete_v1(p_tenant uuid, p_group text, p_queue text,
                                      p_delete_metadata boolean)
RETURNS TABLE (deleted_partitions int8, metadata_rows int8)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_cursors int8 := 0;
    v_meta    int8 := 0;
BEGIN
    IF p_group IS NULL THEN
        RAISE EXCEPTION 'group_delete_v1: group name required' USING ERRCODE = '22023';
    END IF;

    IF NOT p_delete_metadata THEN
        -- The group keeps its recorded starts, no longer started: its next pop creates its
        -- cursor rows from them again (group_start_v1). Queue rows, then the records, then
        -- the cursors: the order a first pop takes them in.
        PERFORM 1
        FROM queen.consumer_groups_meta m
        JOIN queen.queues q ON q.id = m.queue_id
        WHERE q.tenant = p_tenant AND (p_queue IS NULL OR q.name = p_queue)
          AND m.consumer_group = p_group
        ORDER BY q.id
        FOR UPDATE OF q, m;
        UPDATE queen.consumer_groups_meta m SET started = false
        FROM queen.queues q
        WHERE q.id = m.queue_id AND q.tenant = p_tenant
          AND (p_queue IS NULL OR q.name = p_queue)
          AND m.consumer_group = p_group AND m.started;
    END IF;

    IF p_delete_metadata THEN
        PERFORM 1
        FROM queen.consumer_groups_meta m
        JOIN queen.queues q ON q.id = m.queue_id
        WHERE q.tenant = p_tenant AND (p_queue IS NULL OR q.name = p_queue)
          AND m.consumer_group = p_group
        ORDER BY m.queue_id
        FOR UPDATE OF m;

        DELETE FROM queen.consumer_groups_meta m
        USING queen.queues q
        WHERE q.id = m.queue_id AND q.tenant = p_tenant
          AND (p_queue IS NULL OR q.name = p_queue)
          AND m.consumer_group = p_group;
        GET DIAGNOSTICS v_meta = ROW_COUNT;
    END IF;

    PERFORM 1
    FROM queen.log_consumers c
    JOIN queen.log_partitions lp ON lp.id = c.partition_id
    JOIN queen.queues q ON q.id = lp.queue_id
    WHERE q.tenant = p_tenant AND (p_queue IS NULL OR q.name = p_queue)
      AND c.consumer_group = p_group
    ORDER BY c.partition_id
    FOR UPDATE OF c;

    DELETE FROM queen.log_consumers c
    USING queen.log_partitions lp, queen.queues q
    WHERE lp.id = c.partition_id AND q.id = lp.queue_id AND q.tenant = p_tenant
      AND (p_queue IS NULL OR q.name = p_queue)
      AND c.consumer_group = p_group;
    GET DIAGNOSTICS v_cursors = ROW_COUNT;

    RETURN QUERY SELECT v_cursors, v_meta;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- group_subscription_v1: the group now starts at p_from ('timestamp' mode) on one queue
-- (p_queue) or on every queue it has a subscription record for (NULL).
--   1. consumer_groups_meta: with p_queue the record is upserted (so a subscription set before
--      the group's first pop is the start that pop finds); without, every existing record of
--      the group is updated. subscription_mode := 'timestamp', subscription_from := p_from.
--   2. log_consumers of those queues that the group has not consumed from yet
--      (total_consumed = 0 and no live lease): committed_offset := log_cursor_before_v1(p_from);
--      an expired lease there is released and the retry state reset (its batch is gone).
--      A record this call creates is not started (consumer_groups_meta.started): the group's
--      next pop creates its cursor rows from p_from (group_start_v1).
--   queues_found  1/0 for p_queue (0 = unknown queue, nothing done); with NULL the number of
--                 queues the group has records for
--   meta_rows     records inserted or updated; cursor_rows: cursor rows moved (also those whose
--                 value did not change)
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.group_subscription_v1(p_tenant uuid, p_group text, p_queue text,
                                            p_from timestamptz)
RETURNS TABLE (queues_found int8, meta_rows int8, cursor_rows int8)
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_now     timestamptz := now();
    v_qids    int8[];
    v_meta    int8 := 0;
    v_cursors int8 := 0;
BEGIN
    IF p_group IS NULL OR p_from IS NULL THEN
        RAISE EXCEPTION 'group_subscription_v1: group name and start time required'
            USING ERRCODE = '22023';
    END IF;

    IF p_queue IS NOT NULL THEN
        SELECT array_agg(q.id) INTO v_qids
        FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
        IF v_qids IS NULL THEN
            RETURN QUERY SELECT 0::int8, 0::int8, 0::int8;
            RETURN;
        END IF;
        -- The queue row before the record (a first pop holds it FOR UPDATE while it records
        -- and starts the group: waiting here, not inside the upsert, keeps that acyclic).
        PERFORM 1 FROM queen.queues q WHERE q.id = v_qids[1] FOR KEY SHARE;
        INSERT INTO queen.consumer_groups_meta AS m (queue_id, consumer_group,
                                                     subscription_mode, subscription_from)
        VALUES (v_qids[1], p_group, 'timestamp', p_from)
        ON CONFLICT (queue_id, consumer_group) DO UPDATE
            SET subscription_mode = 'timestamp', subscription_from = EXCLUDED.subscription_from,
                updated_at = v_now;
        GET DIAGNOSTICS v_meta = ROW_COUNT;
    ELSE
        SELECT array_agg(s.queue_id ORDER BY s.queue_id) INTO v_qids
        FROM (SELECT m.queue_id
              FROM queen.consumer_groups_meta m
              JOIN queen.queues q ON q.id = m.queue_id
              WHERE q.tenant = p_tenant AND m.consumer_group = p_group
              ORDER BY m.queue_id
              FOR UPDATE OF m) s;
        IF v_qids IS NULL THEN
            RETURN QUERY SELECT 0::int8, 0::int8, 0::int8;
            RETURN;
        END IF;
        UPDATE queen.consumer_groups_meta m
        SET subscription_mode = 'timestamp', subscription_from = p_from, updated_at = v_now
        WHERE m.queue_id = ANY (v_qids) AND m.consumer_group = p_group;
        GET DIAGNOSTICS v_meta = ROW_COUNT;
    END IF;

    -- FOR UPDATE re-checks the condition on the row version it locks (READ COMMITTED), so a
    -- cursor that a concurrent pop claims first is left alone.
    PERFORM 1
    FROM queen.log_consumers c
    JOIN queen.log_partitions lp ON lp.id = c.partition_id
    WHERE lp.queue_id = ANY (v_qids) AND c.consumer_group = p_group
      AND c.total_consumed = 0
      AND NOT (c.lease_id IS NOT NULL AND c.lease_expires_at > v_now)
    ORDER BY c.partition_id
    FOR UPDATE OF c;

    UPDATE queen.log_consumers c
    SET committed_offset = t.committed,
        ready_at = queen.log_ready_at_v1(t.id, t.committed, NULL, NULL),
        released_lease_id = COALESCE(c.lease_id, c.released_lease_id),
        lease_id = NULL, worker_id = NULL, lease_expires_at = NULL,
        attempt_count = 0, batch_retry_count = 0
    FROM (SELECT lp.id, queen.log_cursor_before_v1(lp.id, p_from) AS committed
          FROM queen.log_partitions lp
          WHERE lp.queue_id = ANY (v_qids)
          OFFSET 0) t
    WHERE t.id = c.partition_id
      AND c.consumer_group = p_group
      AND c.total_consumed = 0
      AND NOT (c.lease_id IS NOT NULL AND c.lease_expires_at > v_now);
    GET DIAGNOSTICS v_cursors = ROW_COUNT;

    RETURN QUERY SELECT cardinality(v_qids)::int8, v_meta, v_cursors;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- group_seek_v1: every partition of the queue, its cursor row created if missing:
--   'beginning'  committed_offset := log_start_offset - 1 (the next delivery is the log start)
--   'end'        committed_offset := last_offset (only messages pushed later are delivered)
--   'timestamp'  committed_offset := log_cursor_before_v1(p_from): the next delivery is the
--                first message created at or after p_from
-- The only way a cursor moves back. The group's leases there are released (see the header)
-- and retry state reset; total_consumed and last_consumed_at are kept.
-- Returns the number of cursor rows set (= partitions of the queue), NULL for an unknown queue.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.group_seek_v1(p_tenant uuid, p_group text, p_queue text, p_target text,
                                    p_from timestamptz)
RETURNS int8
LANGUAGE plpgsql VOLATILE
AS $$
#variable_conflict use_column
DECLARE
    v_qid int8;
    v_n   int8;
BEGIN
    IF p_group IS NULL THEN
        RAISE EXCEPTION 'group_seek_v1: group name required' USING ERRCODE = '22023';
    END IF;
    IF p_target IS NULL OR p_target NOT IN ('beginning', 'end', 'timestamp')
            OR (p_target = 'timestamp' AND p_from IS NULL) THEN
        RAISE EXCEPTION 'group_seek_v1: bad target % (time %)', p_target, p_from
            USING ERRCODE = '22023';
    END IF;

    -- KEY SHARE of the queue row: its partitions (and so the cursor rows made below) cannot
    -- be deleted before this commits (schema/007_cursors_cascade.sql).
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue
    FOR KEY SHARE;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    -- 1. Missing cursor rows, ascending partition id, before any existing row is locked. A
    --    new row is invisible to others until commit, so only a concurrent insert of the same
    --    key (a pop's, also ascending) can wait on it. Flagged ready until 2. sets the cursor
    --    (a flag while caught up is allowed, NULL needs log_ready_at_v1's lock).
    INSERT INTO queen.log_consumers AS c (partition_id, consumer_group, queue_id, ready_at)
    SELECT lp.id, p_group, v_qid, clock_timestamp()
    FROM queen.log_partitions lp
    WHERE lp.queue_id = v_qid
    ORDER BY lp.id
    ON CONFLICT (partition_id, consumer_group) DO NOTHING;

    -- 2. Every cursor row of the group on the queue, locked ascending, then set. The target is
    --    computed from the partition as the UPDATE sees it; the partition row is not locked.
    PERFORM 1
    FROM queen.log_consumers c
    JOIN queen.log_partitions lp ON lp.id = c.partition_id
    WHERE lp.queue_id = v_qid AND c.consumer_group = p_group
    ORDER BY c.partition_id
    FOR UPDATE OF c;

    UPDATE queen.log_consumers c
    SET committed_offset = t.committed,
        ready_at = queen.log_ready_at_v1(t.id, t.committed, NULL, NULL),
        released_lease_id = COALESCE(c.lease_id, c.released_lease_id),
        lease_id = NULL, worker_id = NULL, lease_expires_at = NULL,
        attempt_count = 0, batch_retry_count = 0
    FROM (SELECT lp.id,
                 CASE p_target
                     WHEN 'beginning' THEN lp.log_start_offset - 1
                     WHEN 'end' THEN lp.last_offset
                     ELSE queen.log_cursor_before_v1(lp.id, p_from)
                 END AS committed
          FROM queen.log_partitions lp
          WHERE lp.queue_id = v_qid
          OFFSET 0) t
    WHERE t.id = c.partition_id AND c.consumer_group = p_group;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- group_start_v1: the cursor rows of a group's start on some queues, one per partition, at the
-- group's recorded start (consumer_groups_meta: NULL time = the log start, else the first
-- message created at or after it), with ready_at set where something is pending. The ready
-- index lists cursor rows only, so a started group must have one on every partition of its
-- queue; partitions created later get theirs from log_partitions_cursors (triggers.sql). The
-- caller marks the records started. Existing rows are left as they are. Returns the number of
-- rows created.
-- Locks: the queues rows FOR UPDATE, ascending (see the header), then the new rows, ascending
-- partition id. No ON CONFLICT (speculative insertion was a third of the insert at 5,000
-- partitions): every other writer of a new cursor row holds its queue row FOR KEY SHARE (a
-- partition's creation, the seek, an ack's lease-less first touch) or FOR UPDATE (the repair),
-- which the FOR UPDATE here excludes, and NOT EXISTS reads after it was granted.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.group_start_v1(p_queue_ids int8[], p_group text)
RETURNS int8
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_n int8;
BEGIN
    PERFORM 1 FROM queen.queues q WHERE q.id = ANY (p_queue_ids) ORDER BY q.id FOR UPDATE;

    INSERT INTO queen.log_consumers AS c (partition_id, consumer_group, committed_offset,
                                          queue_id, ready_at)
    SELECT s.id, p_group, s.start_c, s.queue_id,
           CASE WHEN GREATEST(s.start_c + 1, s.log_start_offset) <= s.last_offset
                THEN COALESCE(
                    -- log_pending_at_v1, written out: a function call a row costs more
                    (SELECT seg.created_at FROM queen.log_segments seg
                     WHERE seg.partition_id = s.id
                       AND seg.base_offset <= GREATEST(s.start_c + 1, s.log_start_offset)
                     ORDER BY seg.base_offset DESC LIMIT 1),
                    clock_timestamp())
                -- caught up in this snapshot: NULL only under the partition's FOR SHARE
                ELSE queen.log_ready_at_v1(s.id, s.start_c, NULL, NULL) END
    FROM (
        SELECT lp.id, lp.queue_id, lp.last_offset, lp.log_start_offset,
               CASE WHEN m.subscription_from IS NULL THEN lp.log_start_offset - 1
                    ELSE queen.log_cursor_before_v1(lp.id, m.subscription_from) END AS start_c
        FROM queen.consumer_groups_meta m
        JOIN queen.log_partitions lp ON lp.queue_id = m.queue_id
        -- lp's own condition too: the planner does not carry m's ANY over the join, and
        -- without it may read every partition of the database (a hash join after ANALYZE)
        WHERE m.queue_id = ANY (p_queue_ids) AND lp.queue_id = ANY (p_queue_ids)
          AND m.consumer_group = p_group
          -- a probe by both keys (OFFSET 0: a subplan per partition, never an anti-join), as
          -- in log_ready_repair_v3: planned with statistics ANALYZE took while the table held
          -- few cursors, the anti-join read the group's cursors by log_consumers_group_idx on
          -- the group alone for every partition (a queue mode start on 5,000 partitions beside
          -- another queue's 50,000 cursors of that group: 7.5 s, 0.06 s as a probe;
          -- bench/partitions.py's drain, issue 26)
          AND NOT EXISTS (SELECT 1 FROM queen.log_consumers x
                          WHERE x.partition_id = lp.id AND x.consumer_group = p_group
                          OFFSET 0)
        OFFSET 0
    ) s
    ORDER BY s.id;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- log_ready_repair_v3: what the ready index needs and a broker of an older build (or a bug)
-- left out, on the partitions with ids in (p_after, the p_limit-th id after it] (NULL limit:
-- every partition after p_after): (1) `started` on records whose group has cursors (an older
-- build's pops created them one by one) on the slice; (2) the cursor rows of started groups
-- on a queue where a partition of the slice has none (group_start_v1, at the recorded start);
-- (3) queue_id where it is NULL; (4) ready_at on cursors that have something pending but no
-- flag. It only ever adds rows and flags, so it is safe beside running pops, pushes and acks.
-- repaired = the number of rows created or set: 0 when the writers kept everything true
-- (housekeeping logs anything else); next_after = the slice's last id, or 0 once the slice
-- reached the last partition (the next sweep starts over).
--
-- Why slices (issue 26): housekeeping ran the whole repair every round, a join of every cursor
-- with its partition and an anti-join of every started queue's partitions with its cursors:
-- at 50,000 partitions 1,800 buffers and 15-37 ms a round on an idle broker, 50-350 ms under
-- a drain (pg_stat_statements), every 5 s, beside the pops on the same CPUs. A round now reads
-- a bounded number of partitions whatever the table holds (5,000: 270 buffers and 5 ms a
-- round there); the whole table is swept in partitions / slice rounds.
-- Revision (issue 26, pop15): log_ready_repair_v3 replaces log_ready_repair_v2 (same arguments,
-- rows and effects). (2)'s test "no cursor of this started group on this partition" is a
-- probe by both keys (OFFSET 0: a subplan per partition, not an anti-join). As an anti-join on
-- tables no ANALYZE had seen yet (a queue of 5,000 partitions filled and drained within a
-- minute, bench/partitions.py) the planner took the group's cursors by log_consumers_group_idx
-- on the group alone and the partition as a join filter: every cursor of the group for each
-- partition of the slice, 12.5M rows, 1.5 s of CPU a round at 5,000 partitions (auto_explain:
-- 380,549 buffers). Now 11-14 ms a round there (backend CPU, before and after 2,500 drained);
-- the housekeeping backend took 600-760 us of PostgreSQL's CPU per drain pop beside the
-- pop's own 460-600 (bench.partitions' drain of 5,000, /proc by process).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_ready_repair_v3(p_after int8, p_limit int4)
RETURNS TABLE (repaired int8, next_after int8)
LANGUAGE plpgsql VOLATILE
-- a seq scan under the slice's range filter still reads the whole table: every statement
-- here walks primary key ranges, whatever the statistics say
SET enable_seqscan = off
AS $$
DECLARE
    v_total int8 := 0;
    v_n     int8;
    v_upto  int8;           -- the slice is (p_after, v_upto]
    v_full  boolean;        -- p_limit partitions were found: there may be more after v_upto
    r       record;
BEGIN
    SELECT max(s.id), count(*) = p_limit INTO v_upto, v_full
    FROM (SELECT lp.id FROM queen.log_partitions lp
          WHERE lp.id > p_after ORDER BY lp.id LIMIT p_limit) s;
    IF v_upto IS NULL THEN
        RETURN QUERY SELECT 0::int8, 0::int8;
        RETURN;
    END IF;

    -- (1) and (2), one record at a time, its queue row first (the lock order of the header).
    -- Every read of the two big tables carries the slice's id range: whatever join the planner
    -- picks, it reads the slice (a not-started record's test without it was a hash of EVERY
    -- cursor, 33 of a slice's 48 ms at 50,000 partitions; auto_explain).
    -- The slice's partitions and cursors are read first, each by its primary key range behind
    -- OFFSET 0, so no join order can reach them through another key: driven by a started
    -- group's record, the partitions were read through (queue_id, name), every partition of
    -- the queue (test_ready_index: 5,356 rows in a clean-clone run, the slice is 100).
    FOR r IN
        SELECT m.queue_id, m.consumer_group
        FROM queen.consumer_groups_meta m
        WHERE NOT m.started
          AND EXISTS (SELECT 1
                      FROM (SELECT c.consumer_group, c.queue_id, c.partition_id
                            FROM queen.log_consumers c
                            WHERE c.partition_id > p_after AND c.partition_id <= v_upto
                            OFFSET 0) c
                      WHERE c.consumer_group = m.consumer_group
                        AND (c.queue_id = m.queue_id
                             OR (c.queue_id IS NULL  -- an older build's row: (3) below
                                 AND EXISTS (SELECT 1 FROM queen.log_partitions lp
                                             WHERE lp.id = c.partition_id
                                               AND lp.queue_id = m.queue_id))))
        UNION
        SELECT lp.queue_id, g.consumer_group
        FROM (SELECT p.id, p.queue_id FROM queen.log_partitions p
              WHERE p.id > p_after AND p.id <= v_upto
              OFFSET 0) lp
        JOIN queen.consumer_groups_meta g ON g.queue_id = lp.queue_id AND g.started
        WHERE NOT EXISTS (SELECT 1 FROM queen.log_consumers c
                          WHERE c.partition_id = lp.id AND c.consumer_group = g.consumer_group
                          OFFSET 0)  -- a probe by both keys (the revision above)
        ORDER BY 1, 2
    LOOP
        PERFORM 1 FROM queen.queues q WHERE q.id = r.queue_id FOR UPDATE;
        UPDATE queen.consumer_groups_meta m SET started = true
        WHERE m.queue_id = r.queue_id AND m.consumer_group = r.consumer_group
          AND NOT m.started
          AND EXISTS (SELECT 1
                      FROM queen.log_partitions lp
                      JOIN queen.log_consumers c ON c.partition_id = lp.id
                      WHERE lp.queue_id = m.queue_id AND c.consumer_group = m.consumer_group);
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_total := v_total + v_n;
        IF EXISTS (SELECT 1 FROM queen.consumer_groups_meta m
                   WHERE m.queue_id = r.queue_id AND m.consumer_group = r.consumer_group
                     AND m.started) THEN
            v_total := v_total + queen.group_start_v1(ARRAY[r.queue_id], r.consumer_group);
        END IF;
    END LOOP;

    -- (3) and (4): the slice's cursors, a primary key range of both tables
    UPDATE queen.log_consumers c
    SET queue_id = lp.queue_id,
        ready_at = CASE WHEN c.ready_at IS NULL
                         AND GREATEST(c.committed_offset + 1, lp.log_start_offset)
                             <= lp.last_offset
                        THEN COALESCE(queen.log_pending_at_v1(
                                          c.partition_id,
                                          GREATEST(c.committed_offset + 1, lp.log_start_offset)),
                                      clock_timestamp())
                        ELSE c.ready_at END
    FROM queen.log_partitions lp
    WHERE lp.id = c.partition_id
      AND c.partition_id > p_after AND c.partition_id <= v_upto
      AND lp.id > p_after AND lp.id <= v_upto
      AND (c.queue_id IS NULL
           OR (c.ready_at IS NULL
               AND GREATEST(c.committed_offset + 1, lp.log_start_offset) <= lp.last_offset));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN QUERY SELECT v_total + v_n, CASE WHEN v_full THEN v_upto ELSE 0 END;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- log_ready_repair_v1: log_ready_repair_v3 on every partition at once (the function families'
-- repair, in the transaction that installs the triggers).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_ready_repair_v1()
RETURNS int8
LANGUAGE sql VOLATILE
AS $$
    SELECT r.repaired FROM queen.log_ready_repair_v3(0, NULL) r
$$;
