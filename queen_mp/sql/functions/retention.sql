-- retention.sql: housekeeping (api.md 4: retentionEnabled with retentionSeconds and
-- completedRetentionSeconds, maxWaitTimeSeconds, the transactionId sidecar's own clock; expired
-- leases).
--
-- Functions:
--   queen.retention_partitions_v2(int8, int4, int4, int4) -> SETOF int8
--       the next partitions (ascending id, one shard's share) that may have work
--   queen.retention_partition_v2(int8, int4) -> jsonb
--       one bounded step on one partition: old segments, old sidecar rows, log starts
--   queen.queue_evicted_v1(uuid, int8) -> int8
--       messages of the queue evicted after waiting longer than its maxWaitTimeSeconds
--   queen.lease_reclaim_v1(int4) -> int4
--   queen.queue_gauges_v1(int4) -> (gauge, queue_name, consumer_group, value): the per-queue
--       gauges of /metrics/prometheus, bounded to a cap (see its own header)
--   queen.dlq_depth_v1() -> (queue_name, depth): dead letters per queue, for the gauge
--       clears expired leases (the pop already treats them as free; this keeps the lease
--       index small and the consumer-group views honest)
--
-- Tables touched:
--   queen.queues          read (retention_enabled, retention_seconds,
--                         completed_retention_seconds, max_wait_time_seconds, dedup_window)
--   queen.log_partitions  SELECT ... FOR UPDATE of ONE row, UPDATE log_start_offset, txns_start
--   queen.log_consumers   read (cursors, live leases of the partition); UPDATE (lease_reclaim_v1,
--                         rows locked with SKIP LOCKED)
--   queen.log_segments    DELETE below the computed offset (primary key range, bounded)
--   queen.log_txns        DELETE below the computed offset (primary key range, bounded)
--   queen.message_traces  DELETE of the traces below the new log start (with their names, by
--                         cascade), when segments were deleted
--   queen.queue_evictions INSERT ... ON CONFLICT DO UPDATE (the evicted count of the queue)
--
-- Lock order (design.md invariant 4): retention_partition_v2 locks exactly one log_partitions
--   row and no consumer row (cursors and leases are read, not locked), so it cannot form a cycle
--   with pushes (partition rows ascending), acks (consumer rows only) or transactions; its
--   last lock is the queue's queue_evictions row, which nothing else locks before a partition
--   row.
--   lease_reclaim_v1 locks consumer rows only, SKIP LOCKED (never waits).
--
-- SQLSTATEs raised: none of its own.
--
-- What is deleted (api.md 4):
--   * only while retentionEnabled (as upstream's retention sweeps: a queue with retention
--     seconds and the switch off keeps everything; schema/018 switched it on for the queues
--     that had seconds before the switch was honoured):
--     - retentionSeconds > 0: segments whose created_at is older, consumed or not;
--     - completedRetentionSeconds > 0: segments older than that and at or below the cursor of
--       EVERY group of the partition (a partition nobody consumes keeps its segments);
--   * never a segment that reaches into a live lease's batch (retention never deletes inside
--     a live lease): the cut stays below the lowest live batch_start;
--   * log_txns rows older than GREATEST(dedupWindow, completedRetentionSeconds, 900 s), up to
--     the first row that is younger (the sidecar is a forward walk: created_at is monotone),
--     whatever retentionEnabled says: the sidecar's clock is deduplication's, not retention's
--     (upstream purges its dedup table for every queue too).
--   * maxWaitTimeSeconds > 0 (whatever retentionEnabled says, as upstream): segments whose
--     messages waited longer than that, consumed or not, like retentionSeconds with its own
--     clock; the messages among them that some group of the partition had not consumed yet
--     (above the lowest cursor; all of them when the partition has no cursor) are EVICTED:
--     counted in queen.queue_evictions (schema/004_reads.sql) and in the step's answer
--     ("evicted"), which housekeeping adds to queen_messages_evicted_total. Never inside a
--     live lease either: a leased message was delivered in time.
--   log_start_offset / txns_start move to the first offset still covered; a cursor left below
--   the log start resumes there (the pop reads GREATEST(committed + 1, log_start_offset)).
--   The traces of deleted messages go with them (whichever rule deleted them).

CREATE OR REPLACE FUNCTION queen.retention_partitions_v2(p_after int8, p_limit int4, p_shards int4,
                                              p_shard int4)
