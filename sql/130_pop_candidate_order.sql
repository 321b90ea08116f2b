-- 130_pop_candidate_order.sql: a pop orders its candidates without reading a segment per
-- partition, and creates missing cursor rows in the statement that finds its candidates.
--
-- Tables: queen.log_consumers gains next_offset and next_created_at (both NULL until a claim).
-- Functions: queen.log_pop_v1(...) replaced (same signature, result, locks, lock order and
-- SQLSTATEs as in 125_pop_partitions_by_queue.sql).
--
-- Why: every pop of a queue ran two passes over all of the queue's partitions: the cursor
-- insert probed each partition's cursor to find the missing ones, and the candidate query
-- probed it again, then read one log_segments row per candidate for the created_at of its
-- oldest pending message (the order api.md 2.2 promises). On a 100-partition queue drained
-- by 8 consumers (pg_stat_statements, private cluster) that was 0.44 ms of insert and 1.68 ms
-- of candidate query in a 3.8 ms pop; EXPLAIN ANALYZE put 1.0 ms of the candidate query in
-- the segment reads.
--
-- The oldest pending message of a cursor is the one at committed_offset + 1, unless retention
-- removed it (then log_start_offset). A claim of [start, end] now records the created_at of
-- the segment holding end + 1 (next_created_at at next_offset): a partition's offsets are
-- never reused and a stored segment never changes, so that pair stays true for as long as it
-- exists. Once the claim is acked, committed_offset + 1 = next_offset and the candidate query
-- takes the time from the cursor row it reads anyway; any other move of the cursor (a partial
-- ack, a lease expiry, a seek, a DLQ hand-off, retention) leaves them unequal and the segment
-- is read as before, as it is when the claim reached the partition's end (nothing to record).
-- No writer of committed_offset has to know about the two columns.
--
-- The missing cursor rows come from the candidate scan's own LEFT JOIN: a data-modifying
-- WITH inserts them (ascending partition id, before any cursor is locked or updated, as
-- before), and a plpgsql FOR loop runs such a statement to completion before its first row.
-- A candidate whose row another pop created meanwhile is locked by the loop as usual.

ALTER TABLE queen.log_consumers
    ADD COLUMN IF NOT EXISTS next_offset int8,
    ADD COLUMN IF NOT EXISTS next_created_at timestamptz;

COMMENT ON COLUMN queen.log_consumers.next_offset IS
    'The offset after the last claim of this cursor (sql/130_pop_candidate_order.sql).';
COMMENT ON COLUMN queen.log_consumers.next_created_at IS
    'created_at of the segment holding next_offset; NULL when the claim reached the end.';

CREATE OR REPLACE FUNCTION queen.log_pop_v1(
    p_tenant         uuid,
    p_queue          text,
    p_partition      text,
    p_namespace      text,
    p_task           text,
    p_group          text,
    p_batch          int4,
    p_max_partitions int4,
    p_auto_ack       boolean,
    p_sub_mode       text,
    p_sub_from       timestamptz,
    p_lease_id       uuid,
    p_claim_ms       int4
) RETURNS TABLE (
    queue_name       text,
    partition_id     int8,
    partition_name   text,
    start_off        int8,
    end_off          int8,
    attempt          int4,
    lease_expires_at timestamptz,
    encrypted        boolean,
    base_offset      int8,
    created_at       timestamptz,
    payload          bytea,
    wake_in_ms       int8
)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_now        timestamptz := now();
    v_until      timestamptz := clock_timestamp() + make_interval(secs => p_claim_ms / 1000.0);
    v_left       int4 := p_batch;
    v_claimed    int4 := 0;
    v_queue_id   int8;          -- a discovery pop serves one queue per answer
    v_wake       timestamptz;
    v_cand       record;
    v_cur        record;
    v_start      int8;
    v_end        int8;
    v_cut        int8;
    v_attempt    int4;
    v_expires    timestamptz;
    v_next_at    timestamptz;   -- created_at of the segment holding v_end + 1
    v_pids       int8[] := '{}';
    v_starts     int8[] := '{}';
    v_ends       int8[] := '{}';
    v_attempts   int4[] := '{}';
    v_expiries   timestamptz[] := '{}';
