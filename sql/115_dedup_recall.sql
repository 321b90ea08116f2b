-- 115_dedup_recall.sql: stored transaction hashes of an offset range, for a shard's dedup
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

CREATE FUNCTION queen.log_txn_hashes_v1(p_pids int8[], p_los int8[], p_belows int8[],
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