RETURNS SETOF int8
LANGUAGE sql STABLE
AS $$
    SELECT lp.id
    FROM queen.log_partitions lp
    JOIN queen.queues q ON q.id = lp.queue_id
    -- the two retention rules act only while the queue's switch is on (header)
    CROSS JOIN LATERAL (SELECT CASE WHEN q.retention_enabled THEN q.retention_seconds ELSE 0 END,
                               CASE WHEN q.retention_enabled THEN q.completed_retention_seconds
                                    ELSE 0 END) AS r(ret, done_ret)
    WHERE lp.id > p_after
      AND lp.id % p_shards = p_shard
      -- PERF(queen): one primary-key probe per partition: is its OLDEST row old enough?
      AND (EXISTS (SELECT 1 FROM queen.log_txns t
                   WHERE t.partition_id = lp.id AND t.base_offset = lp.txns_start
                     AND t.created_at < now() - make_interval(secs => GREATEST(
                         q.dedup_window, q.completed_retention_seconds, 900)))
           OR (GREATEST(r.ret, r.done_ret, q.max_wait_time_seconds) > 0
               AND EXISTS (SELECT 1 FROM queen.log_segments s
                           WHERE s.partition_id = lp.id AND s.base_offset = lp.log_start_offset
                             AND s.created_at < now() - make_interval(secs => LEAST(
                                 NULLIF(r.ret, 0),
                                 NULLIF(r.done_ret, 0),
                                 NULLIF(q.max_wait_time_seconds, 0))))))
    ORDER BY lp.id
    LIMIT p_limit
$$;

CREATE OR REPLACE FUNCTION queen.retention_partition_v2(p_pid int8, p_limit int4)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_now        timestamptz := now();
    v_ret        int4;
    v_done_ret   int4;
    v_wait       int4;
    v_queue_id   int8;
    v_kept_cut   int8;          -- the cut of the retention rules alone (no eviction)
    v_floor      int8;          -- the lowest cursor of the partition (0 without one)
    v_evicted    int8 := 0;
    v_txn_keep   int4;          -- the sidecar's age limit, s (header)
    v_last       int8;
    v_log_start  int8;
    v_txns_start int8;
    v_cut        int8;          -- segments with base_offset + msg_count - 1 <= v_cut may go
    v_txn_cut    int8;
    v_leased     int8;
    v_min_commit int8;
    v_groups     int4;
    v_segs       int4 := 0;
    v_txns       int4 := 0;
