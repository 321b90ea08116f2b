-- 135_push_bundle_writes.sql: a push bundle writes its segments and sidecars with one
-- statement each, not one function call per segment.
--
-- Functions: queen.log_push_multi_v1(text[], text[], int4[], bytea[], int8[], bytea[], uuid[])
-- replaced (same signature, result, locks, lock order and SQLSTATEs as in
-- 100_push_resolve.sql; log_push_one_v1 unchanged, still called for segments that need the
-- dedup probe, and by the transaction wire).
--
-- Why: with 1-item pushes a bundle is about 19 one-message segments, and log_push_one_v1 ran
-- four statements for each (a re-lock of the partition row, the allocator UPDATE, the two
-- INSERTs) plus a function call and two jsonb builds. pg_stat_statements (track = all, private
-- cluster, 64 connections of 1-item pushes, 10 s): log_push_multi_v1 1.73 ms a call, of which
-- the nested statements 0.96 ms (UPDATE 14.8 us, INSERT log_txns 11.1 us, INSERT log_segments
-- 10.5 us, re-lock 2.9 us a segment); the other 0.77 ms was the per-segment plpgsql around them.
--
-- Now the pre-lock also reads each partition's last_offset and txns_start (it holds the row
-- lock from then on, so they stay true). A segment whose shard verified everything above
-- max(verified, txns_start - 1), or whose queue has no dedup window, skips the probe anyway,
-- so it only runs the allocator UPDATE in the loop; its segment and sidecar rows go in with one
-- INSERT ... SELECT FROM unnest(...) each, and its result is built by the final aggregate. A
-- segment that needs the probe calls log_push_one_v1 as before. Both INSERTs read only the
-- bundle's own arrays (no join, so no plan of theirs depends on table statistics).

