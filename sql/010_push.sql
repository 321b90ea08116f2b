-- 010_push.sql: the push path (life-of-a-push.md sections 4 and 5).
--
-- Functions:
--   queen.log_push_multi_v1(text[], text[], int4[], bytea[], int8[], bytea[], uuid[]) -> jsonb
--       one bundle = N segments on N distinct partitions, one transaction (the caller's).
--   queen.log_push_one_v1(int8, int4, int4, bytea, int8, bytea, timestamptz) -> jsonb
--       THE allocator: the only place an offset is ever assigned (push bundles, the
--       transaction wire and the streams cycle all call it).
--   queen.log_segment_at_v1(int8, int8) -> table(base_offset, msg_count, created_at, payload)
--       the segment covering one offset (resolving a duplicate's original message id).
--
-- Tables touched:
--   queen.queues          read (tenant, name -> id, dedup_window); INSERT on provisioning only
--   queen.log_partitions  INSERT on provisioning only; SELECT ... FOR UPDATE; UPDATE (allocator:
--                         last_offset, last_write_at quantised to 1 s, last_created_at) - HOT
--   queen.log_txns        read (dedup probe, primary key range); INSERT one row per segment
--   queen.log_segments    INSERT one row per segment; read by log_segment_at_v1
--
-- Lock order (design.md invariant 4), log_push_multi_v1:
--   1. provisioning, only if some (tenant, queue, partition) is missing:
--      INSERT queues ... ORDER BY (tenant, name) ON CONFLICT DO NOTHING, then
--      INSERT log_partitions ... ORDER BY (queue_id, name) ON CONFLICT DO NOTHING
--      (speculative insertion locks taken in key order, BEFORE any partition row lock);
--   2. every partition row of the bundle in ONE statement, ORDER BY log_partitions.id
--      FOR UPDATE OF the partition (queues rows are read, never locked);
--   3. per segment, ascending partition id: log_push_one_v1 re-locks its (already held) row.
--   No consumer row (log_consumers) is ever locked here.
--   log_push_one_v1 alone locks exactly one log_partitions row; a caller that pushes to several
--   partitions in one transaction must call it in ascending partition id order (or pre-lock).
--
-- SQLSTATEs raised:
--   22023  invalid_parameter_value: bundle arrays of different lengths; NULL queue/partition
--          name, msg_count or blob; msg_count < 1; hash blob not 16 x msg_count bytes (stride)
--   21000  cardinality_violation: the same partition appears twice in one bundle
--   40001  serialization_failure: a partition of the bundle vanished between provisioning and
--          the pre-lock (its queue was deleted concurrently); nothing committed, retryable
--   P0002  no_data_found: log_push_one_v1 called with an unknown partition id
--   P0004  assert_failure: completeness guard (an input ordinal without exactly one result)
--
-- Transaction isolation: READ COMMITTED (each statement sees rows committed before it, which
-- the provisioning step relies on).
--
-- Result shapes (jsonb). ts = created_at as integer epoch MICROseconds.
--   log_push_one_v1:
--     {"pid": <int8>, "s": "queued",    "base": <int8>, "ts": <int8>}
--     {"pid": <int8>, "s": "duplicate", "base": null,   "ts": <int8>,
--      "dups": [{"i": <frame index in the segment, 0-based>, "off": <original offset>}, ...]}
--   log_push_multi_v1: a JSON array in INPUT order, element k = the log_push_one_v1 object of
--     input segment k plus "i": k (0-based input ordinal). An empty bundle returns [].
--
-- Deduplication semantics (window > 0 only):
--   * scope = the partition (tenant, queue, partition); identity = the 16-byte xxh3_128 hash.
--   * probed offsets: (GREATEST(p_verified, txns_start - 1), last_offset], restricted to
--     log_txns rows with created_at >= ts - window (ts = the bundle timestamp).
--   * if ANY frame of the segment matches, the segment is `duplicate` and NOTHING is written for
--     it (no allocator bump, no segment, no log_txns row). `dups` lists EVERY matching frame
--     index, ascending, each with the LOWEST matching offset inside the probed range and window
--     (the oldest surviving copy, which is the one whose message id the first push reported).
--     Frames not in `dups` are new; the broker rebuilds the segment without the duplicate
--     frames and resubmits the remainder in a later bundle.
--   * frames are NOT compared with each other: layer-2 dedup in the broker removed intra-segment
--     repeats before the call (if one slipped through and matches, each of its indexes is
--     listed). `ts` of a duplicate is the bundle timestamp (nothing was stored).
--   * p_verified is the broker's promise that offsets <= p_verified hold none of the segment's
--     hashes (its filter said "certainly new" up to there); a row straddling that offset is
--     still probed for its offsets above it.
--   * Cost: the allocator row lock is held during the probe. With p_verified near last_offset
--     the probe reads a handful of rows; with p_verified = 0 it reads every sidecar row of the
--     window (one PK range scan, each blob detoasted once, O(stored + incoming)).
--
-- created_at: every segment of a bundle is stamped with the bundle timestamp (clock_timestamp()
--   taken once after all partition locks are held), raised to GREATEST(ts, last_created_at of
--   the partition). Taking the clock under the lock already orders it after every earlier
--   committed push of that partition; the GREATEST (kept in the HOT allocator update, a column
--   that is not indexed) makes created_at monotone non-decreasing per partition in offset order
--   even if the wall clock steps backwards. Time retention and timestamp subscriptions rely on
--   it (a forward primary key walk).

-- ---------------------------------------------------------------------------------------------
-- log_push_one_v1: stride check, optional dedup probe, allocation, two inserts.
--   p_pid        partition id (resolved by the caller)
--   p_window     dedup window in seconds (queues.dedup_window); 0 or NULL = no probe
--   p_msg_count  frames in the segment (>= 1)
--   p_hashes     16 x p_msg_count bytes, frame order
--   p_verified   offsets <= p_verified need no probe (broker-verified); 0 or NULL = none
--   p_blob       payload blob (chunks, api.md 3.2), stored as sent
--   p_ts         the bundle timestamp; NULL = clock_timestamp() taken under the row lock
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION queen.log_push_one_v1(
    p_pid       int8,
    p_window    int4,
    p_msg_count int4,
    p_hashes    bytea,
    p_verified  int8,
    p_blob      bytea,
    p_ts        timestamptz
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_last        int8;
    v_txns_start  int8;
    v_lo          int8;
    v_first_row   int8;
    v_ts          timestamptz := p_ts;
    v_created     timestamptz;
    v_base        int8;
    v_dups        jsonb;
BEGIN
    IF p_msg_count IS NULL OR p_msg_count < 1 THEN
        RAISE EXCEPTION 'log_push_one_v1: msg_count must be >= 1 (got %)', p_msg_count
            USING ERRCODE = '22023';
    END IF;
    IF p_hashes IS NULL OR octet_length(p_hashes) <> 16 * p_msg_count THEN
        RAISE EXCEPTION 'log_push_one_v1: hash blob stride mismatch on partition %: % bytes for % frames (want %)',
            p_pid, octet_length(p_hashes), p_msg_count, 16 * p_msg_count
            USING ERRCODE = '22023';
    END IF;
    IF p_blob IS NULL THEN
        RAISE EXCEPTION 'log_push_one_v1: NULL payload blob on partition %', p_pid
            USING ERRCODE = '22023';
    END IF;

    IF p_window > 0 THEN
        -- Row lock first (a no-op re-lock when log_push_multi_v1 already holds it).
        SELECT lp.last_offset, lp.txns_start INTO v_last, v_txns_start
        FROM queen.log_partitions lp
        WHERE lp.id = p_pid
        FOR UPDATE;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'log_push_one_v1: partition % does not exist', p_pid
                USING ERRCODE = 'P0002';
        END IF;
        IF v_ts IS NULL THEN
            v_ts := clock_timestamp();
        END IF;

        v_lo := GREATEST(COALESCE(p_verified, 0), v_txns_start - 1);
        IF v_lo < v_last THEN
            -- First log_txns row that can hold offset v_lo + 1: the row covering it, if any
            -- (a row can straddle v_lo), else everything above v_lo. One PK probe backwards.
            SELECT COALESCE(max(t.base_offset), v_lo + 1) INTO v_first_row
            FROM queen.log_txns t
            WHERE t.partition_id = p_pid AND t.base_offset <= v_lo + 1;

            -- The probe. Shape chosen so the plan does not depend on estimates:
            --   * `r`: the log_txns rows of the PK range [v_first_row, v_last] inside the
            --     window; `|| '\x'` behind `OFFSET 0` detoasts each stored blob ONCE per row
            --     (otherwise every 16-byte substr of an out-of-line blob is its own TOAST fetch);
            --   * `s`: one (offset, hash) per stored frame above v_lo, behind `OFFSET 0` so no
            --     blob is ever carried into a sort;
            --   * `IN (...) IS TRUE` keeps the sublink from being pulled up into a join: it
            --     stays a hashed SubPlan over the incoming hashes (built once, probed once per
            --     stored hash: O(stored + incoming), no sort, no spill), and only the (rare)
            --     hits are joined back to their incoming frame index.
            -- A hashed SubPlan is only planned while the incoming set is estimated to fit
            -- hash_mem (~56 bytes a hash: ~150k hashes at the default work_mem of 4MB, 8192 at
            -- work_mem >= 256kB), and a custom plan knows p_msg_count exactly; an unhashed
            -- SubPlan would be a product. A giant segment therefore takes the plain join form
            -- (hash or merge join of (offset, hash) rows, no blob carried, never a product).
            IF p_msg_count <= 8192 THEN
                SELECT jsonb_agg(jsonb_build_object('i', m.i, 'off', m.off) ORDER BY m.i)
                INTO v_dups
                FROM (
                    SELECT inc.i, min(st.off) AS off
                    FROM (
                        SELECT s.off, s.h
                        FROM (
                            SELECT r.base_offset + j AS off, substr(r.hashes, j * 16 + 1, 16) AS h
                            FROM (
                                SELECT t.base_offset, t.msg_count,
                                       t.hashes || '\x'::bytea AS hashes
                                FROM queen.log_txns t
                                WHERE t.partition_id = p_pid
                                  AND t.base_offset >= v_first_row
                                  AND t.base_offset <= v_last
                                  AND t.created_at >= v_ts - make_interval(secs => p_window)
                                OFFSET 0
                            ) r
                            CROSS JOIN LATERAL generate_series(
                                LEAST(GREATEST(0, v_lo + 1 - r.base_offset), r.msg_count)::int4,
                                r.msg_count - 1) AS j
                            OFFSET 0
                        ) s
                        WHERE (s.h IN (SELECT substr(p_hashes, k * 16 + 1, 16)
                                       FROM generate_series(0, p_msg_count - 1) AS k)) IS TRUE
                    ) st
                    JOIN (
                        SELECT k AS i, substr(p_hashes, k * 16 + 1, 16) AS h
                        FROM generate_series(0, p_msg_count - 1) AS k
                    ) inc ON inc.h = st.h
                    GROUP BY inc.i
                ) m;
            ELSE
                SELECT jsonb_agg(jsonb_build_object('i', m.i, 'off', m.off) ORDER BY m.i)
                INTO v_dups
                FROM (
                    SELECT inc.i, min(st.off) AS off
                    FROM (
                        SELECT r.base_offset + j AS off, substr(r.hashes, j * 16 + 1, 16) AS h
                        FROM (
                            SELECT t.base_offset, t.msg_count,
                                   t.hashes || '\x'::bytea AS hashes
                            FROM queen.log_txns t
                            WHERE t.partition_id = p_pid
                              AND t.base_offset >= v_first_row
                              AND t.base_offset <= v_last
                              AND t.created_at >= v_ts - make_interval(secs => p_window)
                            OFFSET 0
                        ) r
                        CROSS JOIN LATERAL generate_series(
                            LEAST(GREATEST(0, v_lo + 1 - r.base_offset), r.msg_count)::int4,
                            r.msg_count - 1) AS j
                        OFFSET 0
                    ) st
                    JOIN (
                        SELECT k AS i, substr(p_hashes, k * 16 + 1, 16) AS h
                        FROM generate_series(0, p_msg_count - 1) AS k
                    ) inc ON inc.h = st.h
                    GROUP BY inc.i
                ) m;
            END IF;

            IF v_dups IS NOT NULL THEN
                -- Written nothing: no allocator bump, no inserts, no savepoint needed.
                RETURN jsonb_build_object(
                    'pid', p_pid, 's', 'duplicate', 'base', NULL,
                    'ts', (extract(epoch FROM v_ts) * 1000000)::int8,
                    'dups', v_dups);
            END IF;
        END IF;
    END IF;

    -- The allocator: one UPDATE (takes the row lock itself on the window = 0 path). Only
    -- last_write_at is indexed, and it changes at most once a second: the update stays HOT.
    UPDATE queen.log_partitions lp SET
        last_offset     = lp.last_offset + p_msg_count,
        last_write_at   = CASE WHEN lp.last_write_at IS NULL
                                 OR clock_timestamp() - lp.last_write_at > interval '1 second'
                               THEN clock_timestamp() ELSE lp.last_write_at END,
        last_created_at = GREATEST(lp.last_created_at, COALESCE(v_ts, clock_timestamp()))
    WHERE lp.id = p_pid
    RETURNING lp.last_offset, lp.last_created_at INTO v_last, v_created;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'log_push_one_v1: partition % does not exist', p_pid
            USING ERRCODE = 'P0002';
    END IF;
    v_base := v_last - p_msg_count + 1;

    INSERT INTO queen.log_segments (partition_id, base_offset, msg_count, created_at, payload)
    VALUES (p_pid, v_base, p_msg_count, v_created, p_blob);
    -- Always, dedup or not: ack-by-transactionId resolves through it.
    INSERT INTO queen.log_txns (partition_id, base_offset, msg_count, created_at, hashes)
    VALUES (p_pid, v_base, p_msg_count, v_created, p_hashes);

    RETURN jsonb_build_object(
        'pid', p_pid, 's', 'queued', 'base', v_base,
        'ts', (extract(epoch FROM v_created) * 1000000)::int8);
END
$$;

COMMENT ON FUNCTION queen.log_push_one_v1(int8, int4, int4, bytea, int8, bytea, timestamptz) IS
'The single offset allocator. Returns {"pid","s":"queued","base","ts"} or '
'{"pid","s":"duplicate","base":null,"ts","dups":[{"i","off"}]} (ts = epoch microseconds); '
'a duplicate writes nothing.';

-- ---------------------------------------------------------------------------------------------
-- log_push_multi_v1: one bundle, one transaction, N segments on N distinct partitions.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION queen.log_push_multi_v1(
    p_queues     text[],
    p_partitions text[],
    p_msg_counts int4[],
    p_hashes     bytea[],
    p_verified   int8[],
    p_blobs      bytea[],
    p_tenants    uuid[] DEFAULT NULL
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    c_default_tenant CONSTANT uuid := '00000000-0000-0000-0000-000000000000';
    n           int4 := COALESCE(cardinality(p_queues), 0);
    v_tenants   uuid[];
    v_found     int8;
    v_ords      int4[];
    v_pids      int8[];
    v_windows   int4[];
    v_locked    int4;
    v_distinct  int4;
    v_ts        timestamptz;
    v_res       jsonb[];
    v_o         int4;
BEGIN
    -- 1. Alignment guard: a silent misalignment would demux verdicts to the wrong requests.
    IF COALESCE(cardinality(p_partitions), 0) <> n
       OR COALESCE(cardinality(p_msg_counts), 0) <> n
       OR COALESCE(cardinality(p_hashes), 0) <> n
       OR COALESCE(cardinality(p_verified), 0) <> n
       OR COALESCE(cardinality(p_blobs), 0) <> n
       OR (p_tenants IS NOT NULL AND cardinality(p_tenants) <> n) THEN
        RAISE EXCEPTION 'log_push_multi_v1: misaligned bundle arrays (queues %, partitions %, msg_counts %, hashes %, verified %, blobs %, tenants %)',
            cardinality(p_queues), cardinality(p_partitions), cardinality(p_msg_counts),
            cardinality(p_hashes), cardinality(p_verified), cardinality(p_blobs),
            cardinality(p_tenants)
            USING ERRCODE = '22023';
    END IF;
    IF n = 0 THEN
        RETURN '[]'::jsonb;
    END IF;
    IF array_position(p_queues, NULL) IS NOT NULL
       OR array_position(p_partitions, NULL) IS NOT NULL
       OR array_position(p_msg_counts, NULL) IS NOT NULL
       OR array_position(p_hashes, NULL) IS NOT NULL
       OR array_position(p_blobs, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'log_push_multi_v1: NULL queue, partition, msg_count, hashes or blob in bundle'
            USING ERRCODE = '22023';
    END IF;

    IF p_tenants IS NULL THEN
        v_tenants := array_fill(c_default_tenant, ARRAY[n]);
    ELSIF array_position(p_tenants, NULL) IS NOT NULL THEN
        SELECT array_agg(COALESCE(t.t, c_default_tenant) ORDER BY t.o) INTO v_tenants
        FROM unnest(p_tenants) WITH ORDINALITY AS t(t, o);
    ELSE
        v_tenants := p_tenants;
    END IF;

    -- 2. Provisioning skip: one existence count; the inserts run only if something is missing.
    SELECT count(*) INTO v_found
    FROM unnest(v_tenants, p_queues, p_partitions) AS b(t, q, p)
    JOIN queen.queues qu ON qu.tenant = b.t AND qu.name = b.q
    JOIN queen.log_partitions lp ON lp.queue_id = qu.id AND lp.name = b.p;

    IF v_found < n THEN
        -- Ordered on the unique keys: ON CONFLICT takes speculative locks in row order, so two
        -- bundles creating overlapping sets cannot convoy or deadlock.
        INSERT INTO queen.queues (tenant, name)
        SELECT DISTINCT b.t, b.q
        FROM unnest(v_tenants, p_queues) AS b(t, q)
        WHERE NOT EXISTS (SELECT 1 FROM queen.queues qu WHERE qu.tenant = b.t AND qu.name = b.q)
        ORDER BY b.t, b.q
        ON CONFLICT (tenant, name) DO NOTHING;

        INSERT INTO queen.log_partitions (queue_id, name)
        SELECT DISTINCT qu.id, b.p
        FROM unnest(v_tenants, p_queues, p_partitions) AS b(t, q, p)
        JOIN queen.queues qu ON qu.tenant = b.t AND qu.name = b.q
        WHERE NOT EXISTS (SELECT 1 FROM queen.log_partitions lp
                          WHERE lp.queue_id = qu.id AND lp.name = b.p)
        ORDER BY qu.id, b.p
        ON CONFLICT (queue_id, name) DO NOTHING;
    END IF;

    -- 3. One set-based pre-lock of every partition row, ascending id (the global lock order).
    SELECT array_agg(s.ord ORDER BY s.id), array_agg(s.id ORDER BY s.id),
           array_agg(s.dw ORDER BY s.id), count(*), count(DISTINCT s.id)
    INTO v_ords, v_pids, v_windows, v_locked, v_distinct
    FROM (
        SELECT b.ord::int4 AS ord, lp.id, qu.dedup_window AS dw
        FROM unnest(v_tenants, p_queues, p_partitions) WITH ORDINALITY AS b(t, q, p, ord)
        JOIN queen.queues qu ON qu.tenant = b.t AND qu.name = b.q
        JOIN queen.log_partitions lp ON lp.queue_id = qu.id AND lp.name = b.p
        ORDER BY lp.id
        FOR UPDATE OF lp
    ) s;

    IF v_distinct <> v_locked THEN
        RAISE EXCEPTION 'log_push_multi_v1: a partition appears more than once in the bundle (% segments, % distinct partitions)',
            v_locked, v_distinct
            USING ERRCODE = '21000';
    END IF;
    IF v_locked <> n THEN
        RAISE EXCEPTION 'log_push_multi_v1: % of % partitions vanished before the pre-lock (queue deleted concurrently?)',
            n - v_locked, n
            USING ERRCODE = '40001';
    END IF;

    -- 4. The bundle timestamp, once, with every partition lock held.
    v_ts := clock_timestamp();

    -- 5. Per segment, ascending partition id; results land in input order.
    v_res := array_fill(NULL::jsonb, ARRAY[n]);
    FOR k IN 1 .. n LOOP
        v_o := v_ords[k];
        v_res[v_o] := queen.log_push_one_v1(
                          v_pids[k], v_windows[k], p_msg_counts[v_o], p_hashes[v_o],
                          COALESCE(p_verified[v_o], 0), p_blobs[v_o], v_ts)
                      || jsonb_build_object('i', v_o - 1);
    END LOOP;

    -- 6. Completeness guard: every input ordinal has exactly one result.
    IF cardinality(v_res) <> n OR array_position(v_res, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'log_push_multi_v1: completeness guard: % inputs, missing result at ordinal %',
            n, array_position(v_res, NULL)
            USING ERRCODE = 'P0004';
    END IF;

    RETURN to_jsonb(v_res);
END
$$;

COMMENT ON FUNCTION queen.log_push_multi_v1(text[], text[], int4[], bytea[], int8[], bytea[], uuid[]) IS
'Push one bundle (one segment per distinct partition). Returns a JSON array in input order of '
'{"i","pid","s","base","ts"[,"dups"]} (see log_push_one_v1).';

-- ---------------------------------------------------------------------------------------------
-- log_segment_at_v1: the segment covering p_off (base_offset <= p_off < base_offset +
-- msg_count); zero rows if it was retained away or never existed. One backward PK probe.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION queen.log_segment_at_v1(p_pid int8, p_off int8)
RETURNS TABLE (base_offset int8, msg_count int4, created_at timestamptz, payload bytea)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT s.base_offset, s.msg_count, s.created_at, s.payload
    FROM (
        SELECT ls.base_offset, ls.msg_count, ls.created_at, ls.payload
        FROM queen.log_segments ls
        WHERE ls.partition_id = p_pid AND ls.base_offset <= p_off
        ORDER BY ls.base_offset DESC
        LIMIT 1
    ) s
    WHERE p_off < s.base_offset + s.msg_count
$$;