BEGIN
    SELECT CASE WHEN q.retention_enabled THEN q.retention_seconds ELSE 0 END,
           CASE WHEN q.retention_enabled THEN q.completed_retention_seconds ELSE 0 END,
           GREATEST(q.dedup_window, q.completed_retention_seconds, 900),
           q.max_wait_time_seconds, q.id,
           lp.last_offset, lp.log_start_offset, lp.txns_start
    INTO v_ret, v_done_ret, v_txn_keep, v_wait, v_queue_id, v_last, v_log_start, v_txns_start
    FROM queen.log_partitions lp
    JOIN queen.queues q ON q.id = lp.queue_id
    WHERE lp.id = p_pid
    FOR UPDATE OF lp;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('segments', 0, 'txns', 0, 'evicted', 0, 'gone', true);
    END IF;

    -- the lowest offset a live lease may still deliver: nothing at or above it goes
    SELECT min(c.batch_start) INTO v_leased
    FROM queen.log_consumers c
    WHERE c.partition_id = p_pid AND c.lease_id IS NOT NULL AND c.lease_expires_at > v_now;

    v_cut := 0;
    IF v_ret > 0 THEN
        SELECT COALESCE(max(s.base_offset + s.msg_count - 1), 0) INTO v_cut
        FROM (SELECT s.base_offset, s.msg_count FROM queen.log_segments s
              WHERE s.partition_id = p_pid AND s.base_offset >= v_log_start
                AND s.created_at < v_now - make_interval(secs => v_ret)
              ORDER BY s.base_offset LIMIT p_limit) s;
    END IF;
    IF v_done_ret > 0 THEN
        SELECT min(c.committed_offset), count(*) INTO v_min_commit, v_groups
        FROM queen.log_consumers c WHERE c.partition_id = p_pid;
        IF v_groups > 0 THEN
            SELECT GREATEST(v_cut, COALESCE(max(s.base_offset + s.msg_count - 1), 0)) INTO v_cut
            FROM (SELECT s.base_offset, s.msg_count FROM queen.log_segments s
                  WHERE s.partition_id = p_pid AND s.base_offset >= v_log_start
                    AND s.created_at < v_now - make_interval(secs => v_done_ret)
                    AND s.base_offset + s.msg_count - 1 <= v_min_commit
                  ORDER BY s.base_offset LIMIT p_limit) s;
        END IF;
    END IF;
    v_kept_cut := v_cut;
    IF v_wait > 0 THEN
        SELECT GREATEST(v_cut, COALESCE(max(s.base_offset + s.msg_count - 1), 0)) INTO v_cut
        FROM (SELECT s.base_offset, s.msg_count FROM queen.log_segments s
              WHERE s.partition_id = p_pid AND s.base_offset >= v_log_start
                AND s.created_at < v_now - make_interval(secs => v_wait)
              ORDER BY s.base_offset LIMIT p_limit) s;
    END IF;
    IF v_leased IS NOT NULL THEN
        v_cut := LEAST(v_cut, v_leased - 1);
    END IF;
    IF v_cut > v_kept_cut AND v_cut >= v_log_start THEN
        -- the offsets only the wait rule removes, above what every group has consumed
        SELECT COALESCE(min(c.committed_offset), 0) INTO v_floor
        FROM queen.log_consumers c WHERE c.partition_id = p_pid;
        v_evicted := GREATEST(v_cut - GREATEST(v_kept_cut, v_floor, v_log_start - 1), 0);
    END IF;
    IF v_cut >= v_log_start THEN
        WITH gone AS (
            DELETE FROM queen.log_segments s
            WHERE s.partition_id = p_pid AND s.base_offset >= v_log_start
              AND s.base_offset + s.msg_count - 1 <= v_cut
            RETURNING s.base_offset + s.msg_count AS next_off
        )
        SELECT count(*), COALESCE(max(next_off), v_log_start) INTO v_segs, v_log_start
        FROM gone;
        -- the traces of the messages that went (schema/003_traces.sql)
        DELETE FROM queen.message_traces t
        WHERE t.partition_id = p_pid AND t."offset" < v_log_start;
    END IF;

    -- the sidecar: its own clock, a forward walk from txns_start
    SELECT COALESCE(max(t.base_offset + t.msg_count - 1), 0) INTO v_txn_cut
    FROM (SELECT t.base_offset, t.msg_count FROM queen.log_txns t
          WHERE t.partition_id = p_pid AND t.base_offset >= v_txns_start
            AND t.created_at < v_now - make_interval(secs => v_txn_keep)
          ORDER BY t.base_offset LIMIT p_limit) t;
    IF v_txn_cut >= v_txns_start THEN
        WITH gone AS (
            DELETE FROM queen.log_txns t
            WHERE t.partition_id = p_pid AND t.base_offset >= v_txns_start
              AND t.base_offset + t.msg_count - 1 <= v_txn_cut
            RETURNING t.base_offset + t.msg_count AS next_off
        )
        SELECT count(*), COALESCE(max(next_off), v_txns_start) INTO v_txns, v_txns_start
        FROM gone;
    END IF;

    IF v_segs > 0 OR v_txns > 0 THEN
        UPDATE queen.log_partitions lp
        SET log_start_offset = GREATEST(lp.log_start_offset, v_log_start),
            txns_start = GREATEST(lp.txns_start, v_txns_start)
        WHERE lp.id = p_pid;
    END IF;
    IF v_evicted > 0 THEN
        INSERT INTO queen.queue_evictions AS e (queue_id, evicted, last_evicted_at)
        VALUES (v_queue_id, v_evicted, v_now)
        ON CONFLICT (queue_id) DO UPDATE
        SET evicted = e.evicted + EXCLUDED.evicted, last_evicted_at = EXCLUDED.last_evicted_at;
    END IF;
    RETURN jsonb_build_object('segments', v_segs, 'txns', v_txns, 'evicted', v_evicted,
                              'gone', false, 'more', v_segs >= p_limit OR v_txns >= p_limit);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- queue_evicted_v1: how many messages of the queue housekeeping evicted so far (its
-- maxWaitTimeSeconds); 0 when none or when the queue is not the tenant's.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.queue_evicted_v1(p_tenant uuid, p_queue_id int8)
RETURNS int8
LANGUAGE sql STABLE
AS $$
    SELECT COALESCE((SELECT e.evicted
                     FROM queen.queue_evictions e
                     JOIN queen.queues q ON q.id = e.queue_id
                     WHERE e.queue_id = p_queue_id AND q.tenant = p_tenant), 0)::int8