CREATE OR REPLACE FUNCTION queen.log_push_multi_v1(
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
    v_in_pids   int8[];
    v_ords      int4[];
    v_pids      int8[];
    v_windows   int4[];
    v_locked    int4;
    v_distinct  int4;
    v_ts        timestamptz;
    v_lasts     int8[];
    v_starts    int8[];
    v_res       jsonb[];
    v_o         int4;
    v_c         int4;
    v_opids     int8[];
    v_ows       int4[];
    v_out       jsonb;
    v_missing   int4;
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

    -- 2. Resolution (input order, NULL = missing); provisioning only if something is missing.
    v_in_pids := queen.log_partition_ids_v1(v_tenants, p_queues, p_partitions);

    IF array_position(v_in_pids, NULL) IS NOT NULL THEN
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
        FROM unnest(v_tenants, p_queues, p_partitions, v_in_pids) AS b(t, q, p, pid)
        JOIN queen.queues qu ON qu.tenant = b.t AND qu.name = b.q
        WHERE b.pid IS NULL
        ORDER BY qu.id, b.p
        ON CONFLICT (queue_id, name) DO NOTHING;

        v_in_pids := queen.log_partition_ids_v1(v_tenants, p_queues, p_partitions);
    END IF;

    -- 3. One set-based pre-lock of every partition row, ascending id (the global lock order),
    --    by primary key. A partition missing here vanished after provisioning.
    SELECT array_agg(i.ord ORDER BY i.pid), array_agg(i.pid ORDER BY i.pid),
           count(*), count(DISTINCT i.pid)
    INTO v_ords, v_pids, v_locked, v_distinct
    FROM unnest(v_in_pids) WITH ORDINALITY AS i(pid, ord)
    WHERE i.pid IS NOT NULL;

    IF v_distinct <> v_locked THEN
        RAISE EXCEPTION 'log_push_multi_v1: a partition appears more than once in the bundle (% segments, % distinct partitions)',
            v_locked, v_distinct
            USING ERRCODE = '21000';
    END IF;

    SELECT array_agg(l.dw ORDER BY l.id), array_agg(l.last_offset ORDER BY l.id),
           array_agg(l.txns_start ORDER BY l.id), count(*)
    INTO v_windows, v_lasts, v_starts, v_locked
    FROM (
        SELECT lp.id, qu.dedup_window AS dw, lp.last_offset, lp.txns_start
        FROM queen.log_partitions lp
        JOIN queen.queues qu ON qu.id = lp.queue_id
        WHERE lp.id = ANY (v_pids)
        ORDER BY lp.id
        FOR UPDATE OF lp
    ) l;

    IF v_locked <> n THEN
        RAISE EXCEPTION 'log_push_multi_v1: % of % partitions vanished before the pre-lock (queue deleted concurrently?)',
            n - v_locked, n
            USING ERRCODE = '40001';
    END IF;

    -- 4. The bundle timestamp, once, with every partition lock held.
    v_ts := clock_timestamp();

    -- 5. A segment with stored offsets its shard did not verify (window > 0, something above
    --    max(verified, txns_start - 1): the pre-lock read both under the row lock it holds
    --    from then on) needs the dedup probe, so it goes through log_push_one_v1 as before,
    --    ascending partition id. Every other segment is marked for the writes of step 6.
    v_res := array_fill(NULL::jsonb, ARRAY[n]);
    v_opids := array_fill(NULL::int8, ARRAY[n]);
    v_ows := array_fill(NULL::int4, ARRAY[n]);
    FOR k IN 1 .. n LOOP
        v_o := v_ords[k];
        v_c := p_msg_counts[v_o];
        v_ows[v_o] := v_windows[k];
        IF v_windows[k] > 0
           AND GREATEST(COALESCE(p_verified[v_o], 0), v_starts[k] - 1) < v_lasts[k] THEN
            v_res[v_o] := queen.log_push_one_v1(
                              v_pids[k], v_windows[k], v_c, p_hashes[v_o],
                              COALESCE(p_verified[v_o], 0), p_blobs[v_o], v_ts)
                          || jsonb_build_object('i', v_o - 1, 'w', v_windows[k]);
            CONTINUE;
        END IF;
        -- log_push_one_v1's own guards, same messages and SQLSTATE
        IF v_c < 1 THEN
            RAISE EXCEPTION 'log_push_one_v1: msg_count must be >= 1 (got %)', v_c
                USING ERRCODE = '22023';
        END IF;
        IF octet_length(p_hashes[v_o]) <> 16 * v_c THEN
            RAISE EXCEPTION 'log_push_one_v1: hash blob stride mismatch on partition %: % bytes for % frames (want %)',
                v_pids[k], octet_length(p_hashes[v_o]), v_c, 16 * v_c
                USING ERRCODE = '22023';
        END IF;
        v_opids[v_o] := v_pids[k];
    END LOOP;

    -- 6. The marked segments, one statement: log_push_one_v1's allocator UPDATE for all of
    --    them (`lp.id = ANY` keeps it a primary key probe whatever the join method), then
    --    their segment rows and sidecar rows (always, dedup or not: ack-by-transactionId
    --    resolves through it). Results in input order, and the completeness guard: every
    --    input ordinal has exactly one result.
    WITH a AS (
        UPDATE queen.log_partitions lp SET
            last_offset     = lp.last_offset + s.cnt,
            last_write_at   = CASE WHEN lp.last_write_at IS NULL
                                     OR clock_timestamp() - lp.last_write_at > interval '1 second'
                                   THEN clock_timestamp() ELSE lp.last_write_at END,
            last_created_at = GREATEST(lp.last_created_at, v_ts)
        FROM unnest(v_opids, p_msg_counts) WITH ORDINALITY AS s(pid, cnt, o)
        WHERE lp.id = ANY (v_opids) AND lp.id = s.pid
        RETURNING s.o, s.pid, s.cnt, lp.last_offset - s.cnt + 1 AS base,
                  lp.last_created_at AS created
    ), seg AS (
        INSERT INTO queen.log_segments (partition_id, base_offset, msg_count, created_at, payload)
        SELECT a.pid, a.base, a.cnt, a.created, b.blob
        FROM a JOIN unnest(p_blobs) WITH ORDINALITY AS b(blob, o) ON b.o = a.o
    ), txn AS (
        INSERT INTO queen.log_txns (partition_id, base_offset, msg_count, created_at, hashes)
        SELECT a.pid, a.base, a.cnt, a.created, h.hashes
        FROM a JOIN unnest(p_hashes) WITH ORDINALITY AS h(hashes, o) ON h.o = a.o
    )
    SELECT jsonb_agg(COALESCE(r.res, CASE WHEN a.base IS NOT NULL THEN jsonb_build_object(
               'pid', a.pid, 's', 'queued', 'base', a.base,
               'ts', (extract(epoch FROM a.created) * 1000000)::int8,
               'i', r.o - 1, 'w', r.w) END) ORDER BY r.o),
           count(*) FILTER (WHERE r.res IS NULL AND a.base IS NULL)
    INTO v_out, v_missing
    FROM unnest(v_res, v_ows) WITH ORDINALITY AS r(res, w, o)
    LEFT JOIN a ON a.o = r.o;
    IF v_missing <> 0 OR jsonb_array_length(v_out) <> n THEN
        RAISE EXCEPTION 'log_push_multi_v1: completeness guard: % inputs, % without a result',
            n, v_missing
            USING ERRCODE = 'P0004';
    END IF;

    RETURN v_out;
END
$$;

ALTER FUNCTION queen.log_push_multi_v1(text[], text[], int4[], bytea[], int8[], bytea[], uuid[])
    SET plan_cache_mode = force_generic_plan;
