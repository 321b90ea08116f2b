-- reads.sql: reads by offset and partition discovery (api.md 2.15): no lease, no cursor, no
-- claim, nothing written. Two readers asking the same question get the same answer, and no
-- consumer group notices them.
--
-- Functions (each takes the caller's tenant first; another tenant's queue answers exactly as
-- an absent one):
--   queen.log_fetch_v1(uuid, text[], text[], int8[], int8[], int8, int4) -> table
--       POST /api/v1/fetch: per entry (queue, partition, offset), the partition's bounds and
--       the stored segments covering its records from that offset, within byte and record
--       bounds. The broker decodes the frames (the SQL never does).
--   queen.log_partitions_changed_v1(uuid, text, timestamptz, int8, int4, int4, int4, int4)
--       -> jsonb
--       POST /api/v1/partitions/changed, one entry: a page of the queue's partitions (all, or
--       those written at or after a time) in creation order, and the page's safeTime.
--
-- Tables touched (read only): queen.queues, queen.log_partitions, queen.log_segments; and the
--   pg_stat_activity view (log_partitions_changed_v1).
--
-- Lock order: takes no row lock (plain reads).
--
-- SQLSTATEs raised:
--   22023  invalid_parameter_value: log_fetch_v1 with arrays of different lengths;
--          log_partitions_changed_v1 with a limit or scan below 1.
--
-- Offsets (api.md 1.3): the first message of a partition is offset 1. Per partition:
--   highWatermark  = last_offset + 1, the next offset the partition will assign;
--   logStartOffset = log_start_offset, the oldest offset retention kept (1 until it ran).
--   An offset below logStartOffset or above highWatermark is OFFSET_OUT_OF_RANGE (retention
--   passed the caller by, or the caller asks for what was never written: neither is answered
--   silently); offset = highWatermark is valid and empty (a caught-up reader). Offset 0 names
--   the position before the first message and reads as 1, so a reader that starts at 0 (the
--   2.6 client's default) reads from the log start, or learns that retention cut it.
--   A queue that does not exist (for this tenant) is UNKNOWN_TOPIC_OR_PARTITION. A partition
--   of an existing queue that was never written is an empty log (bounds 1 and 1, no error),
--   as upstream answers an unwritten lane: partitions come into being at their first push.
--
-- Isolation: READ COMMITTED. log_fetch_v1 is STABLE, so its statements share the calling
--   statement's snapshot: every entry's bounds and segments are one consistent state.
--   log_partitions_changed_v1 is VOLATILE on purpose: see its own comment.

-- ---------------------------------------------------------------------------------------------
-- log_fetch_v1: one row per (entry, covering segment), entries in input order (k = 0-based
-- input ordinal), segments ascending; an entry with no segment to return has one row with
-- NULL segment columns. error NULL = none.
--   p_max_bytes[i]  per-entry bound on the STORED segment bytes read (payload blobs)
--   p_budget        the whole call's bound on the same, spent in entry order
--   p_max_records   per-entry bound on messages
-- Exactly one segment escapes the bounds: the first of the whole call, so a segment larger
-- than every budget is still delivered and a reader can step past it. The broker bounds the
-- payload bytes of the answer itself (segments may hold more than the reader's maxBytes).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_fetch_v1(
    p_tenant      uuid,
    p_queues      text[],
    p_partitions  text[],
    p_offsets     int8[],
    p_max_bytes   int8[],
    p_budget      int8,
    p_max_records int4
) RETURNS TABLE (
    k            int4,
    error        text,
    high         int8,
    log_start    int8,
    base_offset  int8,
    msg_count    int4,
    created_at   timestamptz,
    payload      bytea
)
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_n       int4 := COALESCE(array_length(p_queues, 1), 0);
    v_qid     int8;
    v_pid     int8;
    v_last    int8;
    v_start   int8;
    v_wanted  int8;
    v_from    int8;
    v_budget  int8 := GREATEST(COALESCE(p_budget, 0), 0);
    v_cap     int4 := GREATEST(COALESCE(p_max_records, 1), 1);
    v_maxb    int8;
    v_bytes   int8;
    v_taken   int8;
    v_emitted boolean;
    v_any     boolean := false;
    v_seg     record;
BEGIN
    IF COALESCE(array_length(p_partitions, 1), 0) <> v_n
       OR COALESCE(array_length(p_offsets, 1), 0) <> v_n
       OR COALESCE(array_length(p_max_bytes, 1), 0) <> v_n THEN
        RAISE EXCEPTION 'log_fetch_v1: arrays of different lengths (% queues)', v_n
            USING ERRCODE = '22023';
    END IF;
    FOR i IN 1 .. v_n LOOP
        k := i - 1;
        base_offset := NULL; msg_count := NULL; created_at := NULL; payload := NULL;
        SELECT q.id INTO v_qid
        FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queues[i];
        IF NOT FOUND THEN
            error := 'UNKNOWN_TOPIC_OR_PARTITION'; high := 0; log_start := 0;
            RETURN NEXT;
            CONTINUE;
        END IF;
        SELECT lp.id, lp.last_offset, lp.log_start_offset INTO v_pid, v_last, v_start
        FROM queen.log_partitions lp WHERE lp.queue_id = v_qid AND lp.name = p_partitions[i];
        IF NOT FOUND THEN
            v_pid := NULL; v_last := 0; v_start := 1;  -- never written: an empty log
        END IF;
        high := v_last + 1;
        log_start := v_start;
        v_wanted := GREATEST(COALESCE(p_offsets[i], 0), 1);
        IF v_wanted < v_start OR v_wanted > v_last + 1 THEN
            error := 'OFFSET_OUT_OF_RANGE';
            RETURN NEXT;
            CONTINUE;
        END IF;
        error := NULL;
        v_emitted := false;
        IF v_wanted <= v_last THEN
            v_maxb := GREATEST(COALESCE(p_max_bytes[i], 1), 1);
            v_bytes := 0;
            v_taken := 0;
            -- one backward primary key step to the segment covering the offset, then a
            -- forward walk that stops at the first bound
            SELECT s.base_offset INTO v_from
            FROM queen.log_segments s
            WHERE s.partition_id = v_pid AND s.base_offset <= v_wanted
            ORDER BY s.base_offset DESC LIMIT 1;
            v_from := COALESCE(v_from, v_wanted);
            FOR v_seg IN
                SELECT s.base_offset, s.msg_count, s.created_at, s.payload
                FROM queen.log_segments s
                WHERE s.partition_id = v_pid AND s.base_offset >= v_from
                ORDER BY s.base_offset
            LOOP
                CONTINUE WHEN v_seg.base_offset + v_seg.msg_count - 1 < v_wanted;
                EXIT WHEN (v_taken > 0 OR v_any)
                      AND (v_bytes >= v_maxb OR v_budget <= 0 OR v_taken >= v_cap);
                base_offset := v_seg.base_offset;
                msg_count := v_seg.msg_count;
                created_at := v_seg.created_at;
                payload := v_seg.payload;
                RETURN NEXT;
                v_emitted := true;
                v_any := true;
                v_taken := v_taken + v_seg.base_offset + v_seg.msg_count
                           - GREATEST(v_wanted, v_seg.base_offset);
                v_bytes := v_bytes + octet_length(v_seg.payload);
                v_budget := GREATEST(v_budget - octet_length(v_seg.payload), 0);
            END LOOP;
        END IF;
        IF NOT v_emitted THEN
            base_offset := NULL; msg_count := NULL; created_at := NULL; payload := NULL;
            RETURN NEXT;
        END IF;
    END LOOP;
END
$$;

COMMENT ON FUNCTION queen.log_fetch_v1(uuid, text[], text[], int8[], int8[], int8, int4) IS
'Reads by offset (POST /api/v1/fetch): per entry its bounds (high = last_offset + 1, log_start) '
'and error, and the segments covering its records from the offset, within byte and record '
'bounds (the first segment of the call escapes them). Reads only.';

-- ---------------------------------------------------------------------------------------------
-- log_partitions_changed_v1: one page of one queue's partitions, in creation order (id).
--   p_queue   NULL = no queue: the answer carries the safeTime alone
--   p_since   NULL = every partition; else those whose newest segment was created at or after
--             it (last_created_at, exact and monotone per partition; never-written partitions
--             are left out)
--   p_after   the page cursor: partitions with an id above it (NULL = from the first)
--   p_limit   partitions per page (1..1000, larger clamped)
--   p_scan    partitions examined per page at most (a selective p_since over a large queue
--             answers a short page with a cursor, instead of one long statement)
--   p_guard_s seconds safeTime stays below now() at least (the broker passes 5)
--   p_floor_s seconds below now() that safeTime falls back to when pg_stat_activity hides
--             another role's sessions (their transactions cannot be seen, so only a floor
--             longer than any write transaction is safe)
-- Answer: {"safeTime": timestamptz, "degraded": bool, "known": bool (the queue exists and has
--   partitions), "partitions": [{"id","name","lastOffset","logStart","lastWriteAt"}],
--   "next": int8 | null (the cursor of the next page; null = the pass is over)}.
--
-- safeTime: no segment committed after this answer can carry a created_at below it, so a
-- reader that asks again with since = safeTime misses no write. A segment's created_at is
-- clock_timestamp() taken inside its transaction (push.sql: never earlier than the
-- transaction's start, raised to stay monotone per partition), so the oldest xact_start of
-- the sessions in a transaction is a floor under every created_at still to commit. Read
-- FIRST, then the partitions are read under a LATER snapshot (VOLATILE: each statement of the
-- body takes its own), which closes the gap between the two reads:
--   * a write that committed before the partition read is in the answer;
--   * one that had not committed was either in flight at the activity read, so safeTime <=
--     its xact_start <= its created_at, or had not started, so its created_at is later than
--     the activity read, itself later than safeTime.
-- safeTime is also at least p_guard_s (5 s) below now(): a transaction that started just as
-- the activity was read may not show its xact_start yet. A long open transaction of any
-- session holds safeTime back for its duration: late, never wrong.
-- Must run in READ COMMITTED, as a statement of its own (the broker's autocommit call): a
-- REPEATABLE READ transaction would pin one snapshot for the whole body and reopen the gap.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_partitions_changed_v1(
    p_tenant  uuid,
    p_queue   text,
    p_since   timestamptz,
    p_after   int8,
    p_limit   int4,
    p_scan    int4,
    p_guard_s int4,
    p_floor_s int4
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_safe     timestamptz;
    v_masked   int8;
    v_degraded boolean := false;
    v_qid      int8;
    v_known    boolean;
    v_limit    int4;
    v_rows     jsonb[] := '{}';
    v_count    int4 := 0;
    v_scanned  int4 := 0;
    v_last_id  int8;
    v_row      record;
BEGIN
    -- FIRST statement, before any table is read: see the comment above.
    WITH s AS (
        SELECT a.xact_start, a.state
        FROM pg_stat_activity a
        WHERE a.pid <> pg_backend_pid()
          AND a.datname = current_database()
          AND (a.backend_type = 'client backend' OR a.backend_type IS NULL)
    )
    SELECT LEAST(now() - make_interval(secs => GREATEST(COALESCE(p_guard_s, 5), 0)),
                 COALESCE((SELECT min(x.xact_start) FROM s x), now())),
           (SELECT count(*) FROM s x WHERE x.state IS NULL AND x.xact_start IS NULL)
    INTO v_safe, v_masked;
    IF v_masked > 0 THEN
        -- another role's sessions are hidden (no pg_read_all_stats): their transactions
        -- cannot be seen, so only the floor is safe
        v_safe := LEAST(v_safe, now() - make_interval(secs => GREATEST(COALESCE(p_floor_s, 0), 5)));
        v_degraded := true;
    END IF;

    IF p_queue IS NULL THEN  -- the safeTime alone (a call with no entry)
        RETURN jsonb_build_object('safeTime', v_safe, 'degraded', v_degraded, 'known', false,
                                  'partitions', '[]'::jsonb, 'next', NULL);
    END IF;
    IF p_limit IS NULL OR p_limit < 1 OR p_scan IS NULL OR p_scan < 1 THEN
        RAISE EXCEPTION 'log_partitions_changed_v1: limit % and scan % must be >= 1',
            p_limit, p_scan USING ERRCODE = '22023';
    END IF;
    v_limit := LEAST(p_limit, 1000);

    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
    v_known := v_qid IS NOT NULL
               AND EXISTS (SELECT 1 FROM queen.log_partitions lp WHERE lp.queue_id = v_qid);
    IF NOT v_known THEN
        RETURN jsonb_build_object('safeTime', v_safe, 'degraded', v_degraded, 'known', false,
                                  'partitions', '[]'::jsonb, 'next', NULL);
    END IF;

    -- log_partitions_queue_id_idx (schema/004_reads.sql): the queue's partitions by id
    FOR v_row IN
        SELECT lp.id, lp.name, lp.last_offset, lp.log_start_offset, lp.last_created_at
        FROM queen.log_partitions lp
        WHERE lp.queue_id = v_qid AND lp.id > COALESCE(p_after, 0)
        ORDER BY lp.id
        LIMIT p_scan
    LOOP
        v_scanned := v_scanned + 1;
        v_last_id := v_row.id;
        IF p_since IS NULL OR v_row.last_created_at >= p_since THEN
            v_rows := array_append(v_rows, jsonb_build_object(
                'id', v_row.id, 'name', v_row.name, 'lastOffset', v_row.last_offset,
                'logStart', v_row.log_start_offset, 'lastWriteAt', v_row.last_created_at));
            v_count := v_count + 1;
            EXIT WHEN v_count >= v_limit;
        END IF;
    END LOOP;
    -- a full page, or a short one that stopped at the scan bound: the next page starts after
    -- the last partition examined; otherwise the pass is over
    RETURN jsonb_build_object(
        'safeTime', v_safe, 'degraded', v_degraded, 'known', true,
        'partitions', to_jsonb(v_rows),
        'next', CASE WHEN v_count >= v_limit OR v_scanned >= p_scan THEN v_last_id END);
END
$$;

COMMENT ON FUNCTION queen.log_partitions_changed_v1(uuid, text, timestamptz, int8, int4, int4, int4,
                                                     int4) IS
'Partition discovery (POST /api/v1/partitions/changed), one page: the queue''s partitions '
'(all, or written at or after p_since) by id after p_after, with the safeTime below which '
'no later commit can write. Reads only; VOLATILE for its snapshots (see reads.sql).';