$$;

-- ---------------------------------------------------------------------------------------------
-- lease_reclaim_v1: up to p_limit leases that no cursor holds live any more
-- (schema/014_lease_table.sql): their expired cursors drop the lease id (lease_expires_at
-- kept), and their log_leases rows are deleted. A row is kept while a cursor of it still holds
-- the lease and was locked by someone else (SKIP LOCKED), so that cursor is cleared by a later
-- round. Result: cursors cleared + lease rows deleted (housekeeping repeats while it is a full
-- batch's worth). Every cursor is a key probe per listed partition (OFFSET 0 subqueries: a
-- plan without statistics read every cursor of the group for each lease; the joins are
-- nested loops over keys, whatever the planner guesses).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.lease_reclaim_v1(p_limit int4)
RETURNS int4
LANGUAGE sql VOLATILE
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
AS $$
    WITH dead AS (
        SELECT l.lease_id, l.consumer_group, l.partition_ids
        FROM queen.log_leases l
        WHERE NOT EXISTS (
            SELECT 1
            FROM unnest(l.partition_ids) AS lc(pid)
            WHERE EXISTS (SELECT 1 FROM queen.log_consumers c
                          WHERE c.partition_id = lc.pid AND c.consumer_group = l.consumer_group
                            AND c.lease_id = l.lease_id AND c.lease_expires_at > now()
                          OFFSET 0)
            OFFSET 0)
        ORDER BY l.lease_id
        LIMIT p_limit
    ), held AS (  -- the cursors that still hold a dead lease (expired), in key order
        SELECT c.partition_id, c.consumer_group, d.lease_id
        FROM dead d
        CROSS JOIN LATERAL unnest(d.partition_ids) AS lc(pid)
        CROSS JOIN LATERAL (SELECT c.partition_id, c.consumer_group
                            FROM queen.log_consumers c
                            WHERE c.partition_id = lc.pid AND c.consumer_group = d.consumer_group
                              AND c.lease_id = d.lease_id
                            OFFSET 0) c
        ORDER BY c.partition_id, c.consumer_group
    ), expired AS (
        SELECT c.partition_id, c.consumer_group
        FROM held h
        CROSS JOIN LATERAL (SELECT c.partition_id, c.consumer_group
                            FROM queen.log_consumers c
                            WHERE c.partition_id = h.partition_id
                              AND c.consumer_group = h.consumer_group
                            OFFSET 0
                            FOR UPDATE SKIP LOCKED) c
    ), cleared AS (
        UPDATE queen.log_consumers c
        -- NOTE(retention): lease_expires_at is kept: the pop redelivers an expired lease's
        -- batch only the queue's retryDelay after it (pop.sql); no live-lease test reads it
        -- without lease_id
        SET lease_id = NULL, worker_id = NULL
        FROM expired e
        WHERE c.partition_id = e.partition_id AND c.consumer_group = e.consumer_group
          AND c.lease_id IS NOT NULL AND c.lease_expires_at <= now()
        RETURNING 1
    ), gone AS (
        DELETE FROM queen.log_leases l
        USING dead d
        WHERE l.lease_id = d.lease_id
          AND NOT EXISTS (SELECT 1 FROM held h
                          WHERE h.lease_id = d.lease_id
                            AND NOT EXISTS (SELECT 1 FROM expired e
                                            WHERE e.partition_id = h.partition_id
                                              AND e.consumer_group = h.consumer_group))
        RETURNING 1
    )
    SELECT ((SELECT count(*) FROM cleared) + (SELECT count(*) FROM gone))::int4
$$;

-- ---------------------------------------------------------------------------------------------
-- dlq_depth_v1: dead-letter rows per queue (the queen_dlq_depth gauge, set by housekeeping).
-- Reads only; one pass over the queue_id index of log_dlq.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.dlq_depth_v1()
RETURNS TABLE (queue_name text, depth int8)
LANGUAGE sql STABLE
AS $$
    SELECT q.name::text, count(*)
    FROM queen.log_dlq d
    JOIN queen.queues q ON q.id = d.queue_id
    GROUP BY q.name
$$;

