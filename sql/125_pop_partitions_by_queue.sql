-- 125_pop_partitions_by_queue.sql: a pop reads its own queue's partition rows by index, whatever
-- the planner's statistics say.
--
-- Functions: queen.log_pop_v1(...) replaced (same signature, result, locks, lock order and
-- SQLSTATEs as in 120_pop_by_queue.sql; three statements are written differently, and the
-- function runs with enable_seqscan = off).
--
-- Why: 120 joined queen.log_partitions on queue_id in the cursor insert, the candidate query and
-- the "nothing claimable: when does a lease expire" query. The planner cannot know which queue
-- the scope's name resolves to, so once ANALYZE or VACUUM has seen queues of very different
-- sizes (autovacuum does that in production; in the benchmark suite, after its push section
-- left 1,000 partitions in one queue) it joins a scan of EVERY queue's partitions: a sequential
-- scan after ANALYZE, a full index scan once the sequential one is disabled. Each queue's
-- partitions are now a LATERAL subquery on (queue_id = the queue) that OFFSET 0 keeps the
-- planner from flattening back into a join, and enable_seqscan = off leaves the
-- (queue_id, name) index as its only sensible path: the cost follows the queue's own
-- partitions again, as 120 did for the cursors; the cursor insert's "no cursor yet" test is a
-- LATERAL primary-key probe too (an anti-join over the index scan of the group's cursors on
-- every queue read them all once sequential scans were off). No statement of the pop needs a sequential
-- scan: every table it reads is reached by a key (queues, consumer_groups_meta,
-- log_partitions, log_consumers, log_segments, system_settings).

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

    -- Cursor rows for partitions with data that this group has never seen, created at the
    -- group's start point; ascending partition id (see the header's lock order).
    INSERT INTO queen.log_consumers AS c (partition_id, consumer_group, committed_offset)
    SELECT lp.id, p_group, queen.log_cursor_before_v1(lp.id, pq.sub_from)
    FROM queen.pop_scope_v1(p_tenant, p_queue, p_namespace, p_task, p_group) pq
    CROSS JOIN LATERAL (
        SELECT lp.id FROM queen.log_partitions lp
        WHERE lp.queue_id = pq.id AND (p_partition IS NULL OR lp.name = p_partition)
          AND lp.last_offset > 0
        OFFSET 0) lp
    LEFT JOIN LATERAL (
        SELECT true AS found FROM queen.log_consumers c2
        WHERE c2.partition_id = lp.id AND c2.consumer_group = p_group
        OFFSET 0) c2 ON true
    WHERE c2.found IS NULL
    ORDER BY lp.id
    ON CONFLICT (partition_id, consumer_group) DO NOTHING;

    -- Candidates: pending data, not leased, outside the window buffer; highest priority first,
    -- then the oldest pending message first.
    -- PERF(queen): one primary-key probe per candidate for its next message's created_at; a
    -- queue with very many pending partitions pays it per pop.
    FOR v_cand IN
        SELECT lp.id AS pid, lp.name AS pname, lp.last_offset, lp.log_start_offset,
               lp.last_created_at, pq.id AS qid, pq.name AS qname, pq.lease_time,
               pq.delayed, pq.window_s, pq.encrypted, c.committed_offset
        FROM queen.pop_scope_v1(p_tenant, p_queue, p_namespace, p_task, p_group) pq
        CROSS JOIN LATERAL (
            SELECT lp.id, lp.name, lp.last_offset, lp.log_start_offset, lp.last_created_at
            FROM queen.log_partitions lp
            WHERE lp.queue_id = pq.id AND (p_partition IS NULL OR lp.name = p_partition)
            OFFSET 0) lp
        CROSS JOIN LATERAL (
            SELECT c.committed_offset
            FROM queen.log_consumers c
            WHERE c.partition_id = lp.id AND c.consumer_group = p_group
              AND lp.last_offset > c.committed_offset
              AND (c.lease_id IS NULL OR c.lease_expires_at <= v_now)
            OFFSET 0) c
        ORDER BY pq.priority DESC,
                 (SELECT s.created_at FROM queen.log_segments s
                  WHERE s.partition_id = lp.id
                    AND s.base_offset <= GREATEST(c.committed_offset + 1, lp.log_start_offset)
                  ORDER BY s.base_offset DESC LIMIT 1) ASC NULLS FIRST,
                 lp.id
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

        v_attempt := CASE WHEN v_cur.batch_start = v_start AND v_cur.attempt_count > 0
                          THEN v_cur.attempt_count + 1 ELSE 1 END;
        IF p_auto_ack THEN
            v_expires := NULL;
            UPDATE queen.log_consumers c
            SET committed_offset = v_end,
                total_consumed = c.total_consumed + (v_end - v_cur.committed_offset),
                last_consumed_at = v_now, last_popped_at = v_now,
                attempt_count = 0, batch_retry_count = 0
            WHERE c.partition_id = v_cand.pid AND c.consumer_group = p_group;
        ELSE
            v_expires := v_now + make_interval(secs => v_cand.lease_time);
            UPDATE queen.log_consumers c
            SET lease_id = p_lease_id, worker_id = p_lease_id::text,
                lease_expires_at = v_expires, leased_at = v_now, last_popped_at = v_now,
                batch_start = v_start, batch_end = v_end, attempt_count = v_attempt
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

