-- dlq.sql: the dead-letter queue routes (api.md 2.8; ack-internals.md "Filing the DLQ
-- row" and its note on replay). Rows are FILED by queen.log_dlq_head_v1 (ack.sql); this
-- file lists, replays and deletes them.
--
-- Functions (each takes the caller's tenant first; another tenant's rows, partitions and
-- queues behave exactly as absent ones):
--   queen.dlq_list_v1(uuid, text, text, text, timestamptz, timestamptz, int4, int8) -> table
--       one page of rows matching the filters (GET /api/v1/dlq), with the total match count.
--   queen.dlq_find_v1(uuid, int8, text, text) -> table
--       the rows of one (partition, transactionId[, group]): the snapshot the broker replays.
--   queen.dlq_retry_v1(uuid, int8, text, int8, text, bytea, bytea) -> jsonb
--       replay, in ONE transaction: delete the rows of one (partition, transactionId, offset
--       [, group]) and push the broker-built one-frame segment to the tail of the partition
--       through queen.log_push_one_v1 (push.sql, THE allocator).
--   queen.dlq_delete_v1(uuid, int8, text, text) -> int8
--       delete the rows of one (partition, transactionId[, group]); the log is never edited.
--   queen.dlq_match_v1(uuid, text, text, text, timestamptz, timestamptz, int4) -> table
--       the first rows matching the list's filters, in list order, shaped as dlq_find_v1's:
--       what a replay BY FILTER (POST /api/v1/dlq/retry) replays, a bounded batch per call.
--   queen.dlq_delete_matching_v1(uuid, text, text, text, timestamptz, timestamptz, int4) -> int8
--       delete the first rows matching the list's filters, in list order, at most p_limit
--       (DELETE /api/v1/dlq); the log is never edited.
--
-- Tables touched:
--   queen.log_dlq         read (list, find, match); DELETE (retry, delete, delete_matching)
--   queen.queues          read only (tenant, name, encryption_enabled)
--   queen.log_partitions  read (list, find); SELECT ... FOR NO KEY UPDATE and the allocator UPDATE
--                         (retry only, through log_push_one_v1)
--   queen.log_segments, queen.log_txns  INSERT one row each (retry only, log_push_one_v1)
--
-- Lock order (design.md invariant 4; schema/001_baseline.sql header):
--   dlq_retry_v1 locks exactly ONE log_partitions row, FIRST (SELECT ... FOR NO KEY UPDATE OF the
--   partition, before anything else), then deletes log_dlq rows, then calls log_push_one_v1,
--   which re-locks the row it already holds. Consumer rows are touched only by the allocator's
--   ready_at statement (push.sql; pop.sql's log_ready_at_v1), after the partition row: the order
--   partition -> consumer is kept. log_dlq rows are outside the global
--   order: the ack path only INSERTs them (under a consumer row lock, never waiting on a
--   log_dlq row lock), and dlq_delete_v1 locks log_dlq rows alone, so a retry waiting on a
--   delete (or the other way round) cannot close a cycle. Two retries of the same rows
--   serialise on the partition row; the second one's DELETE, a new statement under READ
--   COMMITTED, no longer sees the rows and the call answers not_found having written nothing.
--   dlq_list_v1, dlq_find_v1 and dlq_match_v1 take no row locks; dlq_delete_matching_v1
--   locks log_dlq rows alone, as dlq_delete_v1 (a row a concurrent retry deleted first is
--   skipped, not waited on twice: the DELETE re-checks it under READ COMMITTED).
--
-- SQLSTATEs raised:
--   22023  invalid_parameter_value: NULL partition id, transactionId or offset (find, retry,
--          delete); dlq_list_v1 with a limit below 1 or a negative offset; dlq_match_v1 and
--          dlq_delete_matching_v1 with a limit below 1; and, from
--          log_push_one_v1, a NULL blob or a hash blob that is not 16 bytes
--   40P01 / 55P03 / 40001 are not raised here but may reach the caller through the partition
--          row lock (nothing committed; a retry is safe).
--   The SQL never hashes and never decodes a frame: the broker builds the segment blob (one
--   chunk of one frame, api.md 3.1-3.2) and its hash blob (xxh3_128 of the new transactionId,
--   16 bytes big-endian).
--
-- Isolation: READ COMMITTED; each procedure is one transaction (the caller's autocommit
-- statement).
--
-- Result shape, dlq_retry_v1 (jsonb):
--   {"ok": true,  "error": null, "retried": <rows deleted>, "offset": <new offset>,
--    "ts": <created_at of the new segment, epoch microseconds>, "queue": <queue name>}
--   {"ok": false, "error": "not_found" | "partition_not_found", "retried": 0, "offset": null,
--    "ts": null, "queue": null|name}
--   not_found: no row matched (another tenant's rows, a second retry); partition_not_found:
--   rows match but their partition no longer exists (nothing to push into: the rows are kept).
--
-- Column meaning (schema/001_baseline.sql, log_dlq): created_at = failedAt (when the row was filed),
-- message_created_at = createdAt of the original message, payload = the frame's payload bytes
-- as stored (ciphertext when `encrypted`; NULL when the segment was retained away before the
-- row was filed).

-- ---------------------------------------------------------------------------------------------
-- dlq_list_v1: one page of the tenant's rows.
--   p_queue, p_group, p_partition  exact queue name, consumer group, partition NAME; NULL = any
--   p_from, p_to                   failedAt (log_dlq.created_at) bounds, both inclusive;
--                                  NULL = unbounded
--   p_limit, p_offset              page size (>= 1) and rows skipped (>= 0), in list order
-- Order: failedAt, partitionId, offset, then consumer group and row id (two groups can
-- dead-letter the same offset at the same instant; paging needs a total order).
-- Shape: `total` (every match, the page notwithstanding) is on every row. When the page is
-- empty (no match, or p_offset past the end) exactly ONE row comes back, with `total` and
-- every other column NULL (id IS NULL marks it).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.dlq_list_v1(
    p_tenant    uuid,
    p_queue     text,
    p_group     text,
    p_partition text,
    p_from      timestamptz,
    p_to        timestamptz,
    p_limit     int4,
    p_offset    int8
)
RETURNS TABLE (
    total              int8,
    id                 int8,
    queue_name         text,
    partition_id       int8,
    partition_name     text,
    consumer_group     text,
    "offset"           int8,
    message_id         uuid,
    transaction_id     text,
    trace_id           uuid,
    producer_sub       text,
    encrypted          boolean,
    payload            bytea,
    error              text,
    retry_count        int4,
    message_created_at timestamptz,
    failed_at          timestamptz
)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_offset IS NULL OR p_offset < 0 THEN
        RAISE EXCEPTION 'dlq_list_v1: limit must be >= 1 and offset >= 0 (got %, %)',
            p_limit, p_offset USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    -- NOTE(dlq): the matches are materialised as sort keys only (no payload), counted once
    -- and paged once; the page is joined back to its rows for the payloads.
    WITH m AS MATERIALIZED (
        SELECT d.id, d.created_at, d.partition_id, d."offset", d.consumer_group
        FROM queen.log_dlq d
        JOIN queen.queues q ON q.id = d.queue_id
        WHERE d.tenant = p_tenant AND q.tenant = p_tenant
          AND (p_queue IS NULL OR q.name = p_queue)
          AND (p_group IS NULL OR d.consumer_group = p_group)
          AND (p_partition IS NULL OR d.partition_name = p_partition)
          AND (p_from IS NULL OR d.created_at >= p_from)
          AND (p_to IS NULL OR d.created_at <= p_to)
    ), page AS (
        SELECT m.id, row_number() OVER (ORDER BY m.created_at, m.partition_id, m."offset",
                                                 m.consumer_group, m.id) AS n
        FROM m
        ORDER BY m.created_at, m.partition_id, m."offset", m.consumer_group, m.id
        LIMIT p_limit OFFSET p_offset
    )
    SELECT c.total, r.id, r.queue_name, r.partition_id, r.partition_name, r.consumer_group,
           r."offset", r.message_id, r.transaction_id, r.trace_id, r.producer_sub,
           r.encrypted, r.payload, r.error, r.retry_count, r.message_created_at, r.failed_at
    FROM (SELECT count(*)::int8 AS total FROM m) c
    LEFT JOIN LATERAL (
        SELECT page.n, d.id, q.name::text AS queue_name, d.partition_id,
               d.partition_name::text AS partition_name,
               d.consumer_group::text AS consumer_group, d."offset", d.message_id,
               d.transaction_id, d.trace_id, d.producer_sub, d.encrypted, d.payload, d.error,
               d.retry_count, d.message_created_at, d.created_at AS failed_at
        FROM page
        JOIN queen.log_dlq d ON d.id = page.id
        JOIN queen.queues q ON q.id = d.queue_id
    ) r ON true
    ORDER BY r.n;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- dlq_find_v1: the tenant's rows of (partition id, transactionId), of one group or of all
-- (p_group NULL), with what a replay needs: the queue's name and its CURRENT encryption flag.
-- Order: offset (the same transactionId can be dead-lettered at several offsets when it was
-- pushed again after its dedup window), then rows holding a snapshot before rows filed
-- without one (payload NULL: retained away before filing), then failedAt and id. The first
-- row is the one to replay.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.dlq_find_v1(
    p_tenant         uuid,
    p_partition_id   int8,
    p_transaction_id text,
    p_group          text
)
RETURNS TABLE (
    id                 int8,
    queue_name         text,
    queue_encrypted    boolean,
    partition_id       int8,
    partition_name     text,
    consumer_group     text,
    "offset"           int8,
    message_id         uuid,
    transaction_id     text,
    trace_id           uuid,
    producer_sub       text,
    encrypted          boolean,
    payload            bytea,
    error              text,
    retry_count        int4,
    message_created_at timestamptz,
    failed_at          timestamptz
)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_partition_id IS NULL OR p_transaction_id IS NULL THEN
        RAISE EXCEPTION 'dlq_find_v1: NULL partition id or transactionId'
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT d.id, q.name::text, q.encryption_enabled, d.partition_id, d.partition_name::text,
           d.consumer_group::text, d."offset", d.message_id, d.transaction_id, d.trace_id,
           d.producer_sub, d.encrypted, d.payload, d.error, d.retry_count,
           d.message_created_at, d.created_at
    FROM queen.log_dlq d
    JOIN queen.queues q ON q.id = d.queue_id
    WHERE d.partition_id = p_partition_id AND d.transaction_id = p_transaction_id
      AND d.tenant = p_tenant AND q.tenant = p_tenant
      AND (p_group IS NULL OR d.consumer_group = p_group)
    ORDER BY d."offset", d.payload IS NULL, d.created_at, d.id;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- dlq_retry_v1: replay one dead-lettered message (api.md 2.8), all or nothing.
--   p_partition_id, p_transaction_id, p_offset  the rows to replay: the broker read them with
--                    dlq_find_v1 and built the frame from their snapshot; the offset pins
--                    that snapshot (rows of other offsets with the same transactionId stay)
--   p_group          only that group's row; NULL = the rows of every group at that offset
--   p_blob           the segment payload blob: ONE chunk holding ONE frame with a fresh
--                    message id and transactionId (api.md 3.1-3.2)
--   p_hashes         xxh3_128 of the new transactionId, 16 bytes big-endian
-- Steps: lock the partition row (lock order, header); delete the matching rows (none: answer
-- not_found, nothing written); push the segment with no dedup probe (the transactionId is a
-- fresh UUIDv7: nothing to find) and the clock taken under the row lock. The original offset
-- keeps its committed cursors; every group sees the new message at the tail.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.dlq_retry_v1(
    p_tenant         uuid,
    p_partition_id   int8,
    p_transaction_id text,
    p_offset         int8,
    p_group          text,
    p_blob           bytea,
    p_hashes         bytea
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_queue text;
    v_n     int8;
    v_push  jsonb;
BEGIN
    IF p_partition_id IS NULL OR p_transaction_id IS NULL OR p_offset IS NULL THEN
        RAISE EXCEPTION 'dlq_retry_v1: NULL partition id, transactionId or offset'
            USING ERRCODE = '22023';
    END IF;

    -- 1. the allocator row, first (the lock log_push_one_v1 would take anyway)
    SELECT q.name INTO v_queue
    FROM queen.log_partitions lp
    JOIN queen.queues q ON q.id = lp.queue_id
    WHERE lp.id = p_partition_id AND q.tenant = p_tenant
    FOR NO KEY UPDATE OF lp;

    IF NOT FOUND THEN
        SELECT q.name INTO v_queue
        FROM queen.log_dlq d
        JOIN queen.queues q ON q.id = d.queue_id
        WHERE d.partition_id = p_partition_id AND d.transaction_id = p_transaction_id
          AND d."offset" = p_offset AND d.tenant = p_tenant AND q.tenant = p_tenant
          AND (p_group IS NULL OR d.consumer_group = p_group)
        LIMIT 1;
        RETURN jsonb_build_object(
            'ok', false,
            'error', CASE WHEN FOUND THEN 'partition_not_found' ELSE 'not_found' END,
            'retried', 0, 'offset', NULL, 'ts', NULL, 'queue', v_queue);
    END IF;

    -- 2. the rows
    DELETE FROM queen.log_dlq d
    WHERE d.partition_id = p_partition_id AND d.transaction_id = p_transaction_id
      AND d."offset" = p_offset AND d.tenant = p_tenant
      AND (p_group IS NULL OR d.consumer_group = p_group);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    IF v_n = 0 THEN
        RETURN jsonb_build_object('ok', false, 'error', 'not_found', 'retried', 0,
                                  'offset', NULL, 'ts', NULL, 'queue', v_queue);
    END IF;

    -- 3. the push: window 0 (no probe), one frame, nothing verified, clock under the lock
    v_push := queen.log_push_one_v1(p_partition_id, 0, 1, p_hashes, 0, p_blob, NULL);

    RETURN jsonb_build_object('ok', true, 'error', NULL, 'retried', v_n,
                              'offset', (v_push ->> 'base')::int8,
                              'ts', (v_push ->> 'ts')::int8, 'queue', v_queue);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- dlq_delete_v1: delete the tenant's rows of (partition id, transactionId), of one group or
-- of all (p_group NULL), at every offset. Returns the number of rows deleted (0 = none
-- matched). Only log_dlq rows are touched: the log, cursors and leases are never edited.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.dlq_delete_v1(
    p_tenant         uuid,
    p_partition_id   int8,
    p_transaction_id text,
    p_group          text
) RETURNS int8
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_n int8;
BEGIN
    IF p_partition_id IS NULL OR p_transaction_id IS NULL THEN
        RAISE EXCEPTION 'dlq_delete_v1: NULL partition id or transactionId'
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM queen.log_dlq d
    WHERE d.partition_id = p_partition_id AND d.transaction_id = p_transaction_id
      AND d.tenant = p_tenant
      AND (p_group IS NULL OR d.consumer_group = p_group);
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- dlq_match_v1: the first p_limit rows of the tenant matching dlq_list_v1's filters (same
-- meaning, same order: failedAt, partitionId, offset, consumer group, id), with the columns of
-- dlq_find_v1 (the queue's CURRENT encryption flag included): the broker replays them one
-- (partition, transactionId, offset) at a time through dlq_retry_v1, each its own transaction.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.dlq_match_v1(
    p_tenant    uuid,
    p_queue     text,
    p_group     text,
    p_partition text,
    p_from      timestamptz,
    p_to        timestamptz,
    p_limit     int4
)
RETURNS TABLE (
    id                 int8,
    queue_name         text,
    queue_encrypted    boolean,
    partition_id       int8,
    partition_name     text,
    consumer_group     text,
    "offset"           int8,
    message_id         uuid,
    transaction_id     text,
    trace_id           uuid,
    producer_sub       text,
    encrypted          boolean,
    payload            bytea,
    error              text,
    retry_count        int4,
    message_created_at timestamptz,
    failed_at          timestamptz
)
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'dlq_match_v1: limit must be >= 1 (got %)', p_limit
            USING ERRCODE = '22023';
    END IF;
    RETURN QUERY
    SELECT d.id, q.name::text, q.encryption_enabled, d.partition_id, d.partition_name::text,
           d.consumer_group::text, d."offset", d.message_id, d.transaction_id, d.trace_id,
           d.producer_sub, d.encrypted, d.payload, d.error, d.retry_count,
           d.message_created_at, d.created_at
    FROM queen.log_dlq d
    JOIN queen.queues q ON q.id = d.queue_id
    WHERE d.tenant = p_tenant AND q.tenant = p_tenant
      AND (p_queue IS NULL OR q.name = p_queue)
      AND (p_group IS NULL OR d.consumer_group = p_group)
      AND (p_partition IS NULL OR d.partition_name = p_partition)
      AND (p_from IS NULL OR d.created_at >= p_from)
      AND (p_to IS NULL OR d.created_at <= p_to)
    ORDER BY d.created_at, d.partition_id, d."offset", d.consumer_group, d.id
    LIMIT p_limit;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- dlq_delete_matching_v1: delete the first p_limit rows of the tenant matching dlq_list_v1's
-- filters, in its order; returns the number deleted. Only log_dlq rows are touched.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.dlq_delete_matching_v1(
    p_tenant    uuid,
    p_queue     text,
    p_group     text,
    p_partition text,
    p_from      timestamptz,
    p_to        timestamptz,
    p_limit     int4
) RETURNS int8
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_n int8;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'dlq_delete_matching_v1: limit must be >= 1 (got %)', p_limit
            USING ERRCODE = '22023';
    END IF;
    -- the rows dlq_match_v1 would hand a retry, in its order (one filter, written once)
    DELETE FROM queen.log_dlq d
    WHERE d.id IN (SELECT m.id FROM queen.dlq_match_v1(p_tenant, p_queue, p_group, p_partition,
                                                       p_from, p_to, p_limit) m)
      AND d.tenant = p_tenant;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