-- Revision (old migration 095_tenancy.sql): per-tenant views for what is published outside any tenant (api.md 1.5,
-- design.md invariant 8).
--
-- Functions:
--   queen.dlq_depth_v2() -> (tenant, queue_name, depth)
--       dead letters per (tenant, queue), for the queen_dlq_depth gauge. dlq_depth_v1 grouped
--       by name alone, so two tenants' queues of one name were summed into one label; the
--       broker now labels the default tenant's queues by name and folds every other tenant's
--       rows into one aggregate label, so the public /metrics never names another tenant's
--       queue (queen_mp/shards/housekeeping.py).
--
-- Tables touched: queen.log_dlq, queen.queues (read only).
-- Lock order: takes no row lock.
-- SQLSTATEs raised: none of its own.

CREATE OR REPLACE FUNCTION queen.dlq_depth_v2()
RETURNS TABLE (tenant uuid, queue_name text, depth int8)
LANGUAGE sql STABLE
AS $$
    SELECT q.tenant, q.name::text, count(*)
    FROM queen.log_dlq d
    JOIN queen.queues q ON q.id = d.queue_id
    GROUP BY q.tenant, q.name
$$;

-- ---------------------------------------------------------------------------------------------
-- queue_gauges_v1: the per-queue gauges of /metrics/prometheus (issue 28), one call per
-- QUEEN_METRICS_QUEUE_S by shard 0 of each instance (queen_mp/shards/queuegauges.py), bounded
-- here so that neither the answer nor the exposition grows with the number of queues.
--
-- Returns (gauge, queue_name, consumer_group, value); consumer_group is NULL for the per-queue
-- gauges. Gauges (definitions of api.md 5, at the statement's snapshot):
--   queen_queue_depth                          pending without a group: per partition
--       last_offset minus the lowest cursor (from the log start when below it; every retained
--       message when the partition has no cursor), summed over the queue's partitions
--   queen_queue_oldest_unconsumed_age_seconds  seconds since the oldest such message was
--       committed: the cursors' ready_at (schema/002: the oldest pending message of a cursor),
--       or, on a partition without a cursor, the segment at its log start; 0 when none
--   queen_consumer_lag_messages                per (queue, group): last_offset minus the
--       group's cursor (from the log start when below it), summed over its partitions
--   queen_consumer_lag_seconds                 per (queue, group): seconds since the oldest
--       message the group has not consumed was committed (its cursors' ready_at); 0 caught up
--   queen_dlq_depth                            dead-letter rows per queue
-- Bounds (p_cap >= 1): per gauge, the default tenant's p_cap series with the highest values
--   (ties by name) keep their names; the rest are folded into '(other)' (and group '(other)'),
--   summed, or the highest of them for the two ages. Every other tenant's rows are folded into
--   '(other tenants)' whatever their rank: /metrics is public (api.md 1.5), so no other
--   tenant's queue or group name leaves the database here.
--
-- Cost: one hash join of log_consumers with log_partitions and one pass over log_partitions,
--   at most two index probes of log_segments per partition that has no cursor and retained
--   messages, one pass over log_dlq.
-- Tables touched: queen.queues, queen.log_partitions, queen.log_consumers, queen.log_segments,
--   queen.log_dlq (read only). Lock order: takes no row lock. SQLSTATEs raised: 22023 for a
--   p_cap below 1.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.queue_gauges_v1(p_cap int4)
RETURNS TABLE (gauge text, queue_name text, consumer_group text, value float8)
LANGUAGE plpgsql STABLE
-- PERF(queen): the planner's estimate of the whole-table passes crosses jit_above_cost from a
-- few thousand partitions on, and compiling took 4.4 s of the 6.1 s of a call at 50,000
-- partitions (EXPLAIN ANALYZE); the plan itself is hash joins and aggregates, nothing JIT helps
SET jit = off
AS $$
BEGIN
    IF p_cap IS NULL OR p_cap < 1 THEN
        RAISE EXCEPTION 'queue_gauges_v1: the cap must be >= 1 (got %)', p_cap
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH cursors AS (
        -- every cursor with what it has not consumed (from the log start when below it)
        SELECT lp.id AS pid, lp.queue_id, x.consumer_group::text AS grp,
               GREATEST(lp.last_offset - GREATEST(x.committed_offset, lp.log_start_offset - 1),
                        0) AS lag,
               CASE WHEN lp.last_offset > GREATEST(x.committed_offset, lp.log_start_offset - 1)
                    THEN x.ready_at END AS oldest
        FROM queen.log_consumers x
        JOIN queen.log_partitions lp ON lp.id = x.partition_id
    ),
    per_cursored AS (
        -- a partition's pending is its lowest cursor's lag: the highest lag of its cursors
        SELECT c.pid, max(c.lag) AS pending, min(c.oldest) AS oldest
        FROM cursors c
        GROUP BY c.pid
    ),
    per_queue AS (
        SELECT lp.queue_id,
               sum(COALESCE(pc.pending,
                            GREATEST(lp.last_offset - lp.log_start_offset + 1, 0))) AS pending,
               min(CASE WHEN pc.pid IS NOT NULL THEN pc.oldest
                        WHEN lp.last_offset < lp.log_start_offset THEN NULL
                        -- no cursor: the oldest retained message (the segment covering the
                        -- log start; the first after it if retention trimmed under a stale
                        -- start)
                        ELSE COALESCE(
                            (SELECT s.created_at FROM queen.log_segments s
                             WHERE s.partition_id = lp.id
                               AND s.base_offset <= lp.log_start_offset
                             ORDER BY s.base_offset DESC LIMIT 1),
                            (SELECT s.created_at FROM queen.log_segments s
                             WHERE s.partition_id = lp.id
                               AND s.base_offset > lp.log_start_offset
                             ORDER BY s.base_offset LIMIT 1)) END) AS oldest
        FROM queen.log_partitions lp
        LEFT JOIN per_cursored pc ON pc.pid = lp.id
        GROUP BY lp.queue_id
    ),
    per_group AS (
        SELECT c.queue_id, c.grp, sum(c.lag) AS lag, min(c.oldest) AS oldest
        FROM cursors c
        GROUP BY c.queue_id, c.grp
    ),
    dlq AS (
        SELECT d.queue_id, count(*) AS n
        FROM queen.log_dlq d
        GROUP BY d.queue_id
    ),
    raw AS (
        SELECT 'queen_queue_depth'::text AS g, q.tenant, q.name::text AS name,
               NULL::text AS grp, COALESCE(pq.pending, 0)::float8 AS v, true AS summed
        FROM queen.queues q
        LEFT JOIN per_queue pq ON pq.queue_id = q.id
        UNION ALL
        SELECT 'queen_queue_oldest_unconsumed_age_seconds', q.tenant, q.name::text, NULL,
               COALESCE(GREATEST(extract(epoch FROM now() - pq.oldest), 0), 0)::float8, false
        FROM queen.queues q
        LEFT JOIN per_queue pq ON pq.queue_id = q.id
        UNION ALL
        SELECT 'queen_consumer_lag_messages', q.tenant, q.name::text, pg.grp,
               pg.lag::float8, true
        FROM per_group pg
        JOIN queen.queues q ON q.id = pg.queue_id
        UNION ALL
        SELECT 'queen_consumer_lag_seconds', q.tenant, q.name::text, pg.grp,
               COALESCE(GREATEST(extract(epoch FROM now() - pg.oldest), 0), 0)::float8, false
        FROM per_group pg
        JOIN queen.queues q ON q.id = pg.queue_id
        UNION ALL
        SELECT 'queen_dlq_depth', q.tenant, q.name::text, NULL, d.n::float8, true
        FROM dlq d
        JOIN queen.queues q ON q.id = d.queue_id
    ),
    ranked AS (
        SELECT r.g, r.v, r.summed,
               CASE WHEN r.tenant <> '00000000-0000-0000-0000-000000000000'::uuid
                        THEN '(other tenants)'
                    WHEN row_number() OVER (PARTITION BY r.g, r.tenant
                                            ORDER BY r.v DESC, r.name, r.grp) <= p_cap
                        THEN NULL
                    ELSE '(other)' END AS folded,
               r.name, r.grp
        FROM raw r
    )
    SELECT k.g, COALESCE(k.folded, k.name),
           CASE WHEN k.grp IS NULL THEN NULL ELSE COALESCE(k.folded, k.grp) END,
           CASE WHEN bool_and(k.summed) THEN sum(k.v) ELSE max(k.v) END
    FROM ranked k
    GROUP BY k.g, COALESCE(k.folded, k.name),
             CASE WHEN k.grp IS NULL THEN NULL ELSE COALESCE(k.folded, k.grp) END;
END;
$$;
