-- push.sql: the push path (life-of-a-push.md sections 4 and 5).
--
-- Functions:
--   queen.log_push_multi_v3(int8[], text[], text[], int4[], bytea[], int8[], bytea[], uuid[])
--       -> int8[]: one bundle = N segments on N distinct partitions, one transaction (the
--       caller's): the shards (with the partition ids they cached) and the timer firer
--       (NULL ids) call it.
--   queen.log_push_multi_v1(text[], text[], int4[], bytea[], int8[], bytea[], uuid[]) -> jsonb
--       v3's answer (by name) as JSON objects, for the transaction wire (and so the streams cycle).
--   queen.log_push_one_v1(int8, int4, int4, bytea, int8, bytea, timestamptz) -> jsonb
--       THE allocator: the only place an offset is ever assigned (push bundles, the
--       transaction wire and the streams cycle all call it).
--   queen.log_segment_at_v1(int8, int8) -> table(base_offset, msg_count, created_at, payload)
--       the segment covering one offset (resolving a duplicate's original message id).
--
-- Tables touched:
--   queen.queues          read (tenant, name -> id, dedup_window); INSERT on provisioning only
--   queen.log_partitions  INSERT on provisioning only; SELECT ... FOR NO KEY UPDATE; UPDATE (allocator:
--                         last_offset, last_write_at quantised to 1 s, last_created_at) - HOT
--   queen.log_txns        read (dedup probe, primary key range); INSERT one row per segment
--   queen.log_segments    INSERT one row per segment; read by log_segment_at_v1
--   queen.log_consumers   UPDATE ready_at of the pushed partitions' caught-up cursors
--
-- Lock order (design.md invariant 4), log_push_multi_v3:
--   1. provisioning, only if some (tenant, queue, partition) is missing:
--      INSERT queues ... ORDER BY (tenant, name) ON CONFLICT DO NOTHING, then
--      INSERT log_partitions ... ORDER BY (queue_id, name) ON CONFLICT DO NOTHING
--      (speculative insertion locks taken in key order, BEFORE any partition row lock);
--   2. every partition row of the bundle in ONE statement, ORDER BY log_partitions.id
--      FOR NO KEY UPDATE OF the partition (queues rows are read, never locked; NO KEY, so a
--      cursor insert's foreign key check, FOR KEY SHARE, never waits for a push);
--   3. per segment that needs the dedup probe, ascending partition id: log_push_one_v1
--      re-locks its (already held) row; the other segments' allocator UPDATE is one statement.
--   4. the allocator UPDATE's statement (log_push_one_v1: the statement after it) sets
--      ready_at on the partitions' caught-up consumer rows (the ready index, pop.sql):
--      consumer rows after partition rows, the global order. A partition's creation inserts
--      the cursor rows of its queue's recorded groups (log_partitions_cursors), new rows
--      nobody else can hold.
--   log_push_one_v1 alone locks exactly one log_partitions row; a caller that pushes to several
--   partitions in one transaction must call it in ascending partition id order (or pre-lock).
--
-- SQLSTATEs raised:
--   22023  invalid_parameter_value: bundle arrays of different lengths; NULL queue/partition
--          name, msg_count or blob; msg_count < 1; hash blob not 16 x msg_count bytes (stride)
--   21000  cardinality_violation: the same partition appears twice in one bundle
--   40001  serialization_failure: a partition of the bundle vanished between provisioning and
--          the pre-lock (its queue was deleted concurrently); nothing committed, retryable
--   QM002  log_push_multi_v3: a cached partition id names no partition any more (deleted,
--          perhaps recreated under its name with a new id); nothing committed: name it again
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
--     input segment k plus "i": k (0-based input ordinal) and "w" (the queue's dedup window).
--     An empty bundle returns [].
--   log_push_multi_v3 (int8[], input order; the pgpush revision note below gives the layout): ids,
--     bases (0 = duplicate), ts, windows, then (segment, frame, offset) per duplicate frame.
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
--     A segment of up to 4 frames first searches those blobs for its hashes' bytes (in C)
--     and runs the probe only where they occur.
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
CREATE OR REPLACE FUNCTION queen.log_push_one_v1(
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
        FOR NO KEY UPDATE;
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
            -- A segment of a few frames first looks for its hashes' bytes anywhere in the
            -- range's blobs, position() once per stored row and hash, which is C: where no row
            -- holds them no stored frame can match, and the probe is not run. A find (a
            -- duplicate; or bytes across two stored hashes, or below v_lo in a row straddling
            -- it) runs the probe, which decides. PERF(push): the probe builds a row per stored
            -- hash. Backend CPU a call over 10,000 stored hashes (bench/pushsql.py --history,
            -- PostgreSQL 15): a 1-item push 16.8-18.2 -> 6.3-8.5 ms in 1-item segments, 5.3-5.5
            -- -> 1.4 ms in 100-item ones; a 4-item push 17.9-19.8 -> 10.3-14.7 and 4.6-4.8 ->
            -- 1.5-2.1 ms; 8-item pushes gained nothing (wall time).
            IF p_msg_count <= 4 AND NOT EXISTS (
                SELECT 1
                FROM queen.log_txns t
                CROSS JOIN generate_series(0, p_msg_count - 1) AS k
                WHERE t.partition_id = p_pid
                  AND t.base_offset >= v_first_row
                  AND t.base_offset <= v_last
                  AND t.created_at >= v_ts - make_interval(secs => p_window)
                  AND position(substr(p_hashes, k * 16 + 1, 16) IN t.hashes) > 0)
            THEN
                v_dups := NULL;
            ELSIF p_msg_count <= 8192 THEN
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

    -- The ready index's allocator half (pop.sql, log_ready_at_v1), in a statement after the
    -- one that took the row lock: the partition's caught-up cursors become ready at this
    -- segment. Their locks are taken in key order (design.md invariant 4, the order of ack
    -- fusion's): a plain UPDATE locks rows in the order its scan meets them, heap order under
    -- a sequential or bitmap scan, and deadlocked with an ack of two groups (cons8).
    UPDATE queen.log_consumers c SET ready_at = v_created
    FROM (SELECT k.consumer_group FROM queen.log_consumers k
          WHERE k.partition_id = p_pid AND k.ready_at IS NULL AND k.committed_offset < v_last
          ORDER BY k.consumer_group
          FOR UPDATE) o
    WHERE c.partition_id = p_pid AND c.consumer_group = o.consumer_group;

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

-- Revision (old migration 100_push_resolve.sql): the push bundle resolves its partitions one index probe each.
--
-- Functions:
--   queen.log_partition_ids_v1(uuid[], text[], text[]) -> int8[]   (new)
--   queen.log_push_multi_v1(text[], text[], int4[], bytea[], int8[], bytea[], uuid[]),
--       replaced (same signature, result, lock order and SQLSTATEs as in push.sql).
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
-- Result: as in push.sql, and each element also carries "w": the queue's dedup window in
-- seconds (the shard's dedup filter, queen_mp/shards/dedupfilter.py, forgets by it).
--
-- Tables touched, lock order and isolation: as in push.sql (provisioning
-- inserts ordered on their unique keys, then every partition row FOR NO KEY UPDATE in ascending id in
-- one statement, then log_push_one_v1 per segment in ascending id).

-- Revision (old migration 135_push_bundle_writes.sql): a push bundle writes its segments and sidecars with one
-- statement each, not one function call per segment.
--
-- Functions: queen.log_push_multi_v1(text[], text[], int4[], bytea[], int8[], bytea[], uuid[])
-- replaced (same signature, result, locks, lock order and SQLSTATEs as in
-- push.sql; log_push_one_v1 unchanged, still called for segments that need the
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

-- Revision (issue 26, pgpush): the bundle answers arrays, and its per-segment plpgsql is gone.
--
-- Functions:
--   queen.log_push_multi_v2(text[], text[], int4[], bytea[], int8[], bytea[], uuid[]) -> int8[]
--       (new: the live body; same arguments, locks, lock order and SQLSTATEs as v1)
--   queen.log_push_multi_v1(same) -> jsonb: now the jsonb form of v2's answer, for the
--       transaction wire (log_transaction_wire_v1) and tests that read the objects.
--
-- Why: bench/pushsql.py under callgrind (private cluster, 20 one-message segments a bundle):
-- about 5.0M instructions a bundle, of which the jsonb answer ~1.0M (jsonb_build_object looks
-- up the output function of every argument's type at every call, 34k instructions a segment;
-- the aggregate and its text output on top), and the step-5 loop of plpgsql around a handful
-- of array subscripts per segment. The shard then decoded the JSON again.
--
-- Now the pre-lock statement also joins each locked row to its input (ordinal, count, hash
-- blob, promise) and decides, set-based, the guards (msg_count, stride) and which segments
-- need the dedup probe; plpgsql loops only over those (rare: a partition the shard's filter
-- does not know). The answer is one int8[] of 4n + 3d elements, input order:
--   [1 .. n]         partition id of segment k
--   [n+1 .. 2n]      base offset of segment k, 0 = duplicate (offsets start at 1)
--   [2n+1 .. 3n]     ts: created_at of segment k in epoch microseconds (the bundle timestamp
--                    for a duplicate)
--   [3n+1 .. 4n]     the queue's dedup window in seconds
--   then d triples   (k - 1, frame index, offset of the stored original) per duplicate frame,
--                    ascending k then frame (log_push_one_v1's "dups")
-- An empty bundle answers '{}'. The completeness guard (P0004) holds as before.
--
-- Revision (issue 26, pg2): the bundle's fixed cost, three statements of fewer plan nodes.
--
-- Functions: queen.log_push_multi_v2 replaced (same signature, answer, locks, lock order and
-- SQLSTATEs).
--
-- Why: bench/pushsql.py under callgrind, main at 4f60f65: 3,734,019 instructions a 20x1
-- bundle, 1,074,680 a 1x1, 2,588,482 a 10x100. Nearly all of it is executor start-up and
-- per-row work of the three statements (resolution, pre-lock, writes): every plan node's
-- initialisation, every function of a ROWS FROM unnest, every ordered aggregate's own sort,
-- every column carried through a join, a hash table or a CTE's tuplestore costs per bundle or
-- per segment; the CHECK constraints of the three written tables (~160k a bundle) stay.
--
-- Now: the resolution returns each partition's dedup window with its id (the pre-lock no
-- longer joins queues); each statement unnests one array (names, ids) and takes every other
-- per-segment value by ordinal from the arguments (plpgsql expands array arguments, so a
-- subscript is a lookup), so no payload or hash blob crosses a join or a tuplestore; the
-- pre-lock aggregates no partition ids and sorts no probe list (its rows come in id order);
-- the answer aggregates the written segments alone, from one sort by ordinal, joined back to
-- every input ordinal only when a segment took the probe path. 20x1 3,151,390, 1x1 943,215,
-- 10x100 2,130,340. A bundle of one queue resolves the queue once (InitPlans) and each
-- partition with one index probe, and the pre-lock's guards are two aggregates (the lowest
-- bad partition id; the distinct partitions locked, a shortfall told apart on the error path
-- from the input): 20x1 3,027,679, 1x1 933,163, 10x100 2,077,387.

-- Revision (issue 26, shard9): the shard names its partitions by the ids it cached.
--
-- Functions: queen.log_push_multi_v3(int8[], text[], ...) -> int8[] (new: v2's body and
-- answer, with the partition ids first); log_push_multi_v2 dropped (its callers, the shards,
-- the timer firer and log_push_multi_v1, call v3).
--
-- Why: bench/pushsql.py under callgrind: the resolution of (tenant, queue, partition) names
-- was about 108k instructions a bundle plus 21k a segment (20x1 3.03M, 1x1 0.93M, 10x100
-- 2.08M a bundle). A shard pushes the same partitions again and again, and learns each id
-- from its verdicts.
--
-- Now: when every p_pids element is > 0, step 2 is skipped and the pre-lock takes the ids
-- as they are, reading each queue's window by primary key beside them; the names and
-- tenants may then be empty arrays (the shard sends none: three arrays less to build, send
-- and parse). Partition ids are bigserial, never reused, and a partition's queue and name
-- never change, so a live id is the partition the caller resolved; a deleted one (a
-- partition or queue deleted, perhaps recreated under the same name) is missing from the
-- pre-lock, and the statement raises QM002 before writing anything: the shard forgets the
-- bundle's ids and sends it again by name. NULL ids, or any element 0 or NULL: the names, as
-- before. bench/pushsql.py under callgrind, by cached ids: 20x1 3,025,953 -> 2,776,560,
-- 1x1 932,013 -> 853,769, 10x100 2,076,936 -> 1,906,498 (by name: 3,044,834, 946,569,
-- 2,092,092). Tried: the first segment's queue read once by two InitPlans, the queues probe
-- only for a segment of another queue: 20x1 2,732,659 but 1x1 912,618; not kept.

CREATE OR REPLACE FUNCTION queen.log_push_multi_v3(
    p_pids       int8[],
    p_queues     text[],
    p_partitions text[],
    p_msg_counts int4[],
    p_hashes     bytea[],
    p_verified   int8[],
    p_blobs      bytea[],
    p_tenants    uuid[] DEFAULT NULL
) RETURNS int8[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    c_default_tenant CONSTANT uuid := '00000000-0000-0000-0000-000000000000';
    n           int4 := COALESCE(cardinality(p_msg_counts), 0);
    n_names     int4 := COALESCE(cardinality(p_queues), 0);
    v_tenants   uuid[];
    v_in_pids   int8[];
    v_named     int4;
    v_distinct  int4;
    v_ts        timestamptz;
    v_bad_pid   int8;
    v_bad_len   int4;
    v_probe     int4[];
    v_ws        int4[];
    v_one       boolean := false;
    -- every partition named by a cached id: the names (and tenants) may be left empty
    v_known     boolean := (0 < ALL (p_pids)) IS TRUE;
    v_opids     int8[];
    v_ppids     int8[];
    v_res       jsonb;
    v_o         int4;
    v_k         int4;
    v_pids      int8[];
    v_bases     int8[];
    v_tss       int8[];
    v_wos       int8[];
    v_wbases    int8[];
    v_wtss      int8[];
    v_dups      int8[] := '{}';
    v_missing   int4;
BEGIN
    -- 1. Alignment guard: a silent misalignment would demux verdicts to the wrong requests.
    IF (n_names <> n AND NOT (v_known AND n_names = 0))
       OR COALESCE(cardinality(p_partitions), 0) <> n_names
       OR COALESCE(cardinality(p_hashes), 0) <> n
       OR COALESCE(cardinality(p_verified), 0) <> n
       OR COALESCE(cardinality(p_blobs), 0) <> n
       OR (p_tenants IS NOT NULL AND cardinality(p_tenants) <> n_names)
       OR (p_pids IS NOT NULL AND cardinality(p_pids) <> n) THEN
        RAISE EXCEPTION 'log_push_multi_v3: misaligned bundle arrays (pids %, queues %, partitions %, msg_counts %, hashes %, verified %, blobs %, tenants %)',
            cardinality(p_pids), cardinality(p_queues), cardinality(p_partitions),
            cardinality(p_msg_counts), cardinality(p_hashes), cardinality(p_verified),
            cardinality(p_blobs), cardinality(p_tenants)
            USING ERRCODE = '22023';
    END IF;
    IF n = 0 THEN
        RETURN '{}'::int8[];
    END IF;
    IF array_position(p_queues, NULL) IS NOT NULL
       OR array_position(p_partitions, NULL) IS NOT NULL
       OR array_position(p_msg_counts, NULL) IS NOT NULL
       OR array_position(p_hashes, NULL) IS NOT NULL
       OR array_position(p_blobs, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'log_push_multi_v3: NULL queue, partition, msg_count, hashes or blob in bundle'
            USING ERRCODE = '22023';
    END IF;

    IF v_known THEN
        NULL;  -- no names to resolve (step 2)
    ELSIF p_tenants IS NULL THEN
        v_tenants := array_fill(c_default_tenant, ARRAY[n]);
    ELSIF array_position(p_tenants, NULL) IS NOT NULL THEN
        SELECT array_agg(COALESCE(t.t, c_default_tenant) ORDER BY t.o) INTO v_tenants
        FROM unnest(p_tenants) WITH ORDINALITY AS t(t, o);
    ELSE
        v_tenants := p_tenants;
    END IF;

    -- 2. Resolution (input order, NULL = missing): partition id and the queue's dedup window;
    --    provisioning only if something is missing, then the names resolved once more. The
    --    names are parameters of an equality on both unique keys whatever the statistics say
    --    (old migration 100, below), in one of two shapes:
    --      * every segment of one queue (a shard's bundle of 1-item pushes, mostly): the queue
    --        once, two uncorrelated sub-selects (InitPlans), and each partition by a correlated
    --        scalar sub-select on (queue_id, name): one index probe a segment, not two
    --        (bench/pushsql.py 20x1: 3.15M -> 3.04M instructions; the test costs a 1x1 4k);
    --      * otherwise each name by a LATERAL subquery kept apart by OFFSET 0: the lateral
    --        reference makes it the inner side of a nested loop over the unnest.
    --    array_agg keeps the unnest's order (no ORDER BY, no sort). The window comes with the
    --    id, so the pre-lock no longer joins queues (a primary key probe a segment). Inline,
    --    not a function of its own: a nested plpgsql call with its own SET clause cost about
    --    20k instructions a bundle (bench/pushsql.py).
    --    Skipped when the caller names every partition by a live id it cached (the shard,
    --    from its earlier verdicts; ids are never reused): the pre-lock then reads the
    --    windows, and answers QM002 if an id is gone.
    IF n > 1 AND NOT v_known THEN
        v_one := v_tenants[1] = ALL (v_tenants) AND p_queues[1] = ALL (p_queues);
    END IF;
    FOR v_round IN 1..2 LOOP
        IF v_known THEN
            v_in_pids := p_pids;
            EXIT;
        END IF;
        IF v_one THEN
            SELECT array_agg((SELECT lp.id FROM queen.log_partitions lp
                              WHERE lp.queue_id = (SELECT qu.id FROM queen.queues qu
                                                   WHERE qu.tenant = v_tenants[1]
                                                     AND qu.name = p_queues[1])
                                AND lp.name = b.p)),
                   array_fill((SELECT qu.dedup_window FROM queen.queues qu
                               WHERE qu.tenant = v_tenants[1] AND qu.name = p_queues[1]),
                              ARRAY[n])
            INTO v_in_pids, v_ws
            FROM unnest(p_partitions) AS b(p);
        ELSE
            SELECT array_agg(r.id), array_agg(r.dw)
            INTO v_in_pids, v_ws
            FROM unnest(p_partitions) WITH ORDINALITY AS b(p, o)
            LEFT JOIN LATERAL (
                SELECT lp.id, qu.dedup_window AS dw
                FROM queen.queues qu
                JOIN queen.log_partitions lp ON lp.queue_id = qu.id AND lp.name = b.p
                WHERE qu.tenant = v_tenants[b.o] AND qu.name = p_queues[b.o]
                OFFSET 0
            ) r ON true;
        END IF;
        EXIT WHEN v_round = 2 OR array_position(v_in_pids, NULL) IS NULL;

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
    END LOOP;

    -- 3. One set-based pre-lock of every partition row, ascending id (the global lock order),
    --    by primary key, joined back to its input segment. A partition missing here vanished
    --    after provisioning. Per segment it decides (under the row lock, held from then on):
    --      * the guards of log_push_one_v1 (msg_count >= 1, 16 x msg_count bytes of hashes);
    --      * the probe: window > 0 and offsets stored above max(verified, txns_start - 1),
    --        which the shard did not verify: those go through log_push_one_v1 (ascending id);
    --        every other segment goes to the set-based writes of step 5.
    --    A partition named twice in the bundle joins twice (its row is locked once).
    --    Each segment's count, hashes and promise are taken by its ordinal from the arguments
    --    (expanded arrays: a subscript is a lookup; a second unnest joined by ordinal was
    --    rescanned per row, n^2 rows, and carrying them through the join copied the hashes).
    --    The probe list comes in ascending id, the order of the locked subquery's rows, which
    --    an aggregate without ORDER BY keeps (its own ORDER BY would sort them again); the
    --    set-based segments are the input's partitions less those.
    --    With cached ids the same statement also reads each queue's window (a primary key
    --    probe a segment) and aggregates them in input order.
    IF v_known THEN
        SELECT count(DISTINCT l.id), min(l.id) FILTER (WHERE l.bad),
               array_agg(l.o) FILTER (WHERE l.probe), array_agg(l.dw ORDER BY l.o)
        INTO v_distinct, v_bad_pid, v_probe, v_ws
        FROM (
            SELECT lp.id, i.o, qu.dedup_window AS dw,
                   p_msg_counts[i.o] < 1
                   OR octet_length(p_hashes[i.o]) <> 16 * p_msg_counts[i.o] AS bad,
                   qu.dedup_window > 0
                   AND GREATEST(COALESCE(p_verified[i.o], 0), lp.txns_start - 1)
                       < lp.last_offset AS probe
            FROM queen.log_partitions lp
            JOIN unnest(v_in_pids) WITH ORDINALITY AS i(pid, o) ON i.pid = lp.id
            JOIN queen.queues qu ON qu.id = lp.queue_id
            WHERE lp.id = ANY (v_in_pids)
            ORDER BY lp.id
            FOR NO KEY UPDATE OF lp
        ) l;
    ELSE
        SELECT count(DISTINCT l.id), min(l.id) FILTER (WHERE l.bad),
               array_agg(l.o) FILTER (WHERE l.probe)
        INTO v_distinct, v_bad_pid, v_probe
        FROM (
            SELECT lp.id, i.o,
                   p_msg_counts[i.o] < 1
                   OR octet_length(p_hashes[i.o]) <> 16 * p_msg_counts[i.o] AS bad,
                   v_ws[i.o] > 0
                   AND GREATEST(COALESCE(p_verified[i.o], 0), lp.txns_start - 1)
                       < lp.last_offset AS probe
            FROM queen.log_partitions lp
            JOIN unnest(v_in_pids) WITH ORDINALITY AS i(pid, o) ON i.pid = lp.id
            WHERE lp.id = ANY (v_in_pids)
            ORDER BY lp.id
            FOR NO KEY UPDATE OF lp
        ) l;
    END IF;

    IF v_distinct <> n THEN
        -- A partition named twice, or one that vanished: the input tells which.
        SELECT count(DISTINCT x.pid) INTO v_named
        FROM unnest(v_in_pids) AS x(pid) WHERE x.pid IS NOT NULL;
        IF v_named <> cardinality(array_remove(v_in_pids, NULL)) THEN
            RAISE EXCEPTION 'log_push_multi_v3: a partition appears more than once in the bundle (% segments, % distinct partitions)',
                n, v_named
                USING ERRCODE = '21000';
        END IF;
        IF v_known THEN
            -- A cached id whose partition was deleted (perhaps recreated under its name with
            -- a new id): nothing is written; the caller forgets its ids and names them.
            RAISE EXCEPTION 'log_push_multi_v3: % of % cached partition ids are gone',
                n - v_distinct, n
                USING ERRCODE = 'QM002';
        END IF;
        RAISE EXCEPTION 'log_push_multi_v3: % of % partitions vanished before the pre-lock (queue deleted concurrently?)',
            n - v_distinct, n
            USING ERRCODE = '40001';
    END IF;
    IF v_bad_pid IS NOT NULL THEN
        -- log_push_one_v1's own guards, same messages and SQLSTATE (lowest partition id first)
        SELECT b.cnt, octet_length(b.h) INTO v_k, v_bad_len
        FROM unnest(v_in_pids, p_msg_counts, p_hashes) AS b(pid, cnt, h)
        WHERE b.pid = v_bad_pid;
        IF v_k < 1 THEN
            RAISE EXCEPTION 'log_push_one_v1: msg_count must be >= 1 (got %)', v_k
                USING ERRCODE = '22023';
        END IF;
        RAISE EXCEPTION 'log_push_one_v1: hash blob stride mismatch on partition %: % bytes for % frames (want %)',
            v_bad_pid, v_bad_len, v_k, 16 * v_k
            USING ERRCODE = '22023';
    END IF;

    -- 4. The bundle timestamp, once, with every partition lock held.
    v_ts := clock_timestamp();

    -- The probe path, ascending partition id: log_push_one_v1 as before. Its answers are
    -- spliced into the result arrays of step 5 by ordinal.
    v_opids := v_in_pids;
    IF v_probe IS NOT NULL THEN
        v_bases := array_fill(NULL::int8, ARRAY[n]);
        v_tss := array_fill(NULL::int8, ARRAY[n]);
        FOREACH v_o IN ARRAY v_probe LOOP
            v_opids[v_o] := NULL;
            v_res := queen.log_push_one_v1(
                         v_in_pids[v_o], v_ws[v_o], p_msg_counts[v_o], p_hashes[v_o],
                         COALESCE(p_verified[v_o], 0), p_blobs[v_o], v_ts);
            v_bases[v_o] := COALESCE((v_res ->> 'base')::int8, 0);
            v_tss[v_o] := (v_res ->> 'ts')::int8;
            IF v_res ? 'dups' THEN
                v_dups := v_dups || ARRAY(
                    SELECT x FROM jsonb_array_elements(v_res -> 'dups') WITH ORDINALITY AS d(e, r),
                         LATERAL unnest(ARRAY[(v_o - 1)::int8, (d.e ->> 'i')::int8,
                                              (d.e ->> 'off')::int8]) WITH ORDINALITY AS u(x, c)
                    ORDER BY d.r, u.c);
            END IF;
        END LOOP;
        IF cardinality(v_dups) > 0 THEN
            -- ascending segment ordinal (the probe ran in partition id order)
            SELECT array_agg(u.x ORDER BY t.k, t.f, u.c) INTO v_dups
            FROM (SELECT v_dups[3 * r - 2] AS k, v_dups[3 * r - 1] AS f, r
                  FROM generate_series(1, cardinality(v_dups) / 3) AS r) t,
                 LATERAL unnest(ARRAY[v_dups[3 * t.r - 2], v_dups[3 * t.r - 1],
                                      v_dups[3 * t.r]]) WITH ORDINALITY AS u(x, c);
        END IF;
    END IF;

    -- 5. The other segments, one statement: log_push_one_v1's allocator UPDATE for all of
    --    them (`lp.id = ANY` keeps it a primary key probe whatever the join method), then
    --    their segment rows and sidecar rows (always, dedup or not: ack-by-transactionId
    --    resolves through it). Results in input order, and the completeness guard: every
    --    input ordinal has exactly one result. PERF(queen): the inserts take each blob and
    --    hash blob by ordinal from the arguments (plpgsql holds array arguments expanded, so
    --    a subscript is a lookup), not through the allocator's rows: the hash join and the
    --    CTE's tuplestore copied every payload twice.
    WITH a AS (
        UPDATE queen.log_partitions lp SET
            last_offset     = lp.last_offset + p_msg_counts[s.o],
            last_write_at   = CASE WHEN lp.last_write_at IS NULL
                                     OR clock_timestamp() - lp.last_write_at > interval '1 second'
                                   THEN clock_timestamp() ELSE lp.last_write_at END,
            last_created_at = GREATEST(lp.last_created_at, v_ts)
        FROM unnest(v_opids) WITH ORDINALITY AS s(pid, o)
        WHERE lp.id = ANY (v_opids) AND lp.id = s.pid
        RETURNING s.o, s.pid, p_msg_counts[s.o] AS cnt,
                  lp.last_offset - p_msg_counts[s.o] + 1 AS base,
                  lp.last_offset AS last, lp.last_created_at AS created
    ), rdy AS (
        -- The ready index's allocator half (pop.sql, log_ready_at_v1): the caught-up cursors
        -- of these partitions become ready at the new segment. This statement's snapshot was taken
        -- after step 3 locked the partition rows, which the protocol requires. A primary key
        -- probe per partition, ascending id (the global order of consumer rows); no `= ANY`
        -- beside the join key, or each probe would descend once per element of the array.
        UPDATE queen.log_consumers c SET ready_at = g.created
        FROM (SELECT a.pid, a.last, a.created FROM a ORDER BY a.pid) g
        WHERE c.partition_id = g.pid AND c.ready_at IS NULL AND c.committed_offset < g.last
    ), seg AS (
        INSERT INTO queen.log_segments (partition_id, base_offset, msg_count, created_at, payload)
        SELECT a.pid, a.base, a.cnt, a.created, p_blobs[a.o] FROM a
    ), txn AS (
        INSERT INTO queen.log_txns (partition_id, base_offset, msg_count, created_at, hashes)
        SELECT a.pid, a.base, a.cnt, a.created, p_hashes[a.o] FROM a
    )
    -- Every answered segment's partition is its input's (v_in_pids) and its window was read
    -- by the resolution (v_ws): only the written segments' ordinals, bases and timestamps
    -- are aggregated, in input order from one sort (an aggregate's own ORDER BY sorts apart;
    -- a join back to every input ordinal cost a function scan, a sort and a merge join).
    SELECT array_agg(w.o), array_agg(w.base), array_agg(w.ts)
    INTO v_wos, v_wbases, v_wtss
    FROM (SELECT a.o, a.base, (extract(epoch FROM a.created) * 1000000)::int8 AS ts
          FROM a ORDER BY a.o) w;
    IF v_probe IS NOT NULL THEN
        -- Rare: the probe path's answers and these, by ordinal.
        SELECT array_agg(COALESCE(r.base, w.base) ORDER BY r.o),
               array_agg(COALESCE(r.ts, w.ts) ORDER BY r.o)
        INTO v_wbases, v_wtss
        FROM unnest(v_bases, v_tss) WITH ORDINALITY AS r(base, ts, o)
        LEFT JOIN unnest(v_wos, v_wbases, v_wtss) AS w(o, base, ts) ON w.o = r.o;
    END IF;
    v_pids := v_in_pids || v_wbases || v_wtss || v_ws || v_dups;
    -- The completeness guard: every input ordinal has exactly one result (a's ordinals are
    -- distinct: each input row joins one partition row, updated once).
    v_missing := n - COALESCE(cardinality(v_wos), 0) - COALESCE(cardinality(v_probe), 0);
    IF v_missing <> 0 OR cardinality(v_pids) < 4 * n
       OR array_position(v_pids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'log_push_multi_v3: completeness guard: % inputs, % without a result',
            n, v_missing
            USING ERRCODE = 'P0004';
    END IF;

    RETURN v_pids;
END
$$;

COMMENT ON FUNCTION queen.log_push_multi_v3(int8[], text[], text[], int4[], bytea[], int8[], bytea[], uuid[]) IS
'Push one bundle (one segment per distinct partition), named by cached partition ids (all > 0; '
'names and tenants may then be empty; QM002 if one is gone) or else by names. Returns int8[]: '
'n partition ids, n base '
'offsets (0 = duplicate), n timestamps (epoch us), n dedup windows, then a (segment, frame, '
'original offset) triple per duplicate frame; input order.';

-- log_push_multi_v1: v2's answer as the JSON array of objects the transaction wire embeds in
-- its own answer ({"i","pid","s","base","ts","w"[,"dups"]}, input order; [] when empty).
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
    v   int8[] := queen.log_push_multi_v3(NULL, p_queues, p_partitions, p_msg_counts,
                                          p_hashes, p_verified, p_blobs, p_tenants);
    n   int4 := COALESCE(cardinality(p_queues), 0);
BEGIN
    RETURN COALESCE((
        SELECT jsonb_agg(
                   CASE WHEN v[n + k] > 0
                        THEN jsonb_build_object('i', k - 1, 'pid', v[k], 's', 'queued',
                                                'base', v[n + k], 'ts', v[2 * n + k],
                                                'w', v[3 * n + k])
                        ELSE jsonb_build_object('i', k - 1, 'pid', v[k], 's', 'duplicate',
                                                'base', NULL, 'ts', v[2 * n + k],
                                                'w', v[3 * n + k], 'dups', (
            SELECT jsonb_agg(jsonb_build_object('i', v[4 * n + 3 * r - 1],
                                                'off', v[4 * n + 3 * r]) ORDER BY r)
            FROM generate_series(1, (cardinality(v) - 4 * n) / 3) AS r
            WHERE v[4 * n + 3 * r - 2] = k - 1)) END
                   ORDER BY k)
        FROM generate_series(1, n) AS k), '[]'::jsonb);
END
$$;

COMMENT ON FUNCTION queen.log_push_multi_v1(text[], text[], int4[], bytea[], int8[], bytea[], uuid[]) IS
'log_push_multi_v3 answered as a JSON array in input order of '
'{"i","pid","s","base","ts","w"[,"dups"]} (see log_push_one_v1).';

-- ---------------------------------------------------------------------------------------------
-- log_segment_at_v1: the segment covering p_off (base_offset <= p_off < base_offset +
-- msg_count); zero rows if it was retained away or never existed. One backward PK probe.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_segment_at_v1(p_pid int8, p_off int8)
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

-- (old migration 100_push_resolve.sql: its note is above log_push_multi_v1.)

-- (log_partition_ids_v1, the resolution of old migration 100, is inline in log_push_multi_v3.)

-- The dedup probe of log_push_one_v1 is one large statement whose custom plans cost about
-- 0.5 ms of planning per segment (most of a small bundle's database time); its generic plan is
-- the same shape (a primary key range scan of log_txns, the incoming hashes as a hashed
-- SubPlan), so the function always runs cached generic plans.
ALTER FUNCTION queen.log_push_one_v1(int8, int4, int4, bytea, int8, bytea, timestamptz)
    SET plan_cache_mode = force_generic_plan;

-- The same for the bundle's own statements (the pre-lock was planned anew at every call).
ALTER FUNCTION queen.log_push_multi_v3(int8[], text[], text[], int4[], bytea[], int8[], bytea[], uuid[])
    SET plan_cache_mode = force_generic_plan;

-- Revision (old migration 115_dedup_recall.sql): stored transaction hashes of an offset range, for a shard's dedup
-- filter (queen_mp/shards/dedupfilter.py).
--
-- Functions: queen.log_txn_hashes_v1(int8[], int8[], int8[], int4[])
--     -> table(ask int4, base_offset int8, age_s float8, hashes bytea)
--   per ask k (1-based) = (partition id, lo, below, seconds): the partition's log_txns rows
--   with lo <= base_offset < below and created_at inside the last `seconds`, ascending offset;
--   age_s = now() - created_at in seconds.
--
-- Why: offsets a shard did not write itself (before it first saw the partition: a restart,
-- an eviction; in between its own: a transaction, a timer, another broker instance) are a gap
-- in what its filter knows, and a promise to log_push_one_v1 must stop below a gap. Without a
-- way to learn the gap, every push to the partition probed every stored hash of the window
-- for a whole window (bench/README.md); reading the gap's rows once costs what one probe of
-- them costs.
--
-- Visibility: the caller asks below the base of a segment it committed itself; offsets are
-- allocated under the partition row lock, so every row of the gap was committed before that
-- segment and is visible to this statement. Gaps start at a segment boundary (the offset
-- after one of the caller's own segments, or 1).
--
-- Tables touched: queen.log_txns (read, one primary key range per ask). Lock order: none.
-- SQLSTATEs raised: none.

CREATE OR REPLACE FUNCTION queen.log_txn_hashes_v1(p_pids int8[], p_los int8[], p_belows int8[],
                                        p_secs int4[])
RETURNS TABLE (ask int4, base_offset int8, age_s float8, hashes bytea)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT r.k::int4, t.base_offset, extract(epoch FROM now() - t.created_at)::float8,
           t.hashes
    FROM unnest(p_pids, p_los, p_belows, p_secs) WITH ORDINALITY AS r(pid, lo, below, secs, k)
    JOIN queen.log_txns t
      ON t.partition_id = r.pid
     AND t.base_offset >= r.lo
     AND t.base_offset < r.below
     AND t.created_at >= now() - make_interval(secs => r.secs)
    ORDER BY r.k, t.base_offset
$$;
