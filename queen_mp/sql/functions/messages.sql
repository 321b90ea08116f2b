-- messages.sql: the message browser (api.md 2.9; 5 for /status/queues/{queue}/messages).
-- Messages live inside stored segments (api.md 3.1-3.2) and the SQL never decodes a frame: these
-- functions find the segments and the per-offset state (cursor, live lease, DLQ rows); the
-- broker unpacks the frames for ids, transactionIds and payloads.
--
-- Functions (each takes the caller's tenant first; another tenant's queues and partitions
-- behave exactly as absent ones):
--   queen.msg_list_v1(uuid, text, text, text, text, text, text, timestamptz, timestamptz,
--                     int4, int8, int8) -> table
--       one page of the message list (GET /api/v1/messages, by time and from an offset): the
--       total count of matching messages and the segments covering the page, with what the broker needs to give
--       each of their messages its status.
--   queen.msg_find_v1(uuid, int8, bytea, int8) -> 0 or 1 row
--       the newest occurrence of one transactionId hash in a partition, through the
--       transactionId sidecar (log_txns), with the segment holding it.
--   queen.msg_segments_below_v1(uuid, int8, int8, int4) -> table
--       retained segments of a partition below an offset, newest first (the broker's bounded
--       fallback when the sidecar no longer covers the oldest segments).
--   queen.msg_groups_v1(uuid, int8, int8) -> table
--       every consumer group's view of one offset: cursor, live lease, DLQ row.
--   Calls queen.admin_segment_from_v1 (admin.sql).
--
-- Tables touched (read only): queen.queues, queen.log_partitions, queen.log_consumers,
--   queen.log_segments, queen.log_txns, queen.log_dlq.
--
-- Lock order: takes no row lock (plain reads).
--
-- SQLSTATEs raised:
--   22023  invalid_parameter_value: msg_list_v1 with a limit below 1, a negative offset, a NULL
--          group, an unknown status, from after to, or a from-offset below 1; msg_find_v1 with a NULL partition id
--          or a hash that is not 16 bytes; msg_segments_below_v1 with a limit below 1;
--          msg_groups_v1 with a NULL partition id or offset.
--
-- Isolation: READ COMMITTED, each function one statement, so one snapshot (the functions are
-- STABLE: their inner queries see the calling statement's snapshot). The broker runs the
-- single-message lookup (find, fallback, groups) in one REPEATABLE READ READ ONLY transaction.
--
-- Status of a message for one consumer group (api.md 2.9), per offset o of partition p:
--   dead_letter  a log_dlq row of (p, group, o) exists
--   completed    else o <= the group's committed_offset (0 when it has no cursor row)
--   processing   else a live lease (lease_id NOT NULL AND lease_expires_at > now()) of the group
--                on p has batch_start <= o <= batch_end
--   pending      otherwise
--   NOTE(messages): api.md lists `completed` first; a dead-lettered offset is always at or below
--   the cursor (the DLQ filing moves the cursor past it), so taken literally `dead_letter` could
--   never show: the DLQ row takes precedence.
--   completed and processing are offset RANGES ([1, committed], [max(batch_start, committed + 1),
--   batch_end]); dead letters are a SET of offsets excluded from / counted into those ranges.
--
-- Order of the list: createdAt (the segment's created_at), partitionId, offset. Every message
-- of a segment shares its created_at and segments are created_at-monotone per partition in
-- offset order (push.sql), so the list is the segments in (created_at, partition_id,
-- base_offset) order, each expanded in offset order: paging is a running sum of per-segment
-- match counts (exact), and only the segments covering [offset, offset + limit) are fetched.

-- ---------------------------------------------------------------------------------------------
-- msg_list_v1: one page of the tenant's messages.
--   p_queue, p_partition     exact queue name, partition NAME; NULL = any
--   p_namespace, p_task      the queue's namespace / task; NULL = any
--   p_group                  the group `status` is about ('__QUEUE_MODE__' for queue mode)
--   p_status                 'pending' | 'processing' | 'completed' | 'dead_letter'; NULL = any
--   p_from, p_to             createdAt bounds, both inclusive. p_from NULL = one hour before
--                            p_to (before now() when p_to is NULL too); p_to NULL = unbounded
--                            (up to now: nothing is created later in this snapshot)
--   p_limit, p_offset        page size (>= 1) and messages skipped (>= 0), in list order
--   p_from_offset            only offsets >= it (>= 1; NULL = every offset): browsing a
--                            partition from an offset. Given without p_from, the window has
--                            no lower time bound (p_from NULL is then -infinity, not an hour
--                            ago). A segment straddling it counts and lists only its offsets
--                            from p_from_offset on; dlq_offsets still lists the segment's all.
-- Shape: `total` (every matching message, the page notwithstanding) is on every row. One row
-- per segment covering the page, in list order:
--   skip            matching messages before this segment (so its first match is number skip)
--   matched         matching messages in this segment (>= 1)
--   queue_name, namespace, task, partition_id, partition_name
--   base_offset, msg_count, created_at, payload      the segment as stored
--   committed_offset                                 the group's cursor (0 without a cursor row)
--   lease_start, lease_end, lease_expires_at         the group's LIVE lease on the partition
--                                                    (batch_start, batch_end); NULL if none
--   dlq_offsets     the distinct offsets of this segment with a DLQ row of the group, ascending
-- The broker applies the status rules above to each offset; its count per segment equals
-- `matched`. When the page is empty (no match, or p_offset past the end) exactly ONE row comes
-- back, with `total` and every other column NULL (skip IS NULL marks it). When p_queue names no
-- queue of the tenant, NO row comes back (the /status/queues/{queue}/messages route is 404).
-- PERF(messages): only partitions written since the window start are visited
-- (log_partitions.last_created_at), each from its first segment in the window found by binary
-- search (admin_segment_from_v1) and, for a window ending before the partition's last write, up
-- to its first segment after the window (the same search); the segments in the window are read
-- without their payloads (TOASTed out of line), counted and sorted; only the page's segments
-- are read whole. DLQ rows are counted per segment (one index range probe) only when a status
-- filter is given and the partition has DLQ rows for the group.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.msg_list_v1(
    p_tenant    uuid,
    p_queue     text,
    p_partition text,
    p_namespace text,
    p_task      text,
    p_group     text,
    p_status    text,
    p_from      timestamptz,
    p_to        timestamptz,
    p_limit     int4,
    p_offset    int8,
    p_from_offset int8 DEFAULT NULL
)
RETURNS TABLE (
    total            int8,
    skip             int8,
    matched          int4,
    queue_name       text,
    namespace        text,
    task             text,
    partition_id     int8,
    partition_name   text,
    base_offset      int8,
    msg_count        int4,
    created_at       timestamptz,
    payload          bytea,
    committed_offset int8,
    lease_start      int8,
    lease_end        int8,
    lease_expires_at timestamptz,
    dlq_offsets      int8[]
)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
DECLARE
    v_now  timestamptz := now();
    v_from timestamptz := COALESCE(p_from, CASE WHEN p_from_offset IS NOT NULL
                                                THEN '-infinity'::timestamptz
                                                ELSE COALESCE(p_to, now()) - interval '1 hour'
                                           END);
    -- first instant after the window (timestamptz has microsecond resolution)
    v_past timestamptz := p_to + interval '1 microsecond';
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_offset IS NULL OR p_offset < 0 THEN
        RAISE EXCEPTION 'msg_list_v1: limit must be >= 1 and offset >= 0 (got %, %)',
            p_limit, p_offset USING ERRCODE = '22023';
    END IF;
    IF p_group IS NULL THEN
        RAISE EXCEPTION 'msg_list_v1: NULL consumer group' USING ERRCODE = '22023';
    END IF;
    IF p_from_offset IS NOT NULL AND p_from_offset < 1 THEN
        RAISE EXCEPTION 'msg_list_v1: from-offset must be >= 1 (got %)', p_from_offset
            USING ERRCODE = '22023';
    END IF;
    IF p_status IS NOT NULL
       AND p_status NOT IN ('pending', 'processing', 'completed', 'dead_letter') THEN
        RAISE EXCEPTION 'msg_list_v1: unknown status %', p_status USING ERRCODE = '22023';
    END IF;
    IF p_to IS NOT NULL AND v_from > p_to THEN
        RAISE EXCEPTION 'msg_list_v1: from % is after to %', v_from, p_to
            USING ERRCODE = '22023';
    END IF;
    IF p_queue IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue) THEN
        RETURN;
    END IF;

    RETURN QUERY
    WITH parts AS MATERIALIZED (
        -- the partitions in scope with the group's state; live = a lease not yet expired
        SELECT lp.id AS pid, q.name::text AS qname, q.namespace::text AS qns,
               q.task::text AS qtask, lp.name::text AS pname,
               COALESCE(c.committed_offset, 0) AS committed,
               CASE WHEN c.live THEN c.batch_start END AS ls,
               CASE WHEN c.live THEN c.batch_end END AS le,
               CASE WHEN c.live THEN c.lease_expires_at END AS lx,
               (p_status IS NOT NULL AND EXISTS (
                    SELECT 1 FROM queen.log_dlq d
                    WHERE d.partition_id = lp.id AND d.consumer_group = p_group)) AS has_dlq,
               -- NOTE(messages): from an offset, the scan starts at the segment holding it
               -- (GREATEST ignores a NULL: segs still filters on created_at and offsets)
               CASE WHEN p_from_offset IS NULL THEN queen.admin_segment_from_v1(lp.id, v_from)
                    ELSE GREATEST(queen.admin_segment_from_v1(lp.id, v_from),
                                  (SELECT max(s0.base_offset) FROM queen.log_segments s0
                                   WHERE s0.partition_id = lp.id
                                     AND s0.base_offset <= p_from_offset)) END AS lo,
               CASE WHEN p_to IS NULL OR lp.last_created_at <= p_to THEN lp.last_offset + 1
                    ELSE COALESCE(queen.admin_segment_from_v1(lp.id, v_past),
                                  lp.last_offset + 1) END AS hi
        FROM queen.queues q
        JOIN queen.log_partitions lp ON lp.queue_id = q.id
        LEFT JOIN LATERAL (
            SELECT c0.committed_offset, c0.batch_start, c0.batch_end, c0.lease_expires_at,
                   (c0.lease_id IS NOT NULL AND c0.lease_expires_at > v_now
                    AND c0.batch_start IS NOT NULL AND c0.batch_end IS NOT NULL) AS live
            FROM queen.log_consumers c0
            WHERE c0.partition_id = lp.id AND c0.consumer_group = p_group
        ) c ON true
        WHERE q.tenant = p_tenant
          AND (p_queue IS NULL OR q.name = p_queue)
          AND (p_namespace IS NULL OR q.namespace = p_namespace)
          AND (p_task IS NULL OR q.task = p_task)
          AND (p_partition IS NULL OR lp.name = p_partition)
          AND lp.last_created_at >= v_from
    ),
    segs AS MATERIALIZED (
        -- the segments in the window, without payload, with their match count
        SELECT p.pid, s.base_offset AS base, s.msg_count AS n, s.created_at AS at,
               (CASE p_status
                    WHEN 'completed' THEN r.len_c - dq.dc
                    WHEN 'processing' THEN r.len_p - dq.dp
                    WHEN 'dead_letter' THEN dq.dall
                    WHEN 'pending' THEN b.l - b.f + 1 - r.len_c - r.len_p
                                        - (dq.dall - dq.dc - dq.dp)
                    ELSE b.l - b.f + 1 END)::int4 AS m
        FROM parts p
        JOIN queen.log_segments s
          ON s.partition_id = p.pid AND s.base_offset >= p.lo AND s.base_offset < p.hi
        CROSS JOIN LATERAL (
            -- the offsets of the segment that count: [f, l] (f > base only from an offset)
            SELECT GREATEST(s.base_offset, COALESCE(p_from_offset, 1)) AS f,
                   s.base_offset + s.msg_count - 1 AS l
        ) b
        CROSS JOIN LATERAL (
            -- NOTE(messages): GREATEST/LEAST ignore NULLs, so the lease range is built with
            -- explicit CASEs: no live lease = an empty processing range.
            SELECT GREATEST(0, LEAST(b.l, p.committed) - b.f + 1)::int4 AS len_c,
                   CASE WHEN p.ls IS NULL THEN NULL
                        ELSE GREATEST(b.f, p.committed + 1, p.ls) END AS pl,
                   CASE WHEN p.ls IS NULL THEN NULL
                        ELSE LEAST(b.l, p.le) END AS ph
        ) r0
        CROSS JOIN LATERAL (
            SELECT r0.len_c, r0.pl, r0.ph,
                   CASE WHEN r0.pl IS NULL THEN 0
                        ELSE GREATEST(0, r0.ph - r0.pl + 1) END::int4 AS len_p
        ) r
        CROSS JOIN LATERAL (
            -- an aggregate without GROUP BY: always one row (zeros when skipped)
            SELECT (count(*) FILTER (WHERE u.o <= p.committed))::int4 AS dc,
                   (count(*) FILTER (WHERE u.o BETWEEN r.pl AND r.ph))::int4 AS dp,
                   count(*)::int4 AS dall
            FROM (SELECT DISTINCT d."offset" AS o
                  FROM queen.log_dlq d
                  WHERE p.has_dlq
                    AND d.partition_id = p.pid AND d.consumer_group = p_group
                    AND d."offset" BETWEEN b.f AND b.l) u
        ) dq
        WHERE s.created_at >= v_from AND (p_to IS NULL OR s.created_at <= p_to)
          AND b.l >= b.f
    ),
    ranked AS MATERIALIZED (
        SELECT g.pid, g.base, g.n, g.at, g.m,
               (sum(g.m) OVER (ORDER BY g.at, g.pid, g.base ROWS UNBOUNDED PRECEDING)
                - g.m)::int8 AS before
        FROM segs g
        WHERE g.m > 0
    ),
    tot AS (
        SELECT COALESCE(sum(g.m), 0)::int8 AS n FROM segs g
    )
    SELECT t.n, pg.before, pg.m, p.qname, p.qns, p.qtask, pg.pid, p.pname,
           pg.base, pg.n, pg.at, s.payload, p.committed, p.ls, p.le, p.lx,
           CASE WHEN pg.pid IS NULL THEN NULL ELSE ARRAY(
               SELECT DISTINCT d."offset"
               FROM queen.log_dlq d
               WHERE d.partition_id = pg.pid AND d.consumer_group = p_group
                 AND d."offset" BETWEEN pg.base AND pg.base + pg.n - 1
               ORDER BY d."offset") END
    FROM tot t
    LEFT JOIN (
        SELECT rk.pid, rk.base, rk.n, rk.at, rk.m, rk.before
        FROM ranked rk
        WHERE rk.before < p_offset + p_limit AND rk.before + rk.m > p_offset
    ) pg ON true
    LEFT JOIN parts p ON p.pid = pg.pid
    LEFT JOIN queen.log_segments s ON s.partition_id = pg.pid AND s.base_offset = pg.base
    ORDER BY pg.before;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- msg_txn_offset_v1: the newest offset of a partition whose transactionId hash is p_hash, as
-- the sidecar (queen.log_txns) records it, in its rows at or above p_from (the log start: rows
-- still backed by segments) and at offsets below p_before (NULL = any); NULL = none. The rows
-- are scanned newest first; in each, `position` finds the hash and a hit counts only on a
-- 16-byte boundary ((pos - 1) % 16 = 0: the hash at byte 16*k is offset base_offset + k); the
-- LAST aligned hit of the first row holding one is the newest occurrence. msg_find_v1 (a
-- message by transactionId) and trace_record_v1 (traces.sql) find their message with it.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.msg_txn_offset_v1(
    p_partition_id int8,
    p_hash         bytea,
    p_from         int8,
    p_before       int8
)
RETURNS int8
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_row   record;
    v_at    int4;
    v_pos   int4;
    v_abs   int4;
    v_found int8;
BEGIN
    -- `|| '\x'` detoasts each stored blob once (not once per position call)
    FOR v_row IN
        SELECT t.base_offset AS base, t.hashes || '\x'::bytea AS hashes
        FROM queen.log_txns t
        WHERE t.partition_id = p_partition_id
          AND t.base_offset >= p_from
          AND (p_before IS NULL OR t.base_offset < p_before)
        ORDER BY t.base_offset DESC
    LOOP
        v_at := 1;
        LOOP
            v_pos := position(p_hash IN substr(v_row.hashes, v_at));
            EXIT WHEN v_pos = 0;
            v_abs := v_at + v_pos - 1;            -- 1-based byte position in the row's blob
            IF (v_abs - 1) % 16 = 0 THEN
                IF p_before IS NULL OR v_row.base + (v_abs - 1) / 16 < p_before THEN
                    v_found := v_row.base + (v_abs - 1) / 16;
                END IF;
                v_at := v_abs + 16;
            ELSE
                v_at := v_abs + 1;                -- straddles two hashes: look further
            END IF;
        END LOOP;
        EXIT WHEN v_found IS NOT NULL;
    END LOOP;
    RETURN v_found;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- msg_find_v1: the newest occurrence of a transactionId hash in one partition of the tenant.
--   p_hash     xxh3_128(transactionId), 16 bytes big-endian
--   p_before   only occurrences at offsets below it (NULL = any): the broker's next call when
--              the frame it decoded carries another transactionId (a hash collision)
-- The sidecar rows (log_txns) still backed by a segment (base_offset >= log_start_offset) are
-- searched by msg_txn_offset_v1 (above).
-- Result: no row = no such partition for the tenant. Otherwise one row: the queue and
-- partition, log_start_offset, txns_start (the sidecar covers offsets >= txns_start only: an
-- occurrence below it is not findable here, see msg_segments_below_v1), last_offset, and
--   found_offset   the occurrence; NULL = none in the sidecar
--   base_offset, msg_count, created_at, payload   the segment holding it (NULL with it)
-- PERF(messages): a miss reads every retained sidecar row of the partition (16 bytes a
-- message, bounded by the sidecar's life: api.md 4); a hit stops at the newest row holding it.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.msg_find_v1(
    p_tenant       uuid,
    p_partition_id int8,
    p_hash         bytea,
    p_before       int8
)
RETURNS TABLE (
    queue_name       text,
    namespace        text,
    task             text,
    partition_name   text,
    log_start_offset int8,
    txns_start       int8,
    last_offset      int8,
    found_offset     int8,
    base_offset      int8,
    msg_count        int4,
    created_at       timestamptz,
    payload          bytea
)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
DECLARE
    v_part  record;
    v_found int8;
BEGIN
    IF p_partition_id IS NULL OR p_hash IS NULL OR octet_length(p_hash) <> 16 THEN
        RAISE EXCEPTION 'msg_find_v1: NULL partition id, or a hash that is not 16 bytes'
            USING ERRCODE = '22023';
    END IF;
    SELECT q.name::text AS qname, q.namespace::text AS qns, q.task::text AS qtask,
           lp.name::text AS pname, lp.log_start_offset AS log_start,
           lp.txns_start AS txns, lp.last_offset AS last
    INTO v_part
    FROM queen.log_partitions lp
    JOIN queen.queues q ON q.id = lp.queue_id
    WHERE lp.id = p_partition_id AND q.tenant = p_tenant;
    IF NOT FOUND THEN
        RETURN;
    END IF;

    v_found := queen.msg_txn_offset_v1(p_partition_id, p_hash, v_part.log_start, p_before);

    RETURN QUERY
    SELECT v_part.qname, v_part.qns, v_part.qtask, v_part.pname, v_part.log_start,
           v_part.txns, v_part.last, v_found, s.base_offset, s.msg_count, s.created_at,
           s.payload
    FROM (SELECT 1) one
    LEFT JOIN LATERAL (
        SELECT s0.base_offset, s0.msg_count, s0.created_at, s0.payload
        FROM queen.log_segments s0
        WHERE v_found IS NOT NULL AND s0.partition_id = p_partition_id
          AND s0.base_offset <= v_found
        ORDER BY s0.base_offset DESC
        LIMIT 1
    ) s ON s.base_offset + s.msg_count > v_found;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- msg_segments_below_v1: up to p_limit retained segments of one partition of the tenant with
-- base_offset < p_below, newest first (no row: none, or not the tenant's partition).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.msg_segments_below_v1(
    p_tenant       uuid,
    p_partition_id int8,
    p_below        int8,
    p_limit        int4
)
RETURNS TABLE (base_offset int8, msg_count int4, created_at timestamptz, payload bytea)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'msg_segments_below_v1: limit must be >= 1 (got %)', p_limit
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT s.base_offset, s.msg_count, s.created_at, s.payload
    FROM queen.log_partitions lp
    JOIN queen.queues q ON q.id = lp.queue_id
    JOIN queen.log_segments s ON s.partition_id = lp.id
    WHERE lp.id = p_partition_id AND q.tenant = p_tenant
      AND s.base_offset < p_below
    ORDER BY s.base_offset DESC
    LIMIT p_limit;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- msg_groups_v1: every group with a cursor on the partition or a DLQ row at the offset, by name,
-- with what the status rules need:
--   committed_offset                            the cursor (0 for a DLQ row without cursor)
--   lease_start, lease_end, lease_expires_at    the LIVE lease (batch range); NULL if none
--   head_retry_count                            batch_retry_count when the offset is the head
--                                               (committed_offset + 1), else 0
--   dead, error, retry_count                    the newest DLQ row of (partition, group, offset)
-- No row: no group, or not the tenant's partition.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.msg_groups_v1(p_tenant uuid, p_partition_id int8, p_offset int8)
RETURNS TABLE (
    consumer_group   text,
    committed_offset int8,
    lease_start      int8,
    lease_end        int8,
    lease_expires_at timestamptz,
    head_retry_count int4,
    dead             boolean,
    error            text,
    retry_count      int4
)
LANGUAGE plpgsql STABLE
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := now();
BEGIN
    IF p_partition_id IS NULL OR p_offset IS NULL THEN
        RAISE EXCEPTION 'msg_groups_v1: NULL partition id or offset' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    WITH part AS (
        SELECT lp.id
        FROM queen.log_partitions lp
        JOIN queen.queues q ON q.id = lp.queue_id
        WHERE lp.id = p_partition_id AND q.tenant = p_tenant
    ), names AS (
        SELECT c.consumer_group AS g FROM part JOIN queen.log_consumers c ON c.partition_id = part.id
        UNION
        SELECT d.consumer_group FROM part JOIN queen.log_dlq d
            ON d.partition_id = part.id AND d."offset" = p_offset
    )
    SELECT n.g::text, COALESCE(c.committed_offset, 0),
           CASE WHEN c.live THEN c.batch_start END,
           CASE WHEN c.live THEN c.batch_end END,
           CASE WHEN c.live THEN c.lease_expires_at END,
           CASE WHEN p_offset = COALESCE(c.committed_offset, 0) + 1
                THEN COALESCE(c.batch_retry_count, 0) ELSE 0 END,
           d.id IS NOT NULL, d.error, d.retry_count
    FROM names n
    LEFT JOIN LATERAL (
        SELECT c0.committed_offset, c0.batch_start, c0.batch_end, c0.lease_expires_at,
               c0.batch_retry_count,
               (c0.lease_id IS NOT NULL AND c0.lease_expires_at > v_now
                AND c0.batch_start IS NOT NULL AND c0.batch_end IS NOT NULL) AS live
        FROM queen.log_consumers c0
        WHERE c0.partition_id = p_partition_id AND c0.consumer_group = n.g
    ) c ON true
    LEFT JOIN LATERAL (
        SELECT d0.id, d0.error, d0.retry_count
        FROM queen.log_dlq d0
        WHERE d0.partition_id = p_partition_id AND d0.consumer_group = n.g
          AND d0."offset" = p_offset
        ORDER BY d0.created_at DESC, d0.id DESC
        LIMIT 1
    ) d ON true
    ORDER BY n.g;
END
$$;
