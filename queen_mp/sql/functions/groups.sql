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
--   Calls queen.log_cursor_before_v1 (pop.sql).
--
-- Tables touched:
--   queen.queues                read only (tenant, name -> id)
--   queen.log_partitions        read only (last_offset, log_start_offset); see lock order
--   queen.log_segments          read only (created_at of the first unconsumed message; the
--                               segment at or after a time, through log_cursor_before_v1)
--   queen.log_consumers         read; DELETE (group_delete_v1); UPDATE cursor/lease/retry
--                               columns (subscription, seek); INSERT missing rows (seek)
--   queen.consumer_groups_meta  read; DELETE (group_delete_v1); INSERT/UPDATE (subscription)
--
-- Lock order (design.md invariant 4; the same as log_pop_v1 in pop.sql, which records
--   the group's consumer_groups_meta row before it creates or locks any cursor row):
--   1. consumer_groups_meta rows ascending by queue_id (only one consumer_group per call);
--   2. log_consumers rows ascending by (partition_id, consumer_group): taken by one
--      SELECT ... ORDER BY partition_id FOR UPDATE before the DELETE / UPDATE that changes
--      them. group_seek_v1 first inserts the missing rows (ascending, ON CONFLICT DO NOTHING,
--      as log_pop_v1 does), then locks all of them.
--   No log_partitions or queues row is locked explicitly. The only locks on them are the
--   FOR KEY SHARE locks of foreign key checks: seek's cursor inserts (-> log_partitions) and
--   subscription's record upsert (-> queues). Both run before this transaction holds any
--   existing consumer row, so a push holding its partition row (which never waits for a
--   consumer row) delays them at worst; UPDATE and DELETE of these rows take no such lock.
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
-- lease_expires_at := NULL. Resetting retry state: attempt_count, batch_retry_count := 0.

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
--      Partitions without a cursor row get their start from the record at their first pop.
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
    SET committed_offset = queen.log_cursor_before_v1(lp.id, p_from),
        released_lease_id = COALESCE(c.lease_id, c.released_lease_id),
        lease_id = NULL, worker_id = NULL, lease_expires_at = NULL,
        attempt_count = 0, batch_retry_count = 0
    FROM queen.log_partitions lp
    WHERE lp.id = c.partition_id AND lp.queue_id = ANY (v_qids)
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

    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;

    -- 1. Missing cursor rows, ascending partition id, before any existing row is locked: the
    --    foreign key check of each insert takes FOR KEY SHARE on its log_partitions row, and
    --    no consumer row of another transaction may be held while waiting for that. A new row
    --    is invisible to others until commit, so only a concurrent insert of the same key (a
    --    pop's, also ascending) can wait on it.
    INSERT INTO queen.log_consumers AS c (partition_id, consumer_group)
    SELECT lp.id, p_group
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
    SET committed_offset = CASE p_target
                               WHEN 'beginning' THEN lp.log_start_offset - 1
                               WHEN 'end' THEN lp.last_offset
                               ELSE queen.log_cursor_before_v1(lp.id, p_from)
                           END,
        released_lease_id = COALESCE(c.lease_id, c.released_lease_id),
        lease_id = NULL, worker_id = NULL, lease_expires_at = NULL,
        attempt_count = 0, batch_retry_count = 0
    FROM queen.log_partitions lp
    WHERE lp.id = c.partition_id AND lp.queue_id = v_qid AND c.consumer_group = p_group;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