BEGIN
    IF p_batch IS NULL OR p_batch < 1 OR p_max_partitions IS NULL OR p_max_partitions < 1 THEN
        RAISE EXCEPTION 'log_pop_v1: batch and max_partitions must be >= 1'
            USING ERRCODE = '22023';
    END IF;
    IF p_sub_mode NOT IN ('all', 'new', 'new-only', 'timestamp') THEN
        RAISE EXCEPTION 'log_pop_v1: unknown subscription mode %', p_sub_mode
            USING ERRCODE = '22023';
    END IF;
    IF p_queue IS NULL AND p_namespace IS NULL AND p_task IS NULL THEN
        RAISE EXCEPTION 'log_pop_v1: a queue, a namespace or a task is required'
            USING ERRCODE = '22023';
    END IF;

    -- Pop maintenance (api.md 5): pops claim nothing, and learn of no wake-up time.
    IF EXISTS (SELECT 1 FROM queen.system_settings ss
               WHERE ss.key = 'pop_maintenance_mode' AND ss.value = 'true'::jsonb) THEN
        RETURN QUERY SELECT NULL::text, NULL::int8, NULL::text, NULL::int8, NULL::int8,
            NULL::int4, NULL::timestamptz, NULL::boolean, NULL::int8, NULL::timestamptz,
            NULL::bytea, NULL::int8;
        RETURN;
    END IF;

    -- The group's first start on every matching queue, recorded once.
    INSERT INTO queen.consumer_groups_meta AS m (queue_id, consumer_group, subscription_mode,
                                                 subscription_from)
    SELECT pq.id, p_group, p_sub_mode,
           CASE p_sub_mode WHEN 'all' THEN NULL
                           WHEN 'timestamp' THEN p_sub_from
                           ELSE COALESCE(p_sub_from, v_now) END
    FROM queen.pop_scope_v1(p_tenant, p_queue, p_namespace, p_task, p_group) pq
    WHERE pq.sub_mode IS NULL
    ORDER BY pq.id
    ON CONFLICT (queue_id, consumer_group) DO NOTHING;
    IF NOT FOUND AND NOT EXISTS (
            SELECT 1 FROM queen.pop_scope_v1(p_tenant, p_queue, p_namespace, p_task, p_group)) THEN
        RETURN QUERY SELECT NULL::text, NULL::int8, NULL::text, NULL::int8, NULL::int8,
            NULL::int4, NULL::timestamptz, NULL::boolean, NULL::int8, NULL::timestamptz,
            NULL::bytea, NULL::int8;
        RETURN;
    END IF;

    -- Candidates: pending data, not leased, outside the window buffer; highest priority first,
    -- then the oldest pending message first. Partitions with data that this group has never
    -- seen get their cursor row at the group's start point (ascending partition id, see the
    -- header's lock order) in the same statement, and are candidates too.
    FOR v_cand IN
        WITH cand AS MATERIALIZED (
            SELECT lp.id AS pid, lp.name AS pname, lp.last_offset, lp.log_start_offset,
                   lp.last_created_at, pq.id AS qid, pq.name AS qname, pq.priority,
                   pq.lease_time, pq.delayed, pq.window_s, pq.encrypted, pq.sub_from,
                   c.committed_offset, c.next_offset, c.next_created_at
            FROM queen.pop_scope_v1(p_tenant, p_queue, p_namespace, p_task, p_group) pq
            CROSS JOIN LATERAL (
                SELECT lp.id, lp.name, lp.last_offset, lp.log_start_offset, lp.last_created_at
                FROM queen.log_partitions lp
                WHERE lp.queue_id = pq.id AND (p_partition IS NULL OR lp.name = p_partition)
                OFFSET 0) lp
            LEFT JOIN LATERAL (
                SELECT c.committed_offset, c.lease_id, c.lease_expires_at, c.next_offset,
                       c.next_created_at
                FROM queen.log_consumers c
                WHERE c.partition_id = lp.id AND c.consumer_group = p_group
                OFFSET 0) c ON true
            WHERE CASE WHEN c.committed_offset IS NULL THEN lp.last_offset > 0
                       ELSE lp.last_offset > c.committed_offset
                            AND (c.lease_id IS NULL OR c.lease_expires_at <= v_now) END
        ), created AS (
            INSERT INTO queen.log_consumers AS c (partition_id, consumer_group, committed_offset)
            SELECT cand.pid, p_group, queen.log_cursor_before_v1(cand.pid, cand.sub_from)
            FROM cand
            WHERE cand.committed_offset IS NULL
            ORDER BY cand.pid
            ON CONFLICT (partition_id, consumer_group) DO NOTHING
            RETURNING c.partition_id, c.committed_offset
        )
        SELECT cand.pid, cand.pname, cand.last_offset, cand.log_start_offset,
               cand.last_created_at, cand.qid, cand.qname, cand.lease_time, cand.delayed,
               cand.window_s, cand.encrypted
        FROM cand
        LEFT JOIN created cr ON cr.partition_id = cand.pid
        ORDER BY cand.priority DESC,
                 CASE WHEN cand.next_created_at IS NOT NULL
                           AND cand.next_offset = GREATEST(cand.committed_offset + 1,
                                                           cand.log_start_offset)
                      THEN cand.next_created_at
                      ELSE (SELECT s.created_at FROM queen.log_segments s
                            WHERE s.partition_id = cand.pid
                              AND s.base_offset <= GREATEST(
                                    COALESCE(cand.committed_offset, cr.committed_offset) + 1,
                                    cand.log_start_offset)
                            ORDER BY s.base_offset DESC LIMIT 1) END ASC NULLS FIRST,
                 cand.pid
    LOOP
        EXIT WHEN v_claimed >= p_max_partitions OR v_left <= 0
               OR clock_timestamp() >= v_until;
        CONTINUE WHEN v_queue_id IS NOT NULL AND v_cand.qid <> v_queue_id;

        IF v_cand.window_s > 0 AND v_cand.last_created_at
                > v_now - make_interval(secs => v_cand.window_s) THEN
            v_wake := LEAST(v_wake, v_cand.last_created_at
                                    + make_interval(secs => v_cand.window_s));
            CONTINUE;
        END IF;

        SELECT c.committed_offset, c.lease_id, c.lease_expires_at, c.batch_start,
               c.attempt_count
        INTO v_cur
        FROM queen.log_consumers c
        WHERE c.partition_id = v_cand.pid AND c.consumer_group = p_group
        FOR UPDATE SKIP LOCKED;
        IF NOT FOUND THEN
            -- Another pop or an ack holds it right now: it may become claimable (or its
            -- delayed message mature) without a push, so look again soon.
            v_wake := LEAST(v_wake, clock_timestamp() + interval '50 milliseconds');
            CONTINUE;
        END IF;
        CONTINUE WHEN v_cur.lease_id IS NOT NULL AND v_cur.lease_expires_at > v_now;

        v_start := GREATEST(v_cur.committed_offset + 1, v_cand.log_start_offset);
        CONTINUE WHEN v_start > v_cand.last_offset;
        v_end := LEAST(v_cand.last_offset, v_start + v_left - 1);

        IF v_cand.delayed > 0 THEN
            SELECT s.base_offset + s.msg_count - 1 INTO v_cut
            FROM queen.log_segments s
            WHERE s.partition_id = v_cand.pid
              AND s.created_at <= v_now - make_interval(secs => v_cand.delayed)
            ORDER BY s.base_offset DESC
            LIMIT 1;
            IF v_cut IS NULL OR v_cut < v_start THEN
                v_wake := LEAST(v_wake, (
                    SELECT s.created_at + make_interval(secs => v_cand.delayed)
                    FROM queen.log_segments s
                    WHERE s.partition_id = v_cand.pid AND s.base_offset <= v_start
                    ORDER BY s.base_offset DESC LIMIT 1));
                CONTINUE;
            END IF;
            v_end := LEAST(v_end, v_cut);
        END IF;

        v_next_at := NULL;
        IF v_end < v_cand.last_offset THEN
            SELECT s.created_at INTO v_next_at
            FROM queen.log_segments s
            WHERE s.partition_id = v_cand.pid AND s.base_offset <= v_end + 1
            ORDER BY s.base_offset DESC
            LIMIT 1;
        END IF;
        v_attempt := CASE WHEN v_cur.batch_start = v_start AND v_cur.attempt_count > 0
                          THEN v_cur.attempt_count + 1 ELSE 1 END;
        IF p_auto_ack THEN
            v_expires := NULL;
            UPDATE queen.log_consumers c
            SET committed_offset = v_end,
                total_consumed = c.total_consumed + (v_end - v_cur.committed_offset),
                last_consumed_at = v_now, last_popped_at = v_now,
                attempt_count = 0, batch_retry_count = 0,
                next_offset = v_end + 1, next_created_at = v_next_at
            WHERE c.partition_id = v_cand.pid AND c.consumer_group = p_group;
        ELSE
            v_expires := v_now + make_interval(secs => v_cand.lease_time);
            UPDATE queen.log_consumers c
            SET lease_id = p_lease_id, worker_id = p_lease_id::text,
                lease_expires_at = v_expires, leased_at = v_now, last_popped_at = v_now,
                batch_start = v_start, batch_end = v_end, attempt_count = v_attempt,
                next_offset = v_end + 1, next_created_at = v_next_at
            WHERE c.partition_id = v_cand.pid AND c.consumer_group = p_group;
        END IF;

        v_queue_id := v_cand.qid;
        v_claimed := v_claimed + 1;
        v_left := v_left - (v_end - v_start + 1)::int4;
        v_pids := v_pids || v_cand.pid;
        v_starts := v_starts || v_start;
        v_ends := v_ends || v_end;
        v_attempts := v_attempts || v_attempt;
        v_expiries := v_expiries || v_expires;
    END LOOP;

    IF v_claimed = 0 THEN
        -- Nothing claimable: when does a leased partition with pending data free up?
        SELECT LEAST(v_wake, min(c.lease_expires_at)) INTO v_wake
        FROM queen.pop_scope_v1(p_tenant, p_queue, p_namespace, p_task, p_group) pq
        CROSS JOIN LATERAL (
            SELECT lp.id, lp.last_offset FROM queen.log_partitions lp
            WHERE lp.queue_id = pq.id AND (p_partition IS NULL OR lp.name = p_partition)
            OFFSET 0) lp
        CROSS JOIN LATERAL (
            SELECT c.lease_expires_at
            FROM queen.log_consumers c
            WHERE c.partition_id = lp.id AND c.consumer_group = p_group
              AND lp.last_offset > c.committed_offset
              AND c.lease_id IS NOT NULL AND c.lease_expires_at > v_now
            OFFSET 0) c;
        RETURN QUERY SELECT NULL::text, NULL::int8, NULL::text, NULL::int8, NULL::int8,
            NULL::int4, NULL::timestamptz, NULL::boolean, NULL::int8, NULL::timestamptz,
            NULL::bytea,
            CASE WHEN v_wake IS NOT NULL THEN GREATEST(0, ceil(extract(epoch FROM v_wake - clock_timestamp()) * 1000))::int8 END;
        RETURN;
    END IF;

    RETURN QUERY
    SELECT pq.name::text, cl.pid, lp.name::text, cl.s, cl.e, cl.a, cl.x, pq.encrypted,
           seg.base_offset, seg.created_at, seg.payload, NULL::int8
    FROM unnest(v_pids, v_starts, v_ends, v_attempts, v_expiries)
             WITH ORDINALITY AS cl(pid, s, e, a, x, n)
    JOIN queen.log_partitions lp ON lp.id = cl.pid
    JOIN queen.pop_scope_v1(p_tenant, p_queue, p_namespace, p_task, p_group) pq
        ON pq.id = lp.queue_id
    LEFT JOIN LATERAL (
        SELECT s.base_offset, s.created_at, s.payload
        FROM queen.log_segments s
        WHERE s.partition_id = cl.pid
          AND s.base_offset <= cl.e
          AND s.base_offset >= COALESCE(
                (SELECT max(s2.base_offset) FROM queen.log_segments s2
                 WHERE s2.partition_id = cl.pid AND s2.base_offset <= cl.s), cl.s)
    ) seg ON true
    ORDER BY cl.n, seg.base_offset;
END
$$;

