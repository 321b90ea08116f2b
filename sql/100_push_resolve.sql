-- 100_push_resolve.sql: the push bundle resolves its partitions one index probe each.
--
-- Functions:
--   queen.log_partition_ids_v1(uuid[], text[], text[]) -> int8[]   (new)
--   queen.log_push_multi_v1(text[], text[], int4[], bytea[], int8[], bytea[], uuid[]),
--       replaced (same signature, result, lock order and SQLSTATEs as in 010_push.sql).
--
-- Why: 010 resolved (tenant, queue, partition) names with a join of unnest() against queues
-- and log_partitions, twice (the existence count, then the pre-lock). A cached generic plan of
-- that join, made while log_partitions had no statistics (a new database, a burst of new
-- partitions), probed log_partitions_queue_name_key on queue_id alone and filtered the names:
-- every bundle walked every partition of its queue, about 6 ms per statement with 1,000
-- partitions, which was most of the database time of a 1-item push (bench/README.md). Here each
-- name is resolved by a correlated scalar subquery, in which the partition name is a parameter
-- and so always part of the unique index condition; the pre-lock then takes the resolved ids
-- by primary key. One resolution serves both the provisioning skip and the pre-lock.
--
-- Result: as in 010_push.sql, and each element also carries "w": the queue's dedup window in
-- seconds (the shard's dedup filter, queen_mp/shards/dedupfilter.py, forgets by it).
--
-- Tables touched, lock order and isolation: as in 010_push.sql (provisioning
-- inserts ordered on their unique keys, then every partition row FOR UPDATE in ascending id in
-- one statement, then log_push_one_v1 per segment in ascending id).

-- ---------------------------------------------------------------------------------------------
-- log_partition_ids_v1: partition id per (tenant, queue, partition) name, input order, NULL
-- where it does not exist. Each lookup is a correlated subquery, so the names are parameters
-- of an equality on both unique keys whatever the statistics say.
-- ---------------------------------------------------------------------------------------------
CREATE FUNCTION queen.log_partition_ids_v1(p_tenants uuid[], p_queues text[], p_partitions text[])
RETURNS int8[]
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    -- plpgsql, not sql: its statement plan is cached per session (an SQL function's body is
    -- planned again at every call, 0.25 ms a bundle).
    RETURN (
        SELECT array_agg(
                   (SELECT lp.id
                    FROM queen.queues qu
                    JOIN queen.log_partitions lp ON lp.queue_id = qu.id AND lp.name = b.p
                    WHERE qu.tenant = b.t AND qu.name = b.q)
                   ORDER BY b.ord)
        FROM unnest(p_tenants, p_queues, p_partitions) WITH ORDINALITY AS b(t, q, p, ord));
END
$$;

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

    SELECT array_agg(l.dw ORDER BY l.id), count(*)
    INTO v_windows, v_locked
    FROM (
        SELECT lp.id, qu.dedup_window AS dw
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

    -- 5. Per segment, ascending partition id; results land in input order.
    v_res := array_fill(NULL::jsonb, ARRAY[n]);
    FOR k IN 1 .. n LOOP
        v_o := v_ords[k];
        v_res[v_o] := queen.log_push_one_v1(
                          v_pids[k], v_windows[k], p_msg_counts[v_o], p_hashes[v_o],
                          COALESCE(p_verified[v_o], 0), p_blobs[v_o], v_ts)
                      || jsonb_build_object('i', v_o - 1, 'w', v_windows[k]);
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

-- The dedup probe of log_push_one_v1 is one large statement whose custom plans cost about
-- 0.5 ms of planning per segment (most of a small bundle's database time); its generic plan is
-- the same shape (a primary key range scan of log_txns, the incoming hashes as a hashed
-- SubPlan), so the function always runs cached generic plans.
ALTER FUNCTION queen.log_push_one_v1(int8, int4, int4, bytea, int8, bytea, timestamptz)
    SET plan_cache_mode = force_generic_plan;

-- The same for the bundle's own statements (the pre-lock was planned anew at every call).
ALTER FUNCTION queen.log_push_multi_v1(text[], text[], int4[], bytea[], int8[], bytea[], uuid[])
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION queen.log_partition_ids_v1(uuid[], text[], text[])
    SET plan_cache_mode = force_generic_plan;
