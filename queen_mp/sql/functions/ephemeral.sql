-- ephemeral.sql: ephemeral queues (api.md "Ephemeral queues", routes /api/v1/ephemeral/*) on the
-- UNLOGGED tables of schema/008_ephemeral.sql, 009_ephemeral_rows.sql, 011_ephemeral_chunks.sql,
-- 012_ephemeral_uncompressed.sql, 013_ephemeral_leases_inline.sql and 015_ephemeral_bodies.sql.
-- Python
-- (queen_mp/models/ephemeral.py) validates every input first; queen_mp/db/ephemeral_procs.py is
-- the only caller.
--
-- Model: one ring per (tenant, queue): messages in partitions, numbered by a seq that grows in
-- push commit order within a partition (a push holds its partition's row while it takes the
-- seqs and commits; seqs are unique in the database). Every consumer group ('__QUEUE_MODE__'
-- without one) has a cursor per partition (every seq <= pos was handed out to it) and leases
-- on what it was given and has not acknowledged. So groups fan out (each sees every message)
-- and the consumers of one group compete: a pop takes a partition's new messages under its
-- group's cursor row, skipping cursors that another pop holds. A message is deleted once every
-- group that has popped the queue is past it and holds no lease on it, or earlier by the
-- queue's bounds (maxLength/maxBytes with policy dropOldest), its ttlSeconds, or after
-- retryLimit redeliveries; each drop is counted.
--
-- Messages are stored by the chunk: one eph_chunks row holds up to 256 consecutive messages of
-- one partition (one push), and message s lives in the chunk whose base is s - s % 256. A pop
-- reads a range of a chunk; a message that leaves (settled, dropped) joins the chunk's 'gone'
-- set, under the chunk's row lock, and the chunk row is deleted with its last message. Per
-- push of n messages that is ceil(n / 256) rows inserted and, once every group is done with
-- them, about as many updates and deletes, where a row per message cost n of each. A chunk's
-- payloads are one byte string (body: their UTF-8 bytes joined by 0x1e, as a pop answers
-- them) with each message's byte offset (offs), so a pop's run of a chunk is one substring.
--
-- No call locks a row that every call of the queue needs: depth, bytes and drop counts are
-- summed over the queue's eph_counts rows, each writer adding to the row of its backend. The
-- bounds are therefore checked against the committed state: pushes that run at the same time
-- do not see each other, so a queue may exceed maxLength (maxBytes) by the messages (bytes)
-- of the pushes that ran concurrently with the one that filled it; sequential pushes are
-- checked exactly.
--
-- Leases are per delivery: the messages of one partition that one pop handed out to a group
-- are one eph_leases row (their seqs and delivery counts), acknowledged out of it one by one;
-- a row costs a pop one insert and its ack one delete, whatever the batch.
--
-- Message ids are '<epoch>-<seq>-<dlv>': the epoch is the queue row's incarnation (new at
-- creation and at reset, and the row is gone after a PostgreSQL crash), so an ack of an older
-- incarnation answers 'stale'; dlv names the delivery (0 with autoAck: none), so an ack of a
-- delivery that was redelivered since finds nothing ('unknown').
--
-- Functions:
--   queen.eph_defaults_v1() -> jsonb                      the options of an undeclared queue
--   queen.eph_options_v1(uuid, text) -> jsonb             effective options (defaults || declared)
--   queen.eph_key_v1(uuid, text) -> int8                  the queue's advisory lock key
--   queen.eph_enter_v1(uuid, text) -> text                shared lock of the queue, its row
--                                                         created if missing; its epoch
--   queen.eph_head_v1(uuid, text) -> (epoch, options, depth, bytes)  a push's first read
--   queen.eph_count_v2(uuid, text, int8 x5) -> int2      add to this backend's counter row
--   queen.eph_width_v1(int4multirange) -> int8            how many int4 it holds
--   queen.eph_strike_v1(int8[], int8[], int4multirange[]) -> (n, bytes)  mark chunks' messages
--                                                         gone
--   queen.eph_unlease_v1(uuid, text, text[], int8[]) -> void  take partitions' prefixes out
--                                                         of their deliveries
--   queen.eph_cut_v2(uuid, text, text[], int8[], int8[]) -> (n, bytes, aged_n, aged_bytes)
--                                                         then drop them
--   queen.eph_expired_v1(uuid, text, int4) -> (parts, belows, n, bytes)  what ttlSeconds drops
--   queen.eph_oldest_v1(uuid, text, int8, int8, text[], int8[]) -> int8  dropOldest: the end
--                                                         of the prefix that makes room
--   queen.eph_settle_v3(uuid, text, text[], int8[], boolean) -> (n, bytes)  strike those no
--                                                         group needs
--   (these return what they struck; their caller counts it with the rest, once, last)
--   queen.eph_configure_v1(uuid, text, jsonb) -> jsonb    declare (upsert eph_config)
--   queen.eph_push_v3(uuid, text, text, bytea, int4[]) -> int4  append; QE001 when full
--                                                         (policy reject)
--   queen.eph_push_v5(uuid[], text[], text[], int4[], int8[], int4[], bytea, uuid[], text[],
--                     int8[], int8[], int4[], text[], int4[], int4[])
--       -> (pushed int4[], details text[])                several pushes fused in one call
--   queen.eph_pop_v5(uuid, text, text, text, int4, boolean)
--       -> (epoch text, parts text[], dlvs int8[], atts int4[], firsts int8[], counts int4[],
--           payloads bytea, claimed int4, wake_in_ms int8, window_ms int4, window_count int4)
--   queen.eph_ack_v5(uuid, text, text, text[], text, int8[], text[])
--       -> (outcomes text[], redelivered int4)    outcomes NULL: every id acked
--   queen.eph_reset_v1(uuid, text) -> int8                dropped messages
--   queen.eph_delete_v1(uuid, text) -> jsonb              {deleted, declared}
--   queen.eph_gauges_v1(uuid, text) -> jsonb              one queue's gauges
--   queen.eph_list_v1(uuid, int4) -> jsonb                {queues, count, truncated}
--   queen.eph_depth_v1(uuid, text, int4) -> jsonb         NULL when the queue does not exist
--
-- Tables touched: queen.eph_config (configure, delete: write; the rest: read),
--   queen.eph_queues, eph_counts, eph_partitions, eph_groups, eph_cursors, eph_leases,
--   eph_chunks; the sequence queen.eph_seq.
--
-- Lock order (no function but eph_push_v5 touches two queues, and it takes the locks of each
--   level below in one global order, (tenant, queue[, partition]) bytewise, so that two of
--   its calls never hold two locks of one level in opposite orders; these tables are outside
--   every lock space of the durable log):
--   0. the queue's transaction advisory lock (eph_key_v1): shared for push, pop, ack and
--      configure, exclusive for reset and delete, which so never see a call half done;
--   1. lease rows, ascending by dlv, in one run (ack, drops; a pop's redeliveries take them
--      SKIP LOCKED); then, except in a pop, chunk rows, by partition then base, in one run
--      (settle, drops). A push's ttl and bounds drops are one run of each, not one of each
--      per drop: the second run went back to rows lower than the first held;
--   2. a partition row (push only, FOR NO KEY UPDATE, one per call, after its drops; a fused
--      push, eph_push_v5, takes several, after its queues' locks of 0 in one run: queue by
--      queue in (tenant, queue) order, a queue's in its primary key's order, and drops
--      nothing); or
--      a pop's groups and cursor rows (inserted, then FOR NO KEY UPDATE SKIP LOCKED, and a
--      pop that holds none may then wait for one); then a pop's chunk rows, its ttl drop's
--      and its settle's in one run: no holder of a chunk row waits for a cursor or partition
--      (a pop reads chunks unlocked, and struck its ttl drop's chunks first no longer);
--   3. one eph_counts row (this backend's), last, once per call (eph_push_v5: one per queue,
--      in queue order).
--   Nobody holding a cursor or partition row waits for a lease row, and nobody waits for
--   anything while holding its counts row, so no two calls deadlock.
--   tests/integration/test_ephemeral_locks.py drives each cycle that these rules once broke.
--
-- Plans: push (v1 and v2), pop and ack (and the functions they call) run with plan_cache_mode
--   force_generic_plan. Their statements take arrays as parameters, and a custom plan, which
--   knows an array's length, always looks cheaper than the generic one: PostgreSQL then
--   planned them again at every call (measured: a fifth of a pop's CPU per message, a third of
--   an ack's). Every statement here finds its rows by key, which a generic plan does as well.
--
-- SQLSTATEs raised:
--   QE001  eph_push_v3: the queue is at maxLength/maxBytes and its policy is 'reject', or the
--          push alone is larger than the queue's bounds. MESSAGE 'queue_full', DETAIL says which.
--   QE002  eph_push_v5: a queue or partition has no row yet; push each with eph_push_v3.
--   22023  eph_push_v3: more than 16,384 messages in one push (the API allows 10,000).

CREATE OR REPLACE FUNCTION queen.eph_defaults_v1()
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT '{"maxBytes": 67108864, "maxLength": 100000, "policy": "reject", "ttlSeconds": 0,
             "leaseSeconds": 30, "retryLimit": 3, "windowBuffer": {"ms": 0, "count": 0}}'::jsonb
$$;

-- PERF(eph): plpgsql, so that its plan is cached by the session; a SQL function with a
-- subquery is not inlined, and was planned again at each of the two or three calls a push, pop
-- or ack makes (about a third of a push's CPU in PostgreSQL).
CREATE OR REPLACE FUNCTION queen.eph_options_v1(p_tenant uuid, p_queue text)
RETURNS jsonb
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    RETURN queen.eph_defaults_v1()
        || coalesce((SELECT c.options FROM queen.eph_config c
                      WHERE c.tenant = p_tenant AND c.queue = p_queue), '{}'::jsonb);
END;
$$;

CREATE OR REPLACE FUNCTION queen.eph_key_v1(p_tenant uuid, p_queue text)
RETURNS int8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT hashtextextended('queen.eph:' || p_tenant::text || ':' || p_queue, 0)
$$;

CREATE OR REPLACE FUNCTION queen.eph_enter_v1(p_tenant uuid, p_queue text)
RETURNS text
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_epoch text;
BEGIN
    -- PERF(eph): the try is a simple expression, where PERFORM ran a query; it fails only
    -- while a reset or delete holds the lock (or waits for it), and the wait is then taken
    IF NOT pg_try_advisory_xact_lock_shared(queen.eph_key_v1(p_tenant, p_queue)) THEN
        PERFORM pg_advisory_xact_lock_shared(queen.eph_key_v1(p_tenant, p_queue));
    END IF;
    SELECT q.epoch INTO v_epoch FROM queen.eph_queues q
     WHERE q.tenant = p_tenant AND q.queue = p_queue;
    IF FOUND THEN
        RETURN v_epoch;
    END IF;
    INSERT INTO queen.eph_queues (tenant, queue, epoch)
    VALUES (p_tenant, p_queue, substr(replace(gen_random_uuid()::text, '-', ''), 1, 16))
    ON CONFLICT DO NOTHING;
    SELECT q.epoch INTO v_epoch FROM queen.eph_queues q
     WHERE q.tenant = p_tenant AND q.queue = p_queue;
    RETURN v_epoch;
END;
$$;

-- What a push reads of its queue first: its epoch, options and counts (no row: the queue has
-- no row yet). PERF(eph): a SQL function of one SELECT, inlined into the caller's statement
-- (no call of its own); eph_enter_v1, eph_options_v1 and the sum were three statements.
CREATE OR REPLACE FUNCTION queen.eph_head_v1(p_tenant uuid, p_queue text)
RETURNS TABLE (epoch text, options jsonb, depth int8, bytes int8)
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT q.epoch, queen.eph_defaults_v1() || coalesce(c.options, '{}'::jsonb), n.depth,
           n.bytes
      FROM queen.eph_queues q
      LEFT JOIN queen.eph_config c ON c.tenant = q.tenant AND c.queue = q.queue
     CROSS JOIN LATERAL (SELECT coalesce(sum(k.depth), 0)::int8 AS depth,
                                coalesce(sum(k.bytes), 0)::int8 AS bytes
                           FROM queen.eph_counts k
                          WHERE k.tenant = q.tenant AND k.queue = q.queue) n
     WHERE q.tenant = p_tenant AND q.queue = p_queue
$$;

-- PERF(eph): a backend adds to its own row of the queue's 16, so concurrent calls rarely wait
-- for one another here; readers sum the rows. plpgsql for its cached plan (see options). It
-- answers the slot it added to, so that a caller assigns its call, a simple expression, where
-- PERFORM of a void function ran a query around the call (v1: some 20,000 instructions).
CREATE OR REPLACE FUNCTION queen.eph_count_v2(p_tenant uuid, p_queue text, p_depth int8,
                                              p_bytes int8, p_bounds int8, p_ttl int8,
                                              p_retry int8)
RETURNS int2
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_slot int2;
BEGIN
    INSERT INTO queen.eph_counts AS c (tenant, queue, slot, depth, bytes, drops_bounds,
                                       drops_ttl, drops_retry)
    VALUES (p_tenant, p_queue, (pg_backend_pid() % 16)::int2, p_depth, p_bytes, p_bounds,
            p_ttl, p_retry)
    ON CONFLICT (tenant, queue, slot) DO UPDATE
       SET depth = c.depth + EXCLUDED.depth, bytes = c.bytes + EXCLUDED.bytes,
           drops_bounds = c.drops_bounds + EXCLUDED.drops_bounds,
           drops_ttl = c.drops_ttl + EXCLUDED.drops_ttl,
           drops_retry = c.drops_retry + EXCLUDED.drops_retry
    RETURNING c.slot INTO v_slot;
    RETURN v_slot;
END;
$$;

-- The number of int4 a multirange holds (its ranges are canonical: [lower, upper)).
CREATE OR REPLACE FUNCTION queen.eph_width_v1(p_set int4multirange)
RETURNS int8
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT coalesce(sum(upper(r) - lower(r)), 0)::int8 FROM unnest(p_set) AS r
$$;

-- Marks messages gone: p_idx[i] (indexes in the chunk, 0-based) of chunk (p_pids[i],
-- p_bases[i]), the chunks locked in the order given; deletes a chunk when none is left. n and
-- bytes are the messages that were still stored, so that each is counted out once, by whoever
-- struck it first. Three statements, whatever the count of chunks.
CREATE OR REPLACE FUNCTION queen.eph_strike_v1(p_pids int8[], p_bases int8[],
                                               p_idx int4multirange[], OUT n int8,
                                               OUT bytes int8)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_pids int8[];
    v_bases int8[];
    v_new int4multirange[];
    v_n int8[];
    v_last boolean[];
BEGIN
    -- the rows locked in the order given; what is struck of each is computed from the row as
    -- locked (a concurrent strike's, once it committed) by expressions of the locking query
    -- itself, which PostgreSQL computes again over the row it waited for, and counted outside
    -- it: a LATERAL subquery of the locking query kept what it had made of the version first
    -- read (a strike that waited for another's counted out again what that one had struck:
    -- test_ephemeral_locks)
    SELECT array_agg(x.pid ORDER BY x.o), array_agg(x.base ORDER BY x.o),
           array_agg(x.new ORDER BY x.o), array_agg(x.n ORDER BY x.o),
           array_agg(x.n >= x.live ORDER BY x.o), coalesce(sum(x.n), 0),
           coalesce(sum(x.bytes), 0)
      INTO v_pids, v_bases, v_new, v_n, v_last, n, bytes
      FROM (SELECT y.o, y.pid, y.base, y.live, y.new, w.n, w.bytes
              FROM (SELECT u.o, c.pid, c.base, c.live, c.offs,
                           (u.idx - c.gone)
                           * int4multirange(int4range(0, cardinality(c.offs) - 1)) AS new
                      FROM unnest(p_pids, p_bases, p_idx) WITH ORDINALITY AS u(pid, base, idx, o)
                      JOIN queen.eph_chunks c ON c.pid = u.pid AND c.base = u.base
                     ORDER BY u.o FOR UPDATE OF c) y
             CROSS JOIN LATERAL (
                   -- a range's bytes from its offsets (schema 015), not a row per message
                   SELECT coalesce(sum(upper(r) - lower(r)), 0) AS n,
                          coalesce(sum(y.offs[upper(r) + 1] - y.offs[lower(r) + 1]
                                       - (upper(r) - lower(r))), 0) AS bytes
                     FROM unnest(y.new) AS r) w) x
     WHERE x.n > 0;
    IF v_pids IS NULL THEN
        RETURN;
    END IF;
    IF true = ANY (v_last) THEN
        DELETE FROM queen.eph_chunks c
         USING unnest(v_pids, v_bases, v_last) AS u(pid, base, last)
         WHERE u.last AND c.pid = u.pid AND c.base = u.base;
    END IF;
    IF false = ANY (v_last) THEN
        UPDATE queen.eph_chunks c SET gone = c.gone + u.new, live = c.live - u.n
          FROM unnest(v_pids, v_bases, v_new, v_n, v_last) AS u(pid, base, new, n, last)
         WHERE NOT u.last AND c.pid = u.pid AND c.base = u.base;
    END IF;
END;
$$;

-- Takes the messages of partition p_parts[i] below seq p_belows[i] (NULL: all of them) out of
-- their deliveries, the first half of a drop (eph_cut_v2 is the second): the deliveries are
-- locked ascending by dlv, in one statement, and only those are changed: a row that a later
-- statement would see first (its pop committed since) could be held by an ack waiting for one
-- of these.
CREATE OR REPLACE FUNCTION queen.eph_unlease_v1(p_tenant uuid, p_queue text, p_parts text[],
                                                p_belows int8[])
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_dlvs int8[];
BEGIN
    -- a delivery's seqs ascend: those with a first seq below the cut hold some of its messages
    SELECT array_agg(x.dlv) INTO v_dlvs
      FROM (SELECT l.dlv FROM queen.eph_leases l
              JOIN unnest(p_parts, p_belows) AS u(part, below)
                ON l.partition = u.part AND (u.below IS NULL OR l.seqs[1] < u.below)
             WHERE l.tenant = p_tenant AND l.queue = p_queue
             ORDER BY l.dlv FOR UPDATE OF l) x;
    IF v_dlvs IS NULL THEN
        RETURN;
    END IF;
    UPDATE queen.eph_leases l
       SET seqs = ARRAY(SELECT z.s FROM unnest(l.seqs) AS z(s) WHERE z.s >= u.below
                         ORDER BY z.s),
           atts = ARRAY(SELECT z.a FROM unnest(l.seqs, l.atts) AS z(s, a)
                         WHERE z.s >= u.below ORDER BY z.s)
      FROM unnest(p_parts, p_belows) AS u(part, below)
     WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.dlv = ANY (v_dlvs)
       AND l.partition = u.part;
    DELETE FROM queen.eph_leases l
     WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.dlv = ANY (v_dlvs)
       AND cardinality(l.seqs) = 0;
END;
$$;

-- Drops the messages of partition p_parts[i] below seq p_belows[i] (NULL: all of them) from
-- their chunks, which it locks by partition then base, in one statement, whoever asked for
-- them (a push's ttl and bounds drops are one call); eph_unlease_v1 took them out of their
-- deliveries first. aged_n and aged_bytes are the part of n and bytes that the chunks of
-- partition i below p_aged[i] held (NULL: none), what ttl drops.
CREATE OR REPLACE FUNCTION queen.eph_cut_v2(p_tenant uuid, p_queue text, p_parts text[],
                                            p_belows int8[], p_aged int8[], OUT n int8,
                                            OUT bytes int8, OUT aged_n int8,
                                            OUT aged_bytes int8)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_pids int8[];
    v_bases int8[];
    v_idx int4multirange[];
    v_aged boolean[];
BEGIN
    n := 0;
    bytes := 0;
    aged_n := 0;
    aged_bytes := 0;
    SELECT array_agg(c.pid ORDER BY u.part, c.base), array_agg(c.base ORDER BY u.part, c.base),
           array_agg(int4multirange(int4range(0, least(
                         cardinality(c.offs) - 1,
                         coalesce(u.below - c.base, cardinality(c.offs) - 1))::int4))
                     ORDER BY u.part, c.base),
           array_agg(c.base < coalesce(u.aged, 0) ORDER BY u.part, c.base)
      INTO v_pids, v_bases, v_idx, v_aged
      FROM unnest(p_parts, p_belows, p_aged) AS u(part, below, aged)
      JOIN queen.eph_partitions p
        ON p.tenant = p_tenant AND p.queue = p_queue AND p.partition = u.part
      -- a range of the chunks' key per partition
     CROSS JOIN LATERAL (
           SELECT k.pid, k.base, k.offs FROM queen.eph_chunks k
            WHERE k.pid = p.id AND k.base < coalesce(u.below, 9223372036854775807)) c;
    IF v_pids IS NULL THEN
        RETURN;
    END IF;
    IF true = ALL (v_aged) OR false = ALL (v_aged) THEN
        SELECT s.n, s.bytes INTO n, bytes FROM queen.eph_strike_v1(v_pids, v_bases, v_idx) s;
        IF v_aged[1] THEN
            aged_n := n;
            aged_bytes := bytes;
        END IF;
        RETURN;
    END IF;
    -- both kinds: all the chunks locked in one order first, so that the two strikes that
    -- count them apart wait for nothing
    PERFORM 1 FROM unnest(v_pids, v_bases) WITH ORDINALITY AS u(pid, base, o)
      JOIN queen.eph_chunks c ON c.pid = u.pid AND c.base = u.base
     ORDER BY u.o FOR UPDATE OF c;
    SELECT s.n, s.bytes INTO aged_n, aged_bytes
      FROM queen.eph_strike_v1(
               ARRAY(SELECT u.pid FROM unnest(v_pids, v_aged) WITH ORDINALITY AS u(pid, a, o)
                      WHERE u.a ORDER BY u.o),
               ARRAY(SELECT u.base FROM unnest(v_bases, v_aged) WITH ORDINALITY AS u(base, a, o)
                      WHERE u.a ORDER BY u.o),
               ARRAY(SELECT u.idx FROM unnest(v_idx, v_aged) WITH ORDINALITY AS u(idx, a, o)
                      WHERE u.a ORDER BY u.o)) s;
    SELECT s.n, s.bytes INTO n, bytes
      FROM queen.eph_strike_v1(
               ARRAY(SELECT u.pid FROM unnest(v_pids, v_aged) WITH ORDINALITY AS u(pid, a, o)
                      WHERE NOT u.a ORDER BY u.o),
               ARRAY(SELECT u.base FROM unnest(v_bases, v_aged) WITH ORDINALITY AS u(base, a, o)
                      WHERE NOT u.a ORDER BY u.o),
               ARRAY(SELECT u.idx FROM unnest(v_idx, v_aged) WITH ORDINALITY AS u(idx, a, o)
                      WHERE NOT u.a ORDER BY u.o)) s;
    aged_n := coalesce(aged_n, 0);
    aged_bytes := coalesce(aged_bytes, 0);
    n := coalesce(n, 0) + aged_n;
    bytes := coalesce(bytes, 0) + aged_bytes;
END;
$$;

-- The messages older than p_ttl_s seconds (0 = no age limit): the partitions that have some,
-- and for each the seq below which its messages are (whole chunks, the oldest: created_at is
-- taken under the partition's row lock, so it grows with base in a partition); n and bytes
-- are what those chunks held when read (unlocked: a push's estimate of what ttl drops).
CREATE OR REPLACE FUNCTION queen.eph_expired_v1(p_tenant uuid, p_queue text, p_ttl_s int4,
                                                OUT parts text[], OUT belows int8[],
                                                OUT n int8, OUT bytes int8)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_cutoff timestamptz;
    v_oldest timestamptz;
    v_below int8;
    r record;
BEGIN
    parts := '{}';
    belows := '{}';
    n := 0;
    bytes := 0;
    IF p_ttl_s IS NULL OR p_ttl_s <= 0 THEN
        RETURN;
    END IF;
    v_cutoff := clock_timestamp() - make_interval(secs => p_ttl_s);
    FOR r IN SELECT p.partition, p.id FROM queen.eph_partitions p
              WHERE p.tenant = p_tenant AND p.queue = p_queue ORDER BY p.partition LOOP
        SELECT c.created_at INTO v_oldest FROM queen.eph_chunks c
         WHERE c.pid = r.id ORDER BY c.base LIMIT 1;
        CONTINUE WHEN v_oldest IS NULL OR v_oldest >= v_cutoff;
        -- the first chunk that is not expired, else one past the last message of the last
        -- (not NULL, "all": a chunk that a push adds meanwhile is not expired)
        v_below := NULL;
        SELECT c.base INTO v_below FROM queen.eph_chunks c
         WHERE c.pid = r.id AND c.created_at >= v_cutoff ORDER BY c.base LIMIT 1;
        IF v_below IS NULL THEN
            SELECT c.base + cardinality(c.offs) - 1 INTO v_below FROM queen.eph_chunks c
             WHERE c.pid = r.id ORDER BY c.base DESC LIMIT 1;
        END IF;
        parts := parts || r.partition;
        belows := belows || v_below;
        SELECT n + coalesce(sum(c.live), 0),
               bytes + coalesce(sum(c.offs[cardinality(c.offs)] - c.offs[1] - cardinality(c.offs)
                                    + 1 - (SELECT coalesce(sum(c.offs[upper(g) + 1]
                                                               - c.offs[lower(g) + 1]
                                                               - (upper(g) - lower(g))), 0)
                                             FROM unnest(c.gone) AS g)), 0)
          INTO n, bytes
          FROM queen.eph_chunks c WHERE c.pid = r.id AND c.base < v_below;
    END LOOP;
END;
$$;

-- dropOldest: the last seq of the shortest prefix of the queue (by seq, over all partitions)
-- that holds at least p_len messages and p_bytes bytes (NULL: the whole queue), not counting
-- the messages of partition p_parts[i] below p_belows[i] (whole chunks, which another drop of
-- the same call takes: the ttl's).
CREATE OR REPLACE FUNCTION queen.eph_oldest_v1(p_tenant uuid, p_queue text, p_len int8,
                                               p_bytes int8, p_parts text[], p_belows int8[])
RETURNS int8
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_k int8 := 16;
    v_cut int8;
    v_rank int8;
BEGIN
    LOOP
        -- the first v_k chunks of each partition, merged by base (the seq ranges of two
        -- chunks never overlap): a correct prefix of the queue up to its v_k-th chunk
        v_cut := NULL;
        SELECT x.seq, x.rank INTO v_cut, v_rank
          FROM (SELECT c.base + u.i - 1 AS seq, dense_rank() OVER (ORDER BY c.base) AS rank,
                       count(*) OVER w AS cnt, sum(u.o1 - u.o0 - 1) OVER w AS sum
                  FROM queen.eph_partitions p
                  LEFT JOIN unnest(p_parts, p_belows) AS t(part, below) ON t.part = p.partition
                 CROSS JOIN LATERAL (SELECT k.base, k.offs, k.gone FROM queen.eph_chunks k
                                      WHERE k.pid = p.id AND k.base >= coalesce(t.below, 0)
                                      ORDER BY k.base LIMIT v_k) c
                 CROSS JOIN LATERAL unnest(c.offs[1:cardinality(c.offs) - 1], c.offs[2:])
                                    WITH ORDINALITY AS u(o0, o1, i)
                 WHERE p.tenant = p_tenant AND p.queue = p_queue
                   AND NOT c.gone @> (u.i - 1)::int4
                WINDOW w AS (ORDER BY c.base, u.i)) x
         WHERE x.cnt >= p_len AND x.sum >= p_bytes
         ORDER BY x.seq LIMIT 1;
        EXIT WHEN v_cut IS NOT NULL AND v_rank <= v_k;
        -- not found there: unless a partition has more chunks than were looked at, the whole
        -- queue is the prefix (v_cut NULL)
        EXIT WHEN NOT EXISTS (
            SELECT 1 FROM queen.eph_partitions p
              LEFT JOIN unnest(p_parts, p_belows) AS t(part, below) ON t.part = p.partition
             WHERE p.tenant = p_tenant AND p.queue = p_queue
               AND (SELECT count(*) FROM (SELECT 1 FROM queen.eph_chunks k
                                           WHERE k.pid = p.id AND k.base >= coalesce(t.below, 0)
                                           LIMIT v_k + 1) z) > v_k);
        v_k := v_k * 4;
    END LOOP;
    RETURN v_cut;
END;
$$;

-- Counts out the messages (p_parts[i], p_seqs[i]) that no group needs any more: every group
-- that popped the queue is past it in its partition and none holds a lease on it. With more
-- than one group their chunks are locked first (by partition, then base): two calls that each
-- remove one group's need then run one after the other, and the second sees what the first
-- committed. A few statements, whatever the count of messages and chunks. p_sorted: the seqs
-- ascend, each once (a delivery's).
CREATE OR REPLACE FUNCTION queen.eph_settle_v3(p_tenant uuid, p_queue text, p_parts text[],
                                               p_seqs int8[], p_sorted boolean,
                                               OUT n int8, OUT bytes int8)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_groups int8;
    v_pids int8[];
    v_bases int8[];
    v_idx int4multirange[];
    v_parts text[] := p_parts;
    v_seqs int8[] := p_seqs;
    v_k int4;
    v_pid int8;
    v_base int8;
    v_min int8;
    v_run boolean;
BEGIN
    n := 0;
    bytes := 0;
    IF p_seqs IS NULL OR cardinality(p_seqs) = 0 THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_groups FROM queen.eph_groups g
     WHERE g.tenant = p_tenant AND g.queue = p_queue;
    -- PERF(eph): one run of one chunk of one partition (a whole delivery, usually) needs no
    -- query per message: with one group the caller released them itself (its cursor is past
    -- them and no other delivery of the group holds one), so they all go; with more, they all
    -- go when every cursor is past the last and no delivery holds any, none when a cursor is
    -- below the first, and the general way below decides otherwise
    v_k := cardinality(p_seqs);
    IF p_sorted AND p_parts[1] = ALL (p_parts) AND p_seqs[v_k] - p_seqs[1] = v_k - 1
       AND p_seqs[1] - p_seqs[1] % 256 = p_seqs[v_k] - p_seqs[v_k] % 256 THEN
        SELECT p.id INTO v_pid FROM queen.eph_partitions p
         WHERE p.tenant = p_tenant AND p.queue = p_queue AND p.partition = p_parts[1];
        v_base := p_seqs[1] - p_seqs[1] % 256;
        v_run := true;
        IF v_groups > 1 THEN
            PERFORM 1 FROM queen.eph_chunks c WHERE c.pid = v_pid AND c.base = v_base
               FOR UPDATE;
            SELECT min(coalesce(c.pos, 0)) INTO v_min
              FROM queen.eph_groups g
              LEFT JOIN queen.eph_cursors c
                ON c.tenant = g.tenant AND c.queue = g.queue AND c.grp = g.grp
               AND c.partition = p_parts[1]
             WHERE g.tenant = p_tenant AND g.queue = p_queue;
            IF v_min < p_seqs[1] THEN
                RETURN;
            END IF;
            v_run := v_min >= p_seqs[v_k] AND NOT EXISTS (
                SELECT 1 FROM queen.eph_leases l
                 WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.partition = p_parts[1]
                   AND l.seqs[1] <= p_seqs[v_k] AND l.seqs[cardinality(l.seqs)] >= p_seqs[1]
                   AND l.seqs && p_seqs);
        END IF;
        IF v_run THEN
            SELECT s.n, s.bytes INTO n, bytes
              FROM queen.eph_strike_v1(ARRAY[v_pid], ARRAY[v_base], ARRAY[int4multirange(
                       int4range((p_seqs[1] % 256)::int4, (p_seqs[v_k] % 256)::int4 + 1))]) s;
            RETURN;
        END IF;
    END IF;
    -- with one group, all of them (as above); with more, lock their chunks first
    IF v_groups > 1 THEN
        PERFORM 1
           FROM (SELECT 1 FROM (SELECT DISTINCT u.part, u.seq - u.seq % 256 AS base
                                  FROM unnest(p_parts, p_seqs) AS u(part, seq)) g
                   JOIN queen.eph_partitions p
                     ON p.tenant = p_tenant AND p.queue = p_queue AND p.partition = g.part
                   JOIN queen.eph_chunks c ON c.pid = p.id AND c.base = g.base
                  ORDER BY g.part, g.base FOR UPDATE OF c) x;
        -- what is left of them: every group's cursor past, no delivery of any group holding
        SELECT coalesce(array_agg(u.part), '{}'), coalesce(array_agg(u.seq), '{}')
          INTO v_parts, v_seqs
          FROM unnest(p_parts, p_seqs) AS u(part, seq)
          JOIN (SELECT d.part, (SELECT min(coalesce(c.pos, 0)) FROM queen.eph_groups g
                                 LEFT JOIN queen.eph_cursors c
                                   ON c.tenant = g.tenant AND c.queue = g.queue
                                  AND c.grp = g.grp AND c.partition = d.part
                                WHERE g.tenant = p_tenant AND g.queue = p_queue) AS pos
                  FROM (SELECT DISTINCT x.part FROM unnest(p_parts) AS x(part)) d) m
            ON m.part = u.part AND u.seq <= m.pos
         WHERE NOT EXISTS (
                   SELECT 1 FROM queen.eph_leases l, unnest(l.seqs) AS h(seq)
                    WHERE l.tenant = p_tenant AND l.queue = p_queue
                      AND l.partition = u.part AND h.seq = u.seq);
    END IF;
    SELECT array_agg(p.id ORDER BY g.part, g.base), array_agg(g.base ORDER BY g.part, g.base),
           array_agg(g.idx ORDER BY g.part, g.base)
      INTO v_pids, v_bases, v_idx
      FROM (SELECT u.part, u.seq - u.seq % 256 AS base,
                   range_agg(int4range((u.seq % 256)::int4, (u.seq % 256)::int4 + 1)) AS idx
              FROM unnest(v_parts, v_seqs) AS u(part, seq) GROUP BY 1, 2) g
      JOIN queen.eph_partitions p
        ON p.tenant = p_tenant AND p.queue = p_queue AND p.partition = g.part;
    IF v_pids IS NOT NULL THEN
        SELECT s.n, s.bytes INTO n, bytes FROM queen.eph_strike_v1(v_pids, v_bases, v_idx) s;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION queen.eph_configure_v1(p_tenant uuid, p_queue text, p_options jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    PERFORM queen.eph_enter_v1(p_tenant, p_queue);
    INSERT INTO queen.eph_config (tenant, queue, options) VALUES (p_tenant, p_queue, p_options)
    ON CONFLICT (tenant, queue) DO UPDATE SET options = EXCLUDED.options, updated_at = now();
    RETURN jsonb_build_object('queue', p_queue, 'tier', 'declared', 'configured', true,
                              'options', queen.eph_options_v1(p_tenant, p_queue));
END;
$$;

-- A push takes one value of queen.eph_seq while it holds its partition's row: its messages
-- are seq value * 16384 + 0, 1, ... (the API allows 10,000 per push), stored as one chunk per
-- 256 of them. The payloads come as a chunk's body holds them (schema 015): p_body their UTF-8
-- bytes joined by 0x1e, p_offs where each begins in p_body, one more element (p_offs[1] = 0,
-- p_offs[i + 1] = p_offs[i] + the octet length of payload i + 1); queen_mp/db/ephemeral_procs.py
-- computes them. PERF(eph): v1 took a text[] and built the sizes with a statement (about 210k
-- instructions a push of 100, callgrind), and a body would have cost array_to_string and
-- convert_to's check of every byte (about 440k more).
CREATE OR REPLACE FUNCTION queen.eph_push_v3(p_tenant uuid, p_queue text, p_partition text,
                                             p_body bytea, p_offs int4[])
RETURNS int4
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET plan_cache_mode = force_generic_plan  -- PERF(eph): see the header
AS $$
DECLARE
    v_epoch text;  -- NULL: the queue has no row yet
    v_o jsonb;
    v_n int8 := coalesce(cardinality(p_offs), 1) - 1;
    v_bytes int8;
    v_depth int8;
    v_stored int8;
    v_max_len int8;
    v_max_bytes int8;
    v_pid int8;
    v_base int8;
    v_ttl_p text[];
    v_ttl_s int8[];
    v_ttl_n int8 := 0;
    v_ttl_b int8 := 0;
    v_cut int8;
    v_parts text[];
    v_belows int8[];
    v_aged int8[];
    v_drop_n int8 := 0;
    v_drop_b int8 := 0;
BEGIN
    -- PERF(eph): every statement of this function counts (a simple expression some thousand
    -- instructions, a query some tens of thousands): a push of one message has the fewest
    IF v_n = 0 OR v_n > 16384 THEN
        IF v_n = 0 THEN
            RETURN 0;
        END IF;
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = format('%s messages in one push, over 16384', v_n);
    END IF;
    v_bytes := p_offs[v_n + 1] - p_offs[1] - v_n;
    IF p_offs[1] <> 0 OR octet_length(p_body) IS DISTINCT FROM p_offs[v_n + 1] - 1 THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'eph_push_v3: the body and offsets do not describe one push';
    END IF;
    -- PERF(eph): eph_enter_v1's lock (a simple expression), then one statement for what
    -- eph_enter_v1 and eph_options_v1 read and the queue's counts (as eph_push_v5 reads them):
    -- two calls and three statements before
    IF NOT pg_try_advisory_xact_lock_shared(queen.eph_key_v1(p_tenant, p_queue)) THEN
        PERFORM pg_advisory_xact_lock_shared(queen.eph_key_v1(p_tenant, p_queue));
    END IF;
    SELECT h.epoch, h.options, h.depth, h.bytes INTO v_epoch, v_o, v_depth, v_stored
      FROM queen.eph_head_v1(p_tenant, p_queue) h;
    IF v_epoch IS NULL THEN  -- a new queue: eph_enter_v1 inserts its row
        v_epoch := queen.eph_enter_v1(p_tenant, p_queue);
        v_o := queen.eph_options_v1(p_tenant, p_queue);
        SELECT coalesce(sum(c.depth), 0), coalesce(sum(c.bytes), 0) INTO v_depth, v_stored
          FROM queen.eph_counts c WHERE c.tenant = p_tenant AND c.queue = p_queue;
    END IF;
    -- what ttl drops, and below what bounds drop, are found first and dropped in one cut: two
    -- cuts took their leases in two ascending runs, and an ack holding a lease of the second
    -- run while waiting for one of the first closed a cycle with the push
    IF (v_o ->> 'ttlSeconds')::int4 > 0 THEN
        SELECT e.parts, e.belows, e.n, e.bytes INTO v_ttl_p, v_ttl_s, v_ttl_n, v_ttl_b
          FROM queen.eph_expired_v1(p_tenant, p_queue, (v_o ->> 'ttlSeconds')::int4) e;
    END IF;
    v_max_len := (v_o ->> 'maxLength')::int8;
    v_max_bytes := (v_o ->> 'maxBytes')::int8;
    IF v_n > v_max_len OR v_bytes > v_max_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'QE001', MESSAGE = 'queue_full',
            DETAIL = format('this push (%s messages, %s bytes) is larger than the queue '
                            '(maxLength %s, maxBytes %s)', v_n, v_bytes, v_max_len, v_max_bytes);
    END IF;
    v_depth := v_depth - v_ttl_n;
    v_stored := v_stored - v_ttl_b;
    IF v_depth + v_n > v_max_len OR v_stored + v_bytes > v_max_bytes THEN
        IF v_o ->> 'policy' = 'reject' THEN
            RAISE EXCEPTION USING ERRCODE = 'QE001', MESSAGE = 'queue_full',
                DETAIL = format('the queue holds %s messages, %s bytes (maxLength %s, maxBytes %s) '
                                'and its policy is reject', v_depth, v_stored, v_max_len,
                                v_max_bytes);
        END IF;
        v_cut := queen.eph_oldest_v1(p_tenant, p_queue, v_depth + v_n - v_max_len,
                                     v_stored + v_bytes - v_max_bytes, v_ttl_p, v_ttl_s);
        -- every partition, below the prefix's end (NULL: all) or the ttl's, the higher
        SELECT array_agg(p.partition ORDER BY p.partition),
               array_agg(CASE WHEN v_cut IS NOT NULL THEN greatest(v_cut + 1, t.below) END
                         ORDER BY p.partition),
               array_agg(t.below ORDER BY p.partition)
          INTO v_parts, v_belows, v_aged
          FROM queen.eph_partitions p
          LEFT JOIN unnest(v_ttl_p, v_ttl_s) AS t(part, below) ON t.part = p.partition
         WHERE p.tenant = p_tenant AND p.queue = p_queue;
    ELSIF cardinality(v_ttl_p) > 0 THEN
        v_parts := v_ttl_p;
        v_belows := v_ttl_s;
        v_aged := v_ttl_s;
    END IF;
    IF v_parts IS NOT NULL THEN  -- v_ttl_n and v_ttl_b: what was dropped, not the estimate
        PERFORM queen.eph_unlease_v1(p_tenant, p_queue, v_parts, v_belows);
        SELECT c.n, c.bytes, c.aged_n, c.aged_bytes INTO v_drop_n, v_drop_b, v_ttl_n, v_ttl_b
          FROM queen.eph_cut_v2(p_tenant, p_queue, v_parts, v_belows, v_aged) c;
        v_drop_n := v_drop_n - v_ttl_n;
        v_drop_b := v_drop_b - v_ttl_b;
    END IF;
    -- the partition's turn: its row is held to the commit, and the seq value that the update
    -- takes is taken again if it had to wait for the row (READ COMMITTED evaluates an updated
    -- row's new values again once its holder committed), so the next push of this partition
    -- takes a larger value and commits after this one. PERF(eph): one statement, where a
    -- SELECT ... FOR NO KEY UPDATE, then nextval, then this UPDATE were three
    UPDATE queen.eph_partitions p SET last_seq = nextval('queen.eph_seq') * 16384 + v_n - 1
     WHERE p.tenant = p_tenant AND p.queue = p_queue AND p.partition = p_partition
    RETURNING p.id, p.last_seq - v_n + 1 INTO v_pid, v_base;
    IF NOT FOUND THEN
        INSERT INTO queen.eph_partitions (tenant, queue, partition, id, last_seq)
        VALUES (p_tenant, p_queue, p_partition, nextval('queen.eph_seq'), 0)
        ON CONFLICT DO NOTHING;
        UPDATE queen.eph_partitions p SET last_seq = nextval('queen.eph_seq') * 16384 + v_n - 1
         WHERE p.tenant = p_tenant AND p.queue = p_queue AND p.partition = p_partition
        RETURNING p.id, p.last_seq - v_n + 1 INTO v_pid, v_base;
    END IF;
    IF v_n <= 256 THEN
        INSERT INTO queen.eph_chunks (pid, base, body, offs, live, created_at)
        VALUES (v_pid, v_base, p_body, p_offs, v_n, clock_timestamp());
    ELSE  -- each chunk its part of the body, and its slice of the offsets as they are
        INSERT INTO queen.eph_chunks (pid, base, body, offs, live, created_at)
        SELECT v_pid, v_base + k * 256,
               substring(p_body FROM p_offs[k * 256 + 1] + 1
                         FOR p_offs[least(k * 256 + 256, v_n) + 1] - p_offs[k * 256 + 1] - 1),
               p_offs[k * 256 + 1:k * 256 + 257],
               least(256, v_n - k * 256), clock_timestamp()
          FROM generate_series(0, (v_n - 1) / 256) AS k;
    END IF;
    -- PERF(eph): eph_count_v2's statement, inlined (a plpgsql call costs its own set-up)
    INSERT INTO queen.eph_counts AS c (tenant, queue, slot, depth, bytes, drops_bounds,
                                       drops_ttl, drops_retry)
    VALUES (p_tenant, p_queue, (pg_backend_pid() % 16)::int2, v_n - v_ttl_n - v_drop_n,
            v_bytes - v_ttl_b - v_drop_b, v_drop_n, v_ttl_n, 0)
    ON CONFLICT (tenant, queue, slot) DO UPDATE
       SET depth = c.depth + EXCLUDED.depth, bytes = c.bytes + EXCLUDED.bytes,
           drops_bounds = c.drops_bounds + EXCLUDED.drops_bounds,
           drops_ttl = c.drops_ttl + EXCLUDED.drops_ttl;
    RETURN v_n;
END;
$$;

-- Fused pushes: the pushes that reached a front worker in one event loop turn or while one of
-- its calls was in flight, in one call and one transaction (queen_mp/front/ephemeral.py
-- EphemeralPushFusion). Request i pushes the next p_counts[i] messages of p_body, of
-- p_bytes[i] bytes in all, to partition p_parts[i] of queue (p_tenants[i], p_queues[i]); the
-- messages come as eph_push_v3's: p_body every payload's UTF-8 bytes joined by 0x1e, p_offs
-- where each begins in p_body, one more element. The requests come sorted by (tenant, queue,
-- partition), uuid and text compared bytewise (COLLATE "C", the caller's sort; 22023
-- otherwise), so those of one queue, and of one partition, are neighbours.
--
-- The caller (queen_mp/db/ephemeral_procs.py push_many_params) also sends what the requests
-- store when every one is stored: per queue, in the requests' order, its tenant and name,
-- messages and bytes (p_q_n, p_q_b) and its first partition run (p_q_r, one element more:
-- one past the last run); per partition run (the stored messages of one partition, of one
-- request or of neighbours), its partition, first message (an index of p_offs) and count.
-- When every queue has no ttlSeconds and holds its requests' total within its bounds (the
-- usual call) that is the answer, with no statement or expression per request; otherwise
-- each request gets its own verdict, and the queue and run arrays are made again of those
-- stored.
--
-- pushed[i] is what request i stored: p_counts[i] (all of it), -1 when it was refused whole
-- (queue_full; details[i] says why, as eph_push_v3's DETAIL), or -2 when it must be pushed
-- alone with eph_push_v3 (nothing of it was written): it must drop messages first (its queue
-- has a ttlSeconds, or it is over the bounds of a dropOldest queue), whose lease and chunk
-- rows come before a partition's in the lock order. A request's bounds are checked against
-- the committed state plus the requests of this call before it (as a push that ran just
-- before it). QE002 (MESSAGE 'push_alone') when a queue or a partition has no row yet:
-- nothing was written, and each request is to be pushed alone (a row's insert could wait for
-- another call's while this one holds rows of others).
--
-- Each partition takes one seq value (so seqs still grow in commit order within a partition),
-- and the messages of one partition (of one request or of several, in request order) are
-- stored as one push of their sum. PERF(eph): a statement costs tens of thousands of
-- instructions of executor set-up whatever its rows, and so does every distinct expression
-- that runs (plpgsql prepares a simple expression again in every transaction): v4 ran ~60
-- expressions in its verdict loop and a statement per partition, 925k instructions for a call
-- of one request, 338k per request for 4 (callgrind, bench/ephemeral_sql.py). Here: per queue
-- its lock and one read (epoch, options and counts), and one statement that updates its
-- partitions and inserts their chunks; one count per queue (eph_count_v2's statement,
-- inlined). 22023 also when a partition gets more than 16,384 messages in one call.
CREATE OR REPLACE FUNCTION queen.eph_push_v5(p_tenants uuid[], p_queues text[], p_parts text[],
                                             p_counts int4[], p_bytes int8[], p_offs int4[],
                                             p_body bytea, p_q_tenants uuid[],
                                             p_q_queues text[], p_q_n int8[], p_q_b int8[],
                                             p_q_r int4[], p_r_parts text[], p_r_first int4[],
                                             p_r_n int4[],
                                             OUT pushed int4[], OUT details text[])
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET plan_cache_mode = force_generic_plan  -- PERF(eph): see the header
-- a queue's partition rows locked in its primary key's order: by an index scan (a bitmap
-- scan, that the generic plan of = ANY prefers, locks them in their heap order, which
-- moves with every update)
SET enable_bitmapscan = off
SET enable_seqscan = off
AS $$
DECLARE
    v_r int4 := cardinality(p_counts);
    v_i int4;
    v_j int4;
    v_o jsonb;
    v_epoch text;
    v_fast boolean := true;  -- every request stored: the caller's queue and run arrays hold
    v_ttl boolean;
    v_reject boolean;
    v_max_len int8;
    v_max_bytes int8;
    v_depth int8;
    v_stored int8;
    v_q0 int4;  -- the first request of the current queue
    v_first int4 := 1;  -- request i's first message in p_offs
    v_all boolean := true;  -- every request stored
    v_at int4 := 1;  -- where the next stored request's messages start in v_acc
    v_acc bytea := p_body;
    v_acc_offs int4[] := p_offs;
    v_k int4 := 0;
    v_want int8;  -- the chunks a queue's partitions store
    v_rows int8;
BEGIN
    details := array_fill(NULL::text, ARRAY[v_r]);
    IF v_r = 0 THEN
        pushed := '{}';
        RETURN;
    END IF;
    IF cardinality(p_tenants) <> v_r OR cardinality(p_queues) <> v_r
       OR cardinality(p_parts) <> v_r OR cardinality(p_bytes) <> v_r
       OR cardinality(p_offs) < 1 OR p_offs[1] <> 0
       OR octet_length(p_body) IS DISTINCT FROM p_offs[cardinality(p_offs)] - 1
       OR cardinality(p_q_r) <> cardinality(p_q_n) + 1
       OR p_q_r[cardinality(p_q_r)] <> cardinality(p_r_n) + 1
       OR p_r_first[cardinality(p_r_n)] + p_r_n[cardinality(p_r_n)] <> cardinality(p_offs) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'eph_push_v5: the arrays do not describe the same requests';
    END IF;
    -- the usual call: queue by queue (sorted), its lock, options and counts, and its total
    FOR v_j IN 1..cardinality(p_q_n) LOOP
        IF v_j > 1 AND (p_q_tenants[v_j], p_q_queues[v_j] COLLATE "C")
                       <= (p_q_tenants[v_j - 1], p_q_queues[v_j - 1] COLLATE "C") THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'eph_push_v5: the requests are not sorted';
        END IF;
        -- eph_enter_v1's lock (a simple expression), and what it and eph_options_v1 read
        IF NOT pg_try_advisory_xact_lock_shared(queen.eph_key_v1(p_q_tenants[v_j],
                                                                 p_q_queues[v_j])) THEN
            PERFORM pg_advisory_xact_lock_shared(queen.eph_key_v1(p_q_tenants[v_j],
                                                                  p_q_queues[v_j]));
        END IF;
        v_epoch := NULL;
        SELECT h.epoch, h.options, h.depth, h.bytes INTO v_epoch, v_o, v_depth, v_stored
          FROM queen.eph_head_v1(p_q_tenants[v_j], p_q_queues[v_j]) h;
        IF v_epoch IS NULL THEN  -- a new queue (eph_enter_v1 inserts its row)
            RAISE EXCEPTION USING ERRCODE = 'QE002', MESSAGE = 'push_alone',
                DETAIL = format('queue %s has no row yet', p_q_queues[v_j]);
        END IF;
        v_fast := v_fast AND (v_o ->> 'ttlSeconds')::int4 = 0
                  AND v_depth + p_q_n[v_j] <= (v_o ->> 'maxLength')::int8
                  AND v_stored + p_q_b[v_j] <= (v_o ->> 'maxBytes')::int8;
    END LOOP;
    IF v_fast THEN
        pushed := p_counts;
    ELSE
        -- a verdict per request, queue by queue (their locks are held): the queue and run
        -- arrays made again of the stored requests
        pushed := array_fill(0, ARRAY[v_r]);
        p_q_tenants := '{}';
        p_q_queues := '{}';
        p_q_n := '{}';
        p_q_b := '{}';
        p_q_r := '{}';
        p_r_parts := '{}';
        p_r_first := '{}';
        p_r_n := '{}';
        FOR v_i IN 1..v_r LOOP
            IF v_i = 1 OR p_tenants[v_i] <> p_tenants[v_q0] OR p_queues[v_i] <> p_queues[v_q0] THEN
                IF v_i > 1 AND (p_tenants[v_i], p_queues[v_i] COLLATE "C")
                               < (p_tenants[v_q0], p_queues[v_q0] COLLATE "C") THEN
                    RAISE EXCEPTION USING ERRCODE = '22023',
                        MESSAGE = 'eph_push_v5: the requests are not sorted';
                END IF;
                v_q0 := v_i;
                p_q_tenants := p_q_tenants || p_tenants[v_i];  -- what its requests store
                p_q_queues := p_q_queues || p_queues[v_i];
                p_q_n := p_q_n || 0::int8;
                p_q_b := p_q_b || 0::int8;
                p_q_r := p_q_r || (v_k + 1);
                SELECT h.epoch, h.options, h.depth, h.bytes INTO v_epoch, v_o, v_depth, v_stored
                  FROM queen.eph_head_v1(p_tenants[v_i], p_queues[v_i]) h;
                IF v_epoch IS NULL THEN  -- not a queue of the fast loop's: unsorted
                    RAISE EXCEPTION USING ERRCODE = '22023',
                        MESSAGE = 'eph_push_v5: the arrays do not describe the same requests';
                END IF;
                v_ttl := (v_o ->> 'ttlSeconds')::int4 > 0;
                v_reject := v_o ->> 'policy' = 'reject';
                v_max_len := (v_o ->> 'maxLength')::int8;
                v_max_bytes := (v_o ->> 'maxBytes')::int8;
            ELSIF p_parts[v_i] COLLATE "C" < p_parts[v_i - 1] COLLATE "C" THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = 'eph_push_v5: the requests are not sorted';
            END IF;
            IF p_counts[v_i] = 0 THEN
                CONTINUE;
            ELSIF v_ttl THEN
                pushed[v_i] := -2;
            ELSIF p_counts[v_i] > v_max_len OR p_bytes[v_i] > v_max_bytes THEN
                pushed[v_i] := -1;
                details[v_i] := format('this push (%s messages, %s bytes) is larger than the '
                                       'queue (maxLength %s, maxBytes %s)', p_counts[v_i],
                                       p_bytes[v_i], v_max_len, v_max_bytes);
            ELSIF v_depth + p_q_n[cardinality(p_q_n)] + p_counts[v_i] > v_max_len
                  OR v_stored + p_q_b[cardinality(p_q_b)] + p_bytes[v_i] > v_max_bytes THEN
                IF v_reject THEN
                    pushed[v_i] := -1;
                    details[v_i] := format('the queue holds %s messages, %s bytes (maxLength '
                                           '%s, maxBytes %s) and its policy is reject',
                                           v_depth + p_q_n[cardinality(p_q_n)],
                                           v_stored + p_q_b[cardinality(p_q_b)], v_max_len,
                                           v_max_bytes);
                ELSE
                    pushed[v_i] := -2;
                END IF;
            ELSE
                pushed[v_i] := p_counts[v_i];
                p_q_n[cardinality(p_q_n)] := p_q_n[cardinality(p_q_n)] + p_counts[v_i];
                p_q_b[cardinality(p_q_b)] := p_q_b[cardinality(p_q_b)] + p_bytes[v_i];
                -- the partition's messages in v_acc: a run of their own (neighbours by
                -- partition, after the queue's first run)
                IF v_k >= p_q_r[cardinality(p_q_r)] AND p_r_parts[v_k] = p_parts[v_i] THEN
                    p_r_n[v_k] := p_r_n[v_k] + p_counts[v_i];
                ELSE
                    v_k := v_k + 1;
                    p_r_parts[v_k] := p_parts[v_i];
                    p_r_first[v_k] := v_at;
                    p_r_n[v_k] := p_counts[v_i];
                END IF;
                v_at := v_at + p_counts[v_i];
            END IF;
            v_all := v_all AND pushed[v_i] = p_counts[v_i];
            v_first := v_first + p_counts[v_i];
        END LOOP;
        p_q_r := p_q_r || (v_k + 1);
        IF v_first IS DISTINCT FROM cardinality(p_offs) THEN
            RAISE EXCEPTION USING ERRCODE = '22023',
                MESSAGE = 'eph_push_v5: the counts do not add up to the payloads';
        END IF;
        IF v_k = 0 THEN
            RETURN;
        END IF;
        -- the stored requests' messages, a run per partition: when some request was refused,
        -- the others' payloads joined again, with their offsets
        IF NOT v_all THEN
            SELECT string_agg(substring(p_body FROM p_offs[x.k] + 1 FOR x.s), '\x1e'::bytea
                              ORDER BY x.o),
                   array_agg(x.at - x.s - 1 ORDER BY x.o) || max(x.at)::int4
              INTO v_acc, v_acc_offs
              FROM (SELECT y.o, y.k, y.s, sum(y.s + 1) OVER (ORDER BY y.o) AS at
                      FROM (SELECT row_number() OVER (ORDER BY u.i, g.k) AS o, g.k,
                                   p_offs[g.k + 1] - p_offs[g.k] - 1 AS s
                              FROM (SELECT w.i, w.n,
                                           sum(w.n) OVER (ORDER BY w.i) - w.n + 1 AS first
                                      FROM unnest(p_counts) WITH ORDINALITY AS w(n, i)) u
                             CROSS JOIN LATERAL generate_series(u.first, u.first + u.n - 1)
                                   AS g(k)
                             WHERE pushed[u.i] > 0) y) x;
        END IF;
    END IF;
    IF 16384 < ANY (p_r_n) THEN
        RAISE EXCEPTION USING ERRCODE = '22023',
            MESSAGE = 'eph_push_v5: over 16384 messages for one partition in one call';
    END IF;
    -- queue by queue: its partitions' turns and their chunks, one statement. Each partition
    -- row is held to the commit, and its seq value taken again if it had to wait for it (see
    -- eph_push_v3). The rows of a queue are taken by one scan of its primary key (= ANY: in
    -- index order, whatever the runs' order), so two calls take a queue's rows in one order.
    -- PERF(eph): v4 ran an UPDATE per partition and then an INSERT of every chunk; one UPDATE
    -- joined to the arrays was planned as a hash join over a scan of the whole table (dead
    -- versions included), locking in the scan's order, where = ANY on the key is an index
    -- scan. A partition without a row stores no chunk: the inserted chunks are counted, and a
    -- shortfall undoes the call (QE002).
    FOR v_j IN 1..cardinality(p_q_n) LOOP
        CONTINUE WHEN p_q_n[v_j] = 0;
        v_want := 0;
        FOR v_i IN p_q_r[v_j]..p_q_r[v_j + 1] - 1 LOOP  -- its partitions' runs, sorted
            IF v_i > p_q_r[v_j] AND p_r_parts[v_i] COLLATE "C" <= p_r_parts[v_i - 1] COLLATE "C"
            THEN
                RAISE EXCEPTION USING ERRCODE = '22023',
                    MESSAGE = 'eph_push_v5: the requests are not sorted';
            END IF;
            v_want := v_want + (p_r_n[v_i] - 1) / 256 + 1;
        END LOOP;
        v_i := p_q_r[v_j] - 1;  -- the queue's runs are v_i + 1 ..
        v_k := p_q_r[v_j + 1] - 1;  -- .. v_k
        WITH u AS (
            UPDATE queen.eph_partitions p
               SET last_seq = nextval('queen.eph_seq') * 16384
                              + p_r_n[v_i + array_position(p_r_parts[v_i + 1:v_k], p.partition)]
                              - 1
             WHERE p.tenant = p_q_tenants[v_j] AND p.queue = p_q_queues[v_j]
               AND p.partition = ANY (p_r_parts[v_i + 1:v_k])
            RETURNING p.id, p.last_seq,
                      v_i + array_position(p_r_parts[v_i + 1:v_k], p.partition) AS j)
        -- a chunk: its part of the body and its slice of the offsets as they are (schema 015)
        INSERT INTO queen.eph_chunks (pid, base, body, offs, live, created_at)
        SELECT u.id, u.last_seq - p_r_n[u.j] + 1 + k * 256,
               substring(v_acc FROM v_acc_offs[p_r_first[u.j] + k * 256] + 1
                         FOR v_acc_offs[p_r_first[u.j] + least(p_r_n[u.j], k * 256 + 256)]
                             - v_acc_offs[p_r_first[u.j] + k * 256] - 1),
               v_acc_offs[p_r_first[u.j] + k * 256
                          :p_r_first[u.j] + least(p_r_n[u.j], k * 256 + 256)],
               least(256, p_r_n[u.j] - k * 256), clock_timestamp()
          FROM u CROSS JOIN LATERAL generate_series(0, (p_r_n[u.j] - 1) / 256) AS k;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows <> v_want THEN  -- a new partition: this call undone, each pushed alone
            RAISE EXCEPTION USING ERRCODE = 'QE002', MESSAGE = 'push_alone',
                DETAIL = format('a partition of queue %s has no row yet', p_q_queues[v_j]);
        END IF;
        -- eph_count_v2's statement
        INSERT INTO queen.eph_counts AS c (tenant, queue, slot, depth, bytes, drops_bounds,
                                           drops_ttl, drops_retry)
        VALUES (p_q_tenants[v_j], p_q_queues[v_j], (pg_backend_pid() % 16)::int2, p_q_n[v_j],
                p_q_b[v_j], 0, 0, 0)
        ON CONFLICT (tenant, queue, slot) DO UPDATE
           SET depth = c.depth + EXCLUDED.depth, bytes = c.bytes + EXCLUDED.bytes;
    END LOOP;
END;
$$;

-- Up to p_batch messages for p_group (redeliveries first, then new ones, the partitions whose
-- cursor is furthest behind first); p_partition NULL = any partition. The answer comes as
-- columns that the broker renders (queen_mp/front/ephemeral.py render_messages): runs of
-- messages of consecutive seqs, run i being counts[i] messages from seq firsts[i], of
-- partition parts[i], delivery dlvs[i], delivered atts[i] times; payloads is their payloads,
-- those of a run joined by the byte 0x1e, the runs by 0x1f (a stored payload is JSON text as
-- orjson or json write it, where a control character is always escaped); epoch is the
-- queue's. PERF(eph): v3
-- built every message's JSON object here, a statement's row each (unnest, a sort, three
-- aggregates, five concatenations): some 23k instructions a message of a pop of 100
-- (callgrind, PostgreSQL 15); a run is one substring of its chunk's body. claimed is
-- the count of messages; wake_in_ms, when nothing was claimable, says when a lease of this
-- group expires (NULL: none); window_ms and window_count are the queue's windowBuffer (a
-- waiting pop that got fewer messages than its batch decides with them whether to wait for
-- more). The messages of one partition handed out by one pop are one delivery: one
-- eph_leases row, whose dlv (a value of queen.eph_seq, 0 with autoAck) ends their ids. A
-- partition whose cursor another pop of the group holds is skipped; a pop that found nothing
-- else waits for the first such cursor, so it answers empty only when nothing was there.
CREATE OR REPLACE FUNCTION queen.eph_pop_v5(p_tenant uuid, p_queue text, p_partition text,
                                            p_group text, p_batch int4, p_auto_ack boolean,
                                            OUT epoch text, OUT parts text[], OUT dlvs int8[],
                                            OUT atts int4[], OUT firsts int8[],
                                            OUT counts int4[], OUT payloads bytea,
                                            OUT claimed int4, OUT wake_in_ms int8,
                                            OUT window_ms int4, OUT window_count int4)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET plan_cache_mode = force_generic_plan  -- PERF(eph): see the header
AS $$
DECLARE
    v_epoch text;
    v_o jsonb;
    v_known boolean;  -- the group has a row
    v_due boolean;  -- a delivery of the group may be due
    v_lease interval;
    v_retry int4;
    v_pay bytea;  -- the payloads so far, as payloads holds them (NULL: none)
    v_firsts int8[];
    v_plain int8[];
    v_counts int4[];
    v_settle_p text[];
    v_settle_s int8[];
    v_skipped text[];
    v_held boolean;
    v_k int4;
    v_dlv int8;
    v_run_pay bytea;
    v_last int8;
    v_red int8[];
    v_red_a int4[];
    v_gone int8[];
    v_taken int8[];
    v_atts int4[];
    v_pos int8;
    v_need int4;
    v_dropped int8;
    v_pass int4;
    v_ttl_p text[];  -- what ttl drops: partitions, and the seq below which
    v_ttl_s int8[];
    v_floor int8;
    v_ttl_n int8;
    v_ttl_b int8;
    v_set_n int8;
    v_set_b int8;
    v_slot int2;  -- unused: see eph_count_v2
    v_at int8;  -- the usual read's next chunk is the first from there
    v_try int4;
    v_f int8;  -- its run: first seq, count, the chunk's last seq and the run's payloads
    v_n int4;
    v_end int8;
    v_len int4;  -- the chunk's messages
    v_small boolean;  -- the walk: its chunks are smaller than what is wanted
    v_ok boolean;  -- the usual pop's runs are whole and hold no gone message
    v_piece bytea;
    r record;
BEGIN
    -- PERF(eph): eph_enter_v1's lock (a simple expression), then one statement for what
    -- eph_enter_v1 and eph_options_v1 read (two calls and two statements), whether the group
    -- has its row (an INSERT ... ON CONFLICT at every pop) and whether any of its deliveries
    -- is due (the redelivery loop's query, a cursor, at every pop): v2 ran five statements
    -- and two function calls for what one statement tells (callgrind, bench/ephemeral_sql's
    -- pattern: statements cost a pop mostly their executor set-up, not their rows)
    IF NOT pg_try_advisory_xact_lock_shared(queen.eph_key_v1(p_tenant, p_queue)) THEN
        PERFORM pg_advisory_xact_lock_shared(queen.eph_key_v1(p_tenant, p_queue));
    END IF;
    SELECT q.epoch, c.options,
           EXISTS (SELECT 1 FROM queen.eph_groups g
                    WHERE g.tenant = p_tenant AND g.queue = p_queue AND g.grp = p_group),
           EXISTS (SELECT 1 FROM queen.eph_leases l
                    WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
                      AND l.lease_until <= now()
                      AND (p_partition IS NULL OR l.partition = p_partition))
      INTO v_epoch, v_o, v_known, v_due
      FROM queen.eph_queues q
      LEFT JOIN queen.eph_config c ON c.tenant = q.tenant AND c.queue = q.queue
     WHERE q.tenant = p_tenant AND q.queue = p_queue;
    -- PERF(eph): the usual pop (eph14): a leasing pop of a queue without a ttl, by a group
    -- that has its row and a cursor on every partition and nothing due, takes the next
    -- messages of the partition furthest behind from the first chunk past its cursor and, if
    -- need be, the next one, none of them gone: the answer the general way below gives it
    -- (it takes no more: the batch is full, or the partition is exhausted and no other one
    -- has messages for the group), one delivery. Its cursor is locked as the general way
    -- locks it (SKIP LOCKED), by the statement that picks it, with no cursor loop (a portal:
    -- its open and fetches were some 200k instructions of a pop of 100, callgrind); the run's
    -- answer goes straight into the result, none of it through variables (callgrind counts a
    -- copy of the payloads as about one instruction a byte: the general way made four more),
    -- and about six plpgsql expressions run where the general way ran some 60 (each is set
    -- up anew in every transaction). bench/ephemeral_sql.py --callgrind, pushes of 100: a pop
    -- of 100 1.44M -> 1.08M instructions, of 70 1.43M -> 1.10M. Anything else (a missing
    -- cursor, a message gone, a third chunk, chunks smaller than the batch) goes the general
    -- way, which finds the cursor already held by this pop; the attempt costs pops over
    -- pushes of 1 about a tenth more (6.0M -> 6.7M a pop of 100). Tried and dropped: the whole
    -- usual pop (and the usual ack) as one statement of data-modifying CTEs: 1.55M (ack 0.98M
    -- against 0.66M), since every node of a plan is set up at each execution, the branches a
    -- call does not take included, where plpgsql skips the statements it does not run.
    -- PERF(eph): v_o is first the queue's declared options alone (NULL: none), each read
    -- with its default beside it (eph_defaults_v1 is inlined and folded into a constant):
    -- merging the defaults and the options (jsonb ||) took some 17k instructions a pop, eph15
    IF v_known AND NOT v_due AND NOT p_auto_ack
       AND coalesce(v_o ->> 'ttlSeconds', queen.eph_defaults_v1() ->> 'ttlSeconds')::int4 = 0
    THEN
        SELECT p.partition, c.pos, p.id, p.last_seq INTO r
          FROM queen.eph_partitions p
          JOIN queen.eph_cursors c
            ON c.tenant = p.tenant AND c.queue = p.queue AND c.grp = p_group
           AND c.partition = p.partition
         WHERE p.tenant = p_tenant AND p.queue = p_queue
           AND (p_partition IS NULL OR p.partition = p_partition) AND p.last_seq > c.pos
           -- a partition without the group's cursor is the general way's (it creates it)
           AND NOT EXISTS (SELECT 1 FROM queen.eph_partitions m
                            WHERE m.tenant = p_tenant AND m.queue = p_queue
                              AND (p_partition IS NULL OR m.partition = p_partition)
                              AND NOT EXISTS (SELECT 1 FROM queen.eph_cursors n
                                               WHERE n.tenant = p_tenant
                                                 AND n.queue = p_queue AND n.grp = p_group
                                                 AND n.partition = m.partition))
         ORDER BY c.pos, p.partition LIMIT 1
           FOR NO KEY UPDATE OF c SKIP LOCKED;
        IF FOUND THEN
            -- (the run: from lo = greatest(0, pos - base + 1), n = least(len - lo, batch);
            -- written out, not as subqueries, whose scans cost their set-up)
            SELECT v_epoch, ARRAY[r.partition], ARRAY[nextval('queen.eph_seq')], '{1}',
                   ARRAY[k.base + greatest(0, r.pos - k.base + 1)],
                   ARRAY[least(cardinality(k.offs) - 1 - greatest(0, r.pos - k.base + 1),
                               p_batch)::int4],
                   substring(k.body FROM k.offs[greatest(0, r.pos - k.base + 1) + 1]
                                         - k.offs[1] + 1
                             FOR k.offs[least(cardinality(k.offs) - 1,
                                              greatest(0, r.pos - k.base + 1) + p_batch) + 1]
                                 - k.offs[greatest(0, r.pos - k.base + 1) + 1] - 1),
                   least(cardinality(k.offs) - 1 - greatest(0, r.pos - k.base + 1), p_batch),
                   coalesce((v_o #>> '{windowBuffer,ms}')::int4, 0),
                   coalesce((v_o #>> '{windowBuffer,count}')::int4, 0),
                   k.base + cardinality(k.offs) - 2, cardinality(k.offs) - 1,
                   least(k.base + cardinality(k.offs) - 2, greatest(r.pos, k.base - 1) + p_batch),
                   NOT k.gone && int4multirange(int4range(
                       greatest(0, r.pos - k.base + 1)::int4,
                       least(cardinality(k.offs) - 1, greatest(0, r.pos - k.base + 1) + p_batch)
                       ::int4))
              INTO epoch, parts, dlvs, atts, firsts, counts, payloads, claimed, window_ms,
                   window_count, v_end, v_len, v_last, v_ok
              FROM queen.eph_chunks k
             WHERE k.pid = r.id AND k.base >= r.pos - r.pos % 256
               AND k.base + cardinality(k.offs) - 2 > r.pos
             ORDER BY k.base LIMIT 1;
            -- v_ok: the runs hold no gone message (NULL: no chunk)
            IF v_ok AND claimed < p_batch THEN
                -- the next chunk's run, from its start; after a chunk smaller than what is
                -- still wanted (pushes of a few messages, many chunks), the general way's walk
                -- (as its usual read decides)
                IF v_end < r.last_seq AND v_len < p_batch - claimed THEN
                    v_ok := false;
                ELSIF v_end < r.last_seq THEN
                    SELECT parts || r.partition, dlvs || dlvs[1], atts || 1, firsts || k.base,
                           counts || x.n,
                           payloads || '\x1f'::bytea
                           || substring(k.body FROM 1 FOR k.offs[x.n + 1] - k.offs[1] - 1),
                           claimed + x.n, k.base + cardinality(k.offs) - 2, k.base + x.n - 1,
                           NOT k.gone && int4multirange(int4range(0, x.n))
                      INTO parts, dlvs, atts, firsts, counts, payloads, claimed, v_end, v_last,
                           v_ok
                      FROM queen.eph_chunks k
                     CROSS JOIN LATERAL (
                           SELECT least(cardinality(k.offs) - 1, p_batch - claimed)::int4 AS n) x
                     WHERE k.pid = r.id AND k.base > v_end
                     ORDER BY k.base LIMIT 1;
                END IF;
                IF v_ok AND claimed < p_batch THEN  -- all there is, and nothing elsewhere
                    v_ok := v_end >= r.last_seq AND NOT EXISTS (
                        SELECT 1 FROM queen.eph_partitions p
                          JOIN queen.eph_cursors c
                            ON c.tenant = p.tenant AND c.queue = p.queue AND c.grp = p_group
                           AND c.partition = p.partition
                         WHERE p.tenant = p_tenant AND p.queue = p_queue
                           AND (p_partition IS NULL OR p.partition = p_partition)
                           AND p.partition <> r.partition AND p.last_seq > c.pos);
                END IF;
            END IF;
            IF v_ok THEN  -- the cursor's move and the delivery's row, one statement
                WITH u AS (
                    UPDATE queen.eph_cursors c SET pos = v_last
                     WHERE c.tenant = p_tenant AND c.queue = p_queue AND c.grp = p_group
                       AND c.partition = r.partition
                    RETURNING c.partition)
                INSERT INTO queen.eph_leases (tenant, queue, grp, dlv, partition, seqs, atts,
                                              lease_until)
                SELECT p_tenant, p_queue, p_group, dlvs[1], u.partition,
                       -- (the runs ascending, each ascending: a set-returning function of
                       -- the select list, one node less than a lateral join)
                       ARRAY(SELECT generate_series(w.f, w.f + w.n - 1)
                               FROM unnest(firsts, counts) AS w(f, n)),
                       array_fill(1, ARRAY[claimed]),
                       clock_timestamp() + make_interval(secs => coalesce(
                           v_o ->> 'leaseSeconds', queen.eph_defaults_v1() ->> 'leaseSeconds')::int4)
                  FROM u;
                RETURN;
            END IF;
        END IF;
    END IF;
    -- the general way
    parts := '{}';
    dlvs := '{}';
    atts := '{}';
    firsts := '{}';
    counts := '{}';
    v_settle_p := '{}';
    v_settle_s := '{}';
    v_skipped := '{}';
    v_held := false;
    v_need := p_batch;
    v_dropped := 0;
    v_ttl_p := '{}';
    v_ttl_s := '{}';
    IF v_epoch IS NULL THEN  -- a new queue: eph_enter_v1 inserts its row
        v_epoch := queen.eph_enter_v1(p_tenant, p_queue);
        v_o := queen.eph_options_v1(p_tenant, p_queue);
        v_known := false;
        v_due := true;
    ELSE
        v_o := queen.eph_defaults_v1() || coalesce(v_o, '{}'::jsonb);
    END IF;
    v_lease := make_interval(secs => (v_o ->> 'leaseSeconds')::int4);
    v_retry := (v_o ->> 'retryLimit')::int4;
    window_ms := coalesce((v_o #>> '{windowBuffer,ms}')::int4, 0);
    window_count := coalesce((v_o #>> '{windowBuffer,count}')::int4, 0);
    v_ttl_n := 0;
    v_ttl_b := 0;
    IF (v_o ->> 'ttlSeconds')::int4 > 0 THEN
        -- their deliveries now (no redelivery gives them), their chunks at the end with the
        -- settle's, in one run: holding them, this pop could wait below for a cursor that
        -- another pop holds, and that pop for one of them in its settle. The reads skip them.
        SELECT e.parts, e.belows INTO v_ttl_p, v_ttl_s
          FROM queen.eph_expired_v1(p_tenant, p_queue, (v_o ->> 'ttlSeconds')::int4) e;
        IF cardinality(v_ttl_p) > 0 THEN
            PERFORM queen.eph_unlease_v1(p_tenant, p_queue, v_ttl_p, v_ttl_s);
        END IF;
    END IF;
    IF NOT v_known THEN
        INSERT INTO queen.eph_groups (tenant, queue, grp) VALUES (p_tenant, p_queue, p_group)
        ON CONFLICT DO NOTHING;
    END IF;

    -- 1. due deliveries: their first messages are redelivered (a new delivery), or dropped
    -- when delivered 1 + retryLimit times already; the rest stay due in their row
    IF v_due THEN
        FOR r IN SELECT l.dlv, l.partition, l.seqs, l.atts FROM queen.eph_leases l
                  WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
                    AND l.lease_until <= now()  -- stable: an index condition of the due index
                    AND (p_partition IS NULL OR l.partition = p_partition)
                  ORDER BY l.lease_until LIMIT p_batch
                    FOR UPDATE SKIP LOCKED LOOP
            EXIT WHEN v_need <= 0;
            v_k := least(v_need, cardinality(r.seqs));
            IF v_k = cardinality(r.seqs) THEN
                DELETE FROM queen.eph_leases l
                 WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
                   AND l.dlv = r.dlv;
            ELSE
                UPDATE queen.eph_leases l
                   SET seqs = r.seqs[v_k + 1:], atts = r.atts[v_k + 1:]
                 WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
                   AND l.dlv = r.dlv;
            END IF;
            SELECT coalesce(array_agg(u.seq ORDER BY u.seq) FILTER (WHERE u.att <= v_retry),
                            '{}'),
                   coalesce(array_agg(u.att ORDER BY u.seq) FILTER (WHERE u.att <= v_retry),
                            '{}'),
                   coalesce(array_agg(u.seq) FILTER (WHERE u.att > v_retry), '{}')
              INTO v_red, v_red_a, v_gone
              FROM unnest(r.seqs[1:v_k], r.atts[1:v_k]) AS u(seq, att);
            IF cardinality(v_gone) > 0 THEN  -- past retryLimit: dropped, settled below
                v_dropped := v_dropped + cardinality(v_gone);
                v_settle_p := v_settle_p || array_fill(r.partition, ARRAY[cardinality(v_gone)]);
                v_settle_s := v_settle_s || v_gone;
            END IF;
            CONTINUE WHEN cardinality(v_red) = 0;
            v_dlv := CASE WHEN p_auto_ack THEN 0 ELSE nextval('queen.eph_seq') END;
            -- a message dropped meanwhile is gone from its chunk: it is not redelivered
            -- (a run of its own each: their delivery counts differ)
            SELECT array_agg(x.seq ORDER BY x.seq), array_agg(x.att ORDER BY x.seq),
                   string_agg(x.payload, '\x1f'::bytea ORDER BY x.seq)
              INTO v_taken, v_atts, v_run_pay
              FROM (SELECT u.seq, u.att + 1 AS att,
                           substring(c.body FROM c.offs[(u.seq - c.base)::int4 + 1]
                                                 - c.offs[1] + 1
                                     FOR c.offs[(u.seq - c.base)::int4 + 2]
                                         - c.offs[(u.seq - c.base)::int4 + 1] - 1) AS payload
                      FROM queen.eph_partitions p
                      JOIN queen.eph_chunks c ON c.pid = p.id
                      JOIN unnest(v_red, v_red_a) AS u(seq, att)
                        ON c.base = u.seq - u.seq % 256
                     WHERE p.tenant = p_tenant AND p.queue = p_queue AND p.partition = r.partition
                       AND c.base = ANY (ARRAY(SELECT DISTINCT z.s - z.s % 256
                                                 FROM unnest(v_red) AS z(s)))
                       AND NOT c.gone @> (u.seq - c.base)::int4) x;
            CONTINUE WHEN v_taken IS NULL;
            v_pay := CASE WHEN v_pay IS NULL THEN v_run_pay
                          ELSE v_pay || '\x1f'::bytea || v_run_pay END;
            parts := parts || array_fill(r.partition, ARRAY[cardinality(v_taken)]);
            dlvs := dlvs || array_fill(v_dlv, ARRAY[cardinality(v_taken)]);
            atts := atts || v_atts;
            firsts := firsts || v_taken;
            counts := counts || array_fill(1, ARRAY[cardinality(v_taken)]);
            IF p_auto_ack THEN
                v_settle_p := v_settle_p || array_fill(r.partition, ARRAY[cardinality(v_taken)]);
                v_settle_s := v_settle_s || v_taken;
            ELSE
                INSERT INTO queen.eph_leases (tenant, queue, grp, dlv, partition, seqs, atts,
                                              lease_until)
                VALUES (p_tenant, p_queue, p_group, v_dlv, r.partition, v_taken, v_atts,
                        clock_timestamp() + v_lease);
            END IF;
            v_need := v_need - cardinality(v_taken);
        END LOOP;
    END IF;

    -- 2. new messages, partition by partition: pass 1 skips the cursors other pops hold;
    -- pass 2, only for a pop that got nothing and holds no cursor, waits for the first one
    FOR v_pass IN 1..2 LOOP
        EXIT WHEN v_need <= 0;
        EXIT WHEN v_pass = 2 AND (v_need < p_batch OR v_held OR cardinality(v_skipped) = 0);
        FOR r IN SELECT p.partition, p.id, p.last_seq, c.pos
                   FROM queen.eph_partitions p
                   LEFT JOIN queen.eph_cursors c
                     ON c.tenant = p.tenant AND c.queue = p.queue AND c.grp = p_group
                    AND c.partition = p.partition
                  WHERE p.tenant = p_tenant AND p.queue = p_queue
                    AND (p_partition IS NULL OR p.partition = p_partition)
                    AND (v_pass = 1 OR p.partition = v_skipped[1])
                    AND p.last_seq > coalesce(c.pos, 0)
                  ORDER BY coalesce(c.pos, 0), p.partition LOOP
            IF r.pos IS NULL THEN
                INSERT INTO queen.eph_cursors (tenant, queue, grp, partition, pos)
                VALUES (p_tenant, p_queue, p_group, r.partition, 0) ON CONFLICT DO NOTHING;
            END IF;
            IF v_pass = 1 THEN
                SELECT c.pos INTO v_pos FROM queen.eph_cursors c
                 WHERE c.tenant = p_tenant AND c.queue = p_queue AND c.grp = p_group
                   AND c.partition = r.partition
                   FOR NO KEY UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    v_skipped := v_skipped || r.partition;
                    CONTINUE;
                END IF;
            ELSE
                SELECT c.pos INTO v_pos FROM queen.eph_cursors c
                 WHERE c.tenant = p_tenant AND c.queue = p_queue AND c.grp = p_group
                   AND c.partition = r.partition
                   FOR NO KEY UPDATE;
            END IF;
            v_held := true;
            v_floor := coalesce(v_ttl_s[array_position(v_ttl_p, r.partition)], 0);
            v_dlv := CASE WHEN p_auto_ack THEN 0 ELSE nextval('queen.eph_seq') END;
            -- PERF(eph): the usual read first: the first chunk past the cursor, and if need be
            -- the next, hold what is wanted (or all there is) in a run each, none of it gone,
            -- as pops of about a push's size find them: one index probe and one slice a chunk,
            -- where the walk below takes a recursive query, a window, a sort and six
            -- aggregates (callgrind: a pop of 100 of one chunk 1.78M -> 1.60M instructions)
            v_firsts := '{}';
            v_counts := '{}';
            v_run_pay := NULL;
            v_k := 0;
            v_small := false;
            v_at := greatest(v_pos - v_pos % 256, v_floor);
            FOR v_try IN 1..2 LOOP
                SELECT k.base + x.lo, x.n, k.base + k.len - 1, k.len,
                       substring(k.body FROM k.offs[x.lo + 1] - k.offs[1] + 1
                                 FOR k.offs[x.lo + x.n + 1] - k.offs[x.lo + 1] - 1)
                  INTO v_f, v_n, v_end, v_len, v_piece
                  FROM (SELECT c.base, c.body, c.offs, c.gone, cardinality(c.offs) - 1 AS len
                          FROM queen.eph_chunks c
                         WHERE c.pid = r.id AND c.base >= v_at
                           AND c.base + cardinality(c.offs) - 2 > v_pos
                         ORDER BY c.base LIMIT 1) k
                 CROSS JOIN LATERAL (
                       SELECT y.lo, least(k.len - y.lo, v_need - v_k)::int4 AS n
                         FROM (SELECT greatest(0, v_pos - k.base + 1)::int4 AS lo) y) x
                 WHERE NOT k.gone && int4multirange(int4range(x.lo, x.lo + x.n));
                IF NOT FOUND THEN  -- a message gone, or none past the cursor: the walk
                    v_k := NULL;
                    EXIT;
                END IF;
                v_firsts := v_firsts || v_f;
                v_counts := v_counts || v_n;
                v_k := v_k + v_n;
                v_run_pay := CASE WHEN v_run_pay IS NULL THEN v_piece
                                  ELSE v_run_pay || '\x1f'::bytea || v_piece END;
                EXIT WHEN v_k = v_need OR v_end >= r.last_seq;
                -- a third chunk, or a second when the first (a push's) was smaller than what
                -- is still wanted (pushes of a few messages, many chunks): the walk
                IF v_try = 2 OR v_len < v_need - v_k THEN
                    v_small := v_len < v_need - v_k;
                    v_k := NULL;
                    EXIT;
                END IF;
                v_at := v_end + 1;
            END LOOP;
            v_last := v_f + v_n - 1;
            IF v_k IS NULL THEN
                -- PERF(eph): the chunks past the cursor, in order, until they hold v_need messages
                -- (a lower bound for the first, whose live messages may be at or below the
                -- cursor): one index probe per chunk (with a generic plan and the table's
                -- statistics, a plain ordered scan was planned as a scan and sort of the whole
                -- table), and only those chunks are read and detoasted; the walk is an InitPlan
                -- of the read, whose index scan takes their bases as one array. What a chunk
                -- holds past the cursor is its runs (the range past the cursor less its gone
                -- set), and the runs are taken in order until they hold v_need messages: a run
                -- is one substring of the chunk's body (schema 015), so no row of
                -- this statement is a message (v3 unnested, filtered, sorted and rendered each).
                -- The payloads must be joined in seq order, and PostgreSQL promises no order of
                -- a subquery's rows to an aggregate; PERF(eph): an ORDER BY of string_agg sorts
                -- (copies) the runs' text, so the order is checked, not asked for: the aggregates
                -- of one statement take its rows in one sequence, which is seq order exactly when
                -- array_agg's plain output equals its sorted one. If it ever is not, the text is
                -- joined again in that order.
                SELECT array_agg(w.first), array_agg(w.first ORDER BY w.first),
                       array_agg(w.n ORDER BY w.first),
                       string_agg(substring(w.body FROM w.offs[w.lo + 1] - w.offs[1] + 1
                                            FOR w.offs[w.lo + w.n + 1] - w.offs[w.lo + 1] - 1),
                                  '\x1f'::bytea),
                       sum(w.n)::int4, max(w.first + w.n - 1)
                  INTO v_plain, v_firsts, v_counts, v_run_pay, v_k, v_last
                  FROM (SELECT v.base + v.lo AS first, v.lo, v.body, v.offs,
                               least(v.len, v_need - v.before)::int4 AS n
                          FROM (SELECT c.base, c.body, c.offs, lower(g.r) AS lo,
                                       upper(g.r) - lower(g.r) AS len,
                                       coalesce(sum(upper(g.r) - lower(g.r))
                                                OVER (ORDER BY c.base, lower(g.r)
                                                      ROWS BETWEEN UNBOUNDED PRECEDING
                                                               AND 1 PRECEDING), 0) AS before
                                  FROM queen.eph_chunks c
                                 CROSS JOIN LATERAL unnest(
                                       int4multirange(int4range(
                                           least(greatest(0, v_pos - c.base + 1),
                                                 cardinality(c.offs) - 1)::int4,
                                           cardinality(c.offs) - 1))
                                       - c.gone) AS g(r)
                                 WHERE c.pid = r.id
                                   -- PERF(eph): after a chunk smaller than what is wanted
                                   -- (pushes of a few messages), one range scan of the index
                                   -- instead: chunks past the first hold a message each at
                                   -- least, so v_need + 1 of them are enough, and a probe of
                                   -- the walk read every later entry of its index page
                                   -- (_bt_readpage; pushes of 1, a pop of 100: 8.7M
                                   -- instructions, about 200 probes). An InitPlan runs only
                                   -- where the CASE takes it
                                   AND c.base = ANY (CASE WHEN v_small THEN ARRAY(
                                       SELECT z.base
                                         FROM (SELECT y.base,
                                                      sum(y.got) OVER (
                                                          ORDER BY y.base
                                                          ROWS BETWEEN UNBOUNDED PRECEDING
                                                                   AND 1 PRECEDING) AS before
                                                 FROM (SELECT c0.base,
                                                              c0.live - greatest(
                                                                  0, v_pos - c0.base + 1) AS got
                                                         FROM queen.eph_chunks c0
                                                        WHERE c0.pid = r.id
                                                          AND c0.base >= greatest(
                                                                  v_pos - v_pos % 256, v_floor)
                                                        ORDER BY c0.base
                                                        LIMIT v_need + 1) y) z
                                        WHERE coalesce(z.before, 0) < v_need)
                                   ELSE ARRAY(
                                       WITH RECURSIVE w(base, got) AS (
                                           SELECT k.base, k.live - greatest(0, v_pos - k.base + 1)
                                             FROM (SELECT c1.base, c1.live FROM queen.eph_chunks c1
                                                    WHERE c1.pid = r.id
                                                      AND c1.base >= greatest(v_pos - v_pos % 256,
                                                                              v_floor)
                                                    ORDER BY c1.base LIMIT 1) k
                                           UNION ALL
                                           SELECT k.base, w.got + k.live
                                             FROM w CROSS JOIN LATERAL (
                                                  SELECT c2.base, c2.live FROM queen.eph_chunks c2
                                                   WHERE c2.pid = r.id AND c2.base > w.base
                                                   ORDER BY c2.base LIMIT 1) k
                                            WHERE w.got < v_need)
                                       SELECT w.base FROM w) END)) v
                         WHERE v.before < v_need) w;
                IF v_plain IS DISTINCT FROM v_firsts THEN
                    SELECT string_agg(substring(c.body FROM c.offs[(u.f - c.base)::int4 + 1]
                                                          - c.offs[1] + 1
                                                FOR c.offs[(u.f - c.base + u.n)::int4 + 1]
                                                    - c.offs[(u.f - c.base)::int4 + 1] - 1),
                                      '\x1f'::bytea ORDER BY u.f)
                      INTO v_run_pay
                      FROM unnest(v_firsts, v_counts) AS u(f, n)
                      JOIN queen.eph_chunks c ON c.pid = r.id AND c.base = u.f - u.f % 256;
                END IF;
            END IF;
            IF v_firsts IS NULL THEN
                -- what was left there had been dropped (or another pop took it)
                IF r.last_seq > v_pos THEN
                    UPDATE queen.eph_cursors c SET pos = r.last_seq
                     WHERE c.tenant = p_tenant AND c.queue = p_queue AND c.grp = p_group
                       AND c.partition = r.partition;
                END IF;
                CONTINUE;
            END IF;
            v_pay := CASE WHEN v_pay IS NULL THEN v_run_pay
                          ELSE v_pay || '\x1f'::bytea || v_run_pay END;
            parts := parts || array_fill(r.partition, ARRAY[cardinality(v_firsts)]);
            dlvs := dlvs || array_fill(v_dlv, ARRAY[cardinality(v_firsts)]);
            atts := atts || array_fill(1, ARRAY[cardinality(v_firsts)]);
            firsts := firsts || v_firsts;
            counts := counts || v_counts;
            IF p_auto_ack THEN
                UPDATE queen.eph_cursors c SET pos = v_last
                 WHERE c.tenant = p_tenant AND c.queue = p_queue AND c.grp = p_group
                   AND c.partition = r.partition;
                v_settle_p := v_settle_p || array_fill(r.partition, ARRAY[v_k]);
                v_settle_s := v_settle_s
                              || ARRAY(SELECT generate_series(u.f, u.f + u.n - 1)
                                         FROM unnest(v_firsts, v_counts) AS u(f, n));
            ELSE  -- PERF(eph): the cursor's move and the delivery's row in one statement
                WITH u AS (
                    UPDATE queen.eph_cursors c SET pos = v_last
                     WHERE c.tenant = p_tenant AND c.queue = p_queue AND c.grp = p_group
                       AND c.partition = r.partition
                    RETURNING c.partition)
                INSERT INTO queen.eph_leases (tenant, queue, grp, dlv, partition, seqs, atts,
                                              lease_until)
                SELECT p_tenant, p_queue, p_group, v_dlv, u.partition,
                       -- the runs ascending, each ascending (see the usual pop's)
                       ARRAY(SELECT generate_series(u.f, u.f + u.n - 1)
                               FROM unnest(v_firsts, v_counts) AS u(f, n)),
                       array_fill(1, ARRAY[v_k]), clock_timestamp() + v_lease
                  FROM u;
            END IF;
            v_need := v_need - v_k;
            EXIT WHEN v_need <= 0;
        END LOOP;
    END LOOP;

    epoch := v_epoch;
    payloads := coalesce(v_pay, ''::bytea);
    v_set_n := 0;
    v_set_b := 0;
    IF cardinality(v_ttl_p) > 0 THEN
        IF cardinality(v_settle_s) > 0 THEN  -- the chunks of both, in one run
            PERFORM 1
               FROM (SELECT t.part, k.pid, k.base
                       FROM unnest(v_ttl_p, v_ttl_s) AS t(part, below)
                       JOIN queen.eph_partitions p
                         ON p.tenant = p_tenant AND p.queue = p_queue AND p.partition = t.part
                       JOIN queen.eph_chunks k ON k.pid = p.id AND k.base < t.below
                     UNION
                     SELECT g.part, p.id, g.base
                       FROM (SELECT DISTINCT u.part, u.seq - u.seq % 256 AS base
                               FROM unnest(v_settle_p, v_settle_s) AS u(part, seq)) g
                       JOIN queen.eph_partitions p
                         ON p.tenant = p_tenant AND p.queue = p_queue AND p.partition = g.part) x
               JOIN queen.eph_chunks c ON c.pid = x.pid AND c.base = x.base
              ORDER BY x.part, x.base FOR UPDATE OF c;
        END IF;
        SELECT c.n, c.bytes INTO v_ttl_n, v_ttl_b
          FROM queen.eph_cut_v2(p_tenant, p_queue, v_ttl_p, v_ttl_s, v_ttl_s) c;
    END IF;
    IF cardinality(v_settle_s) > 0 THEN  -- autoAck, or past retryLimit
        SELECT s.n, s.bytes INTO v_set_n, v_set_b
          FROM queen.eph_settle_v3(p_tenant, p_queue, v_settle_p, v_settle_s, false) s;
    END IF;
    IF v_ttl_n + v_set_n + v_dropped > 0 THEN
        v_slot := queen.eph_count_v2(p_tenant, p_queue, -v_ttl_n - v_set_n,
                                     -v_ttl_b - v_set_b, 0, v_ttl_n, v_dropped);
    END IF;
    claimed := p_batch - v_need;
    IF claimed = 0 THEN
        -- a delivery due at once ('-infinity': an ack's redelivery, or one that another pop
        -- held while this one skipped it) is 0 ms away: subtracting -infinity fails
        SELECT greatest(0, ceil(extract(epoch FROM greatest(min(l.lease_until),
                                                            clock_timestamp())
                                                   - clock_timestamp()) * 1000))::int8
          INTO wake_in_ms
          FROM queen.eph_leases l
         WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
           AND (p_partition IS NULL OR l.partition = p_partition);
    END IF;
END;
$$;

-- One outcome per id, in order: acked | redelivered | stale | unknown (api.md). The ids come
-- parsed (queen_mp/models/ephemeral.py parse_id): p_epochs, p_seq_text (the seqs' decimal
-- digits joined by commas, '' an empty element), p_dlvs, NULL for an id that is not one of
-- ours; p_epochs, p_dlvs and p_statuses may hold one element that stands for
-- every id (the usual ack: one delivery's ids, one status), and outcomes is then NULL when
-- every id is 'acked'. An id acts while its delivery (p_dlvs[i]) still holds its message: a
-- redelivery moved it to another delivery, so the older id answers 'unknown'. A 'failed' or
-- 'retry' status makes the message claimable again at once (a delivery of its own, due now),
-- or drops it (counted) when it was already delivered 1 + retryLimit times: that settles it,
-- and answers 'acked'. An id given twice in one call is answered for its first occurrence;
-- the others are 'unknown'. redelivered counts the 'redelivered' outcomes (the caller wakes
-- parked pops). One statement per delivery touched, whatever the count of ids.
CREATE OR REPLACE FUNCTION queen.eph_ack_v5(p_tenant uuid, p_queue text, p_group text,
                                            p_epochs text[], p_seq_text text, p_dlvs int8[],
                                            p_statuses text[],
                                            OUT outcomes text[], OUT redelivered int4)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET plan_cache_mode = force_generic_plan  -- PERF(eph): see the header
AS $$
DECLARE
    v_epoch text;
    v_seqs int8[];  -- the ids' seqs: p_seq_text's (the usual ack: its delivery's)
    v_retry int4;
    v_i int8[];
    v_seq int8[];
    v_dlv int8[];
    v_st text[];
    v_acked int8[];
    v_red int8[];
    v_settle_p text[];
    v_settle_s int8[];
    v_dropped int8;
    v_a_i int8[];
    v_a_s int8[];
    v_r_i int8[];
    v_r_s int8[];
    v_r_a int4[];
    v_drop int8;
    v_set_n int8;
    v_set_b int8;
    v_part text;
    v_k int4;
    v_base int8;
    v_lo int4;
    v_pid int8;
    v_alone boolean;  -- the delivery's group is the queue's only one
    v_del_t tid[];  -- the chunks the usual ack deletes, and those it strikes
    v_upd_t tid[];
    v_upd int8[];
    v_upd_lo int4[];
    v_upd_n int4[];
    v_r0 int4;  -- a run of the usual ack: v_seqs[v_r0:v_r1], v_rn of them
    v_r1 int4;
    v_rn int4;
    v_try int4;
    v_run_n int8;
    v_run_b int8;
    v_ok boolean;
    v_slot int2;  -- unused: see eph_count_v2
    r record;
BEGIN
    IF NOT pg_try_advisory_xact_lock_shared(queen.eph_key_v1(p_tenant, p_queue)) THEN
        PERFORM pg_advisory_xact_lock_shared(queen.eph_key_v1(p_tenant, p_queue));
    END IF;
    -- PERF(eph): the usual ack, every message still held by one delivery acknowledged
    -- 'completed' in the order the pop gave them, sent as one epoch, delivery and status: one
    -- statement on its lease row, none per id, the queue's epoch read by it (v3 read it in a
    -- statement of its own, and split, cast and compared an epoch, a delivery and a status
    -- per id, then sent an 'acked' per id: a third of an ack of 100, callgrind)
    IF cardinality(p_epochs) = 1 AND cardinality(p_dlvs) = 1 AND p_statuses = '{completed}'
    THEN
        DELETE FROM queen.eph_leases l
         WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
           -- PERF(eph): the seqs compared as the text they came as, and then taken from the
           -- row: splitting and casting 100 of them cost some 120k instructions (eph15)
           AND l.dlv = p_dlvs[1] AND array_to_string(l.seqs, ',') = p_seq_text
           AND p_epochs[1] = (SELECT q.epoch FROM queen.eph_queues q
                               WHERE q.tenant = p_tenant AND q.queue = p_queue)
        RETURNING l.seqs, cardinality(l.seqs), l.partition,
                  (SELECT p.id FROM queen.eph_partitions p
                    WHERE p.tenant = l.tenant AND p.queue = l.queue
                      AND p.partition = l.partition),
                  -- PERF(eph): a probe that stops at the first row, where count(*) took an
                  -- aggregate and every row
                  NOT EXISTS (SELECT 1 FROM queen.eph_groups g
                               WHERE g.tenant = l.tenant AND g.queue = l.queue
                                 AND g.grp <> l.grp)
             INTO v_seqs, v_k, v_part, v_pid, v_alone;
        IF FOUND THEN
            redelivered := 0;  -- outcomes NULL: every id acked
            -- PERF(eph): with one group, the delivery's messages all go now (its cursor is past
            -- them, no other delivery holds one, and whatever drops a held message takes it
            -- out of its delivery first, so none is gone yet; 'gone' is checked all the
            -- same), without a query per message. A run that fills what is left of its chunk:
            -- the chunk row goes, in one statement (settle_v3 and strike_v1 took five, and
            -- their calls two more).
            IF v_alone AND v_seqs[v_k] - v_seqs[1] = v_k - 1
               AND v_seqs[v_k] - v_seqs[v_k] % 256 = v_seqs[1] - v_seqs[1] % 256 THEN
                -- (the run's base and first index in the chunk written out in the
                -- statements: plpgsql assignments are dearer, eph14)
                -- PERF(eph): each with the count of what it took (eph_count_v2's statement)
                -- as one statement of a data-modifying CTE, which the chunk's change always
                -- needs: one statement and two plpgsql tests less an ack. A run from the
                -- chunk's start (a pop of a push's size) usually empties it: deleted first;
                -- a run from inside it (a pop of less) usually leaves messages: struck first
                -- (a statement that finds no row costs about what one that does, eph15)
                FOR v_try IN 1..2 LOOP
                    IF (v_try = 1) = (v_seqs[1] % 256 > 0) THEN
                        WITH d AS (
                            UPDATE queen.eph_chunks c
                               SET gone = c.gone + int4multirange(int4range(
                                              (v_seqs[1] % 256)::int4,
                                              (v_seqs[1] % 256)::int4 + v_k)),
                                   live = c.live - v_k
                             WHERE c.pid = v_pid AND c.base = v_seqs[1] - v_seqs[1] % 256
                               AND c.live > v_k
                               AND NOT c.gone && int4multirange(int4range(
                                       (v_seqs[1] % 256)::int4, (v_seqs[1] % 256)::int4 + v_k))
                            RETURNING c.offs[v_seqs[1] % 256 + v_k + 1]
                                      - c.offs[v_seqs[1] % 256 + 1] - v_k AS b)
                        INSERT INTO queen.eph_counts AS c (tenant, queue, slot, depth, bytes,
                                                           drops_bounds, drops_ttl,
                                                           drops_retry)
                        SELECT p_tenant, p_queue, (pg_backend_pid() % 16)::int2, -v_k, -d.b,
                               0, 0, 0
                          FROM d
                        ON CONFLICT (tenant, queue, slot) DO UPDATE
                           SET depth = c.depth + EXCLUDED.depth,
                               bytes = c.bytes + EXCLUDED.bytes
                        RETURNING v_k INTO v_set_n;
                    ELSE
                        WITH d AS (
                            DELETE FROM queen.eph_chunks c
                             WHERE c.pid = v_pid AND c.base = v_seqs[1] - v_seqs[1] % 256
                               AND c.live = v_k
                               AND NOT c.gone && int4multirange(int4range(
                                       (v_seqs[1] % 256)::int4, (v_seqs[1] % 256)::int4 + v_k))
                            RETURNING c.offs[v_seqs[1] % 256 + v_k + 1]
                                      - c.offs[v_seqs[1] % 256 + 1] - v_k AS b)
                        INSERT INTO queen.eph_counts AS c (tenant, queue, slot, depth, bytes,
                                                           drops_bounds, drops_ttl,
                                                           drops_retry)
                        SELECT p_tenant, p_queue, (pg_backend_pid() % 16)::int2, -v_k, -d.b,
                               0, 0, 0
                          FROM d
                        ON CONFLICT (tenant, queue, slot) DO UPDATE
                           SET depth = c.depth + EXCLUDED.depth,
                               bytes = c.bytes + EXCLUDED.bytes
                        RETURNING v_k INTO v_set_n;
                    END IF;
                    EXIT WHEN v_set_n IS NOT NULL;
                END LOOP;
                IF v_set_n IS NOT NULL THEN  -- counted
                    RETURN;
                END IF;
            -- PERF(eph): so do runs of two chunks, a pop's batch that began inside one
            -- chunk and ended inside the next (a pop whose batch is not the pushes': the usual
            -- way, once the cursor is off a chunk's edge): each chunk in one statement, the
            -- first, then the second (ascending), the chunk deleted when the run is what it
            -- has left, else the run struck from it. v2 took the runs' general way below (a
            -- statement grouping the seqs by chunk and locking them, one deleting and
            -- striking): an ack of 70 such messages cost 1.59M instructions (callgrind), an
            -- ack of one chunk's 100 0.84M. width_bucket finds the seqs of the first chunk
            -- by bisection (v_seqs ascend: they are the delivery's)
            ELSIF v_alone THEN
                v_r0 := 1;
                v_base := v_seqs[1] - v_seqs[1] % 256;
                v_r1 := width_bucket(v_base + 255, v_seqs);  -- the first chunk's last
                IF v_r1 < v_k AND v_seqs[v_r1] - v_seqs[1] = v_r1 - 1
                   AND v_seqs[v_k] - v_seqs[v_r1 + 1] = v_k - v_r1 - 1
                   AND v_seqs[v_k] - v_seqs[v_k] % 256
                       = v_seqs[v_r1 + 1] - v_seqs[v_r1 + 1] % 256 THEN
                    v_set_n := 0;
                    v_set_b := 0;
                    LOOP
                        v_base := v_seqs[v_r0] - v_seqs[v_r0] % 256;
                        v_lo := (v_seqs[v_r0] % 256)::int4;
                        v_rn := v_r1 - v_r0 + 1;
                        v_run_n := NULL;
                        -- a second chunk usually keeps messages: its strike is tried first
                        FOR v_try IN 1..2 LOOP
                            IF (v_try = 1) = (v_r0 > 1) THEN
                                UPDATE queen.eph_chunks c
                                   SET gone = c.gone
                                              + int4multirange(int4range(v_lo, v_lo + v_rn)),
                                       live = c.live - v_rn
                                 WHERE c.pid = v_pid AND c.base = v_base AND c.live > v_rn
                                   AND NOT c.gone && int4multirange(int4range(v_lo, v_lo + v_rn))
                                RETURNING v_rn, c.offs[v_lo + v_rn + 1] - c.offs[v_lo + 1] - v_rn
                                     INTO v_run_n, v_run_b;
                            ELSE
                                DELETE FROM queen.eph_chunks c
                                 WHERE c.pid = v_pid AND c.base = v_base AND c.live = v_rn
                                   AND NOT c.gone && int4multirange(int4range(v_lo, v_lo + v_rn))
                                RETURNING v_rn, c.offs[v_lo + v_rn + 1] - c.offs[v_lo + 1] - v_rn
                                     INTO v_run_n, v_run_b;
                            END IF;
                            EXIT WHEN v_run_n IS NOT NULL;
                        END LOOP;
                        IF v_run_n IS NULL THEN  -- a message of the run is gone
                            IF v_r0 = 1 THEN  -- nothing done yet: the general way below
                                v_set_n := NULL;
                            ELSE  -- the first chunk done: the second the general way
                                SELECT v_set_n + s.n, v_set_b + s.bytes INTO v_set_n, v_set_b
                                  FROM queen.eph_settle_v3(p_tenant, p_queue,
                                                           array_fill(v_part, ARRAY[v_k - v_r1]),
                                                           v_seqs[v_r1 + 1:], true) s;
                            END IF;
                            EXIT;
                        END IF;
                        v_set_n := v_set_n + v_run_n;
                        v_set_b := v_set_b + v_run_b;
                        EXIT WHEN v_r1 = v_k;
                        v_r0 := v_r1 + 1;
                        v_r1 := v_k;
                    END LOOP;
                END IF;
            END IF;
            -- PERF(eph): otherwise (part of a chunk, or runs of several: a pop's batch that
            -- is not a push's, pushes of one message), still one group: the chunks locked in
            -- one run, ascending, what each loses computed from the row as locked (as
            -- strike_v1 does), then the emptied ones deleted and the others struck in one
            -- statement; a run with a hole, or a message gone, goes the general way below
            IF v_set_n IS NULL AND v_alone THEN
                SELECT array_agg(x.ctid) FILTER (WHERE x.live = x.n),
                       array_agg(x.ctid) FILTER (WHERE x.live <> x.n),
                       array_agg(x.base) FILTER (WHERE x.live <> x.n),
                       array_agg(x.lo) FILTER (WHERE x.live <> x.n),
                       array_agg(x.n) FILTER (WHERE x.live <> x.n),
                       sum(x.n), sum(x.b), bool_and(x.ok)
                  INTO v_del_t, v_upd_t, v_upd, v_upd_lo, v_upd_n, v_set_n, v_set_b, v_ok
                  FROM (SELECT w.base, c.ctid, c.live, w.lo, w.n,
                               w.hi - w.lo + 1 = w.n
                               AND NOT c.gone && int4multirange(int4range(w.lo, w.hi + 1)) AS ok,
                               -- PERF(eph): the range's bytes from its offsets (schema
                               -- 015), no subquery
                               c.offs[w.hi + 2] - c.offs[w.lo + 1] - (w.hi - w.lo + 1) AS b
                          FROM (SELECT u.s - u.s % 256 AS base, min(u.s % 256)::int4 AS lo,
                                       max(u.s % 256)::int4 AS hi, count(*)::int4 AS n
                                  FROM unnest(v_seqs) AS u(s) GROUP BY 1 ORDER BY 1) w
                         -- PERF(eph): a probe by key each, ascending, and the rows then
                         -- deleted or struck by the ctid it locked (the newest version, which
                         -- no one else can change now): by their keys, joined or = ANY, the
                         -- generic plans read every chunk of the partition (a bitmap scan on
                         -- pid, or with the table's statistics a scan of the table)
                         CROSS JOIN LATERAL (
                               SELECT k.ctid, k.live, k.gone, k.offs FROM queen.eph_chunks k
                                WHERE k.pid = v_pid AND k.base = w.base FOR UPDATE) c) x;
                IF v_ok AND v_set_n = v_k THEN
                    WITH d AS (DELETE FROM queen.eph_chunks c WHERE c.ctid = ANY (v_del_t))
                    UPDATE queen.eph_chunks c
                       SET gone = c.gone + int4multirange(int4range(
                                      v_upd_lo[array_position(v_upd, c.base)],
                                      v_upd_lo[array_position(v_upd, c.base)]
                                      + v_upd_n[array_position(v_upd, c.base)])),
                           live = c.live - v_upd_n[array_position(v_upd, c.base)]
                     WHERE c.ctid = ANY (v_upd_t);
                ELSE
                    v_set_n := NULL;
                END IF;
            END IF;
            IF v_set_n IS NULL THEN
                SELECT s.n, s.bytes INTO v_set_n, v_set_b
                  FROM queen.eph_settle_v3(p_tenant, p_queue, array_fill(v_part, ARRAY[v_k]),
                                           v_seqs, true) s;
            END IF;
            IF v_set_n > 0 THEN  -- PERF(eph): eph_count_v2's statement, inlined (see above)
                INSERT INTO queen.eph_counts AS c (tenant, queue, slot, depth, bytes,
                                                   drops_bounds, drops_ttl, drops_retry)
                VALUES (p_tenant, p_queue, (pg_backend_pid() % 16)::int2, -v_set_n, -v_set_b,
                        0, 0, 0)
                ON CONFLICT (tenant, queue, slot) DO UPDATE
                   SET depth = c.depth + EXCLUDED.depth, bytes = c.bytes + EXCLUDED.bytes;
            END IF;
            RETURN;
        END IF;
    END IF;
    v_seqs := string_to_array(p_seq_text, ',', '')::int8[];
    v_k := cardinality(v_seqs);
    v_acked := '{}';
    v_red := '{}';
    v_settle_p := '{}';
    v_settle_s := '{}';
    v_dropped := 0;
    -- PERF(eph): eph_enter_v1 inlined (its lock taken above, its read a statement): a plpgsql
    -- call costs its own set-up besides its statement; it runs when the queue has no row, to
    -- insert it
    SELECT q.epoch INTO v_epoch FROM queen.eph_queues q
     WHERE q.tenant = p_tenant AND q.queue = p_queue;
    IF v_epoch IS NULL THEN
        v_epoch := queen.eph_enter_v1(p_tenant, p_queue);
    END IF;
    IF v_k > 1 THEN  -- an element for every id
        IF cardinality(p_epochs) = 1 THEN
            p_epochs := array_fill(p_epochs[1], ARRAY[v_k]);
        END IF;
        IF cardinality(p_dlvs) = 1 THEN
            p_dlvs := array_fill(p_dlvs[1], ARRAY[v_k]);
        END IF;
        IF cardinality(p_statuses) = 1 THEN
            p_statuses := array_fill(p_statuses[1], ARRAY[v_k]);
        END IF;
    END IF;
    v_retry := (queen.eph_options_v1(p_tenant, p_queue) ->> 'retryLimit')::int4;
    -- the ids of this incarnation, first occurrence of each message
    SELECT array_agg(x.i), array_agg(x.seq), array_agg(x.dlv), array_agg(x.st)
      INTO v_i, v_seq, v_dlv, v_st
      FROM (SELECT DISTINCT ON (u.seq) u.i, u.seq, u.dlv, u.st
              FROM unnest(p_epochs, v_seqs, p_dlvs, p_statuses)
                   WITH ORDINALITY AS u(ep, seq, dlv, st, i)
             WHERE u.ep = v_epoch AND u.seq IS NOT NULL AND u.dlv IS NOT NULL
             ORDER BY u.seq, u.i) AS x;
    -- the deliveries, ascending (the lease rows' lock order)
    FOR r IN SELECT l.dlv, l.partition, l.seqs, l.atts FROM queen.eph_leases l
              WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
                AND l.dlv = ANY (v_dlv)
              ORDER BY l.dlv FOR UPDATE LOOP
        SELECT coalesce(array_agg(x.i) FILTER (WHERE x.done), '{}'),
               coalesce(array_agg(x.seq) FILTER (WHERE x.done), '{}'),
               count(*) FILTER (WHERE x.done AND x.st <> 'completed'),
               coalesce(array_agg(x.i) FILTER (WHERE NOT x.done), '{}'),
               coalesce(array_agg(x.seq ORDER BY x.seq) FILTER (WHERE NOT x.done), '{}'),
               coalesce(array_agg(x.att ORDER BY x.seq) FILTER (WHERE NOT x.done), '{}')
          INTO v_a_i, v_a_s, v_drop, v_r_i, v_r_s, v_r_a
          FROM (SELECT u.i, u.seq, u.st, a.att, (u.st = 'completed' OR a.att > v_retry) AS done
                  FROM unnest(v_i, v_seq, v_dlv, v_st) AS u(i, seq, dlv, st)
                  JOIN unnest(r.seqs, r.atts) AS a(seq, att) ON a.seq = u.seq
                 WHERE u.dlv = r.dlv) x;
        CONTINUE WHEN cardinality(v_a_i) + cardinality(v_r_i) = 0;
        IF cardinality(v_a_i) + cardinality(v_r_i) = cardinality(r.seqs) THEN
            DELETE FROM queen.eph_leases l
             WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
               AND l.dlv = r.dlv;
        ELSE
            UPDATE queen.eph_leases l
               SET seqs = ARRAY(SELECT z.s FROM unnest(r.seqs) AS z(s)
                                 WHERE z.s <> ALL (v_a_s) AND z.s <> ALL (v_r_s) ORDER BY z.s),
                   atts = ARRAY(SELECT z.a FROM unnest(r.seqs, r.atts) AS z(s, a)
                                 WHERE z.s <> ALL (v_a_s) AND z.s <> ALL (v_r_s) ORDER BY z.s)
             WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
               AND l.dlv = r.dlv;
        END IF;
        IF cardinality(v_r_i) > 0 THEN
            INSERT INTO queen.eph_leases (tenant, queue, grp, dlv, partition, seqs, atts,
                                          lease_until)
            VALUES (p_tenant, p_queue, p_group, nextval('queen.eph_seq'), r.partition, v_r_s,
                    v_r_a, '-infinity');
        END IF;
        v_acked := v_acked || v_a_i;
        v_red := v_red || v_r_i;
        v_dropped := v_dropped + v_drop;
        v_settle_p := v_settle_p || array_fill(r.partition, ARRAY[cardinality(v_a_s)]);
        v_settle_s := v_settle_s || v_a_s;
    END LOOP;
    SELECT coalesce(array_agg(coalesce(o.outcome,
                                       CASE WHEN u.ep IS NOT NULL AND u.ep IS DISTINCT FROM v_epoch
                                            THEN 'stale' ELSE 'unknown' END) ORDER BY u.i), '{}')
      INTO outcomes
      FROM unnest(p_epochs) WITH ORDINALITY AS u(ep, i)
      LEFT JOIN (SELECT a.i, 'acked' AS outcome FROM unnest(v_acked) AS a(i)
                 UNION ALL
                 SELECT d.i, 'redelivered' FROM unnest(v_red) AS d(i)) o ON o.i = u.i;
    SELECT s.n, s.bytes INTO v_set_n, v_set_b
      FROM queen.eph_settle_v3(p_tenant, p_queue, v_settle_p, v_settle_s, false) s;
    IF v_set_n + v_dropped > 0 THEN
        v_slot := queen.eph_count_v2(p_tenant, p_queue, -v_set_n, -v_set_b, 0, 0, v_dropped);
    END IF;
    redelivered := cardinality(v_red);
END;
$$;

CREATE OR REPLACE FUNCTION queen.eph_reset_v1(p_tenant uuid, p_queue text)
RETURNS int8
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_depth int8;
BEGIN
    PERFORM pg_advisory_xact_lock(queen.eph_key_v1(p_tenant, p_queue));
    PERFORM 1 FROM queen.eph_queues q WHERE q.tenant = p_tenant AND q.queue = p_queue;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    SELECT coalesce(sum(c.depth), 0) INTO v_depth FROM queen.eph_counts c
     WHERE c.tenant = p_tenant AND c.queue = p_queue;
    DELETE FROM queen.eph_chunks c USING queen.eph_partitions p
     WHERE p.tenant = p_tenant AND p.queue = p_queue AND c.pid = p.id;
    DELETE FROM queen.eph_leases WHERE tenant = p_tenant AND queue = p_queue;
    DELETE FROM queen.eph_cursors WHERE tenant = p_tenant AND queue = p_queue;
    DELETE FROM queen.eph_groups WHERE tenant = p_tenant AND queue = p_queue;
    DELETE FROM queen.eph_partitions WHERE tenant = p_tenant AND queue = p_queue;
    UPDATE queen.eph_counts SET depth = 0, bytes = 0
     WHERE tenant = p_tenant AND queue = p_queue;
    UPDATE queen.eph_queues
       SET epoch = substr(replace(gen_random_uuid()::text, '-', ''), 1, 16)
     WHERE tenant = p_tenant AND queue = p_queue;
    RETURN v_depth;
END;
$$;

CREATE OR REPLACE FUNCTION queen.eph_delete_v1(p_tenant uuid, p_queue text)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_ring boolean;
    v_declared boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(queen.eph_key_v1(p_tenant, p_queue));
    DELETE FROM queen.eph_queues WHERE tenant = p_tenant AND queue = p_queue;
    v_ring := FOUND;
    IF v_ring THEN
        DELETE FROM queen.eph_chunks c USING queen.eph_partitions p
         WHERE p.tenant = p_tenant AND p.queue = p_queue AND c.pid = p.id;
        DELETE FROM queen.eph_leases WHERE tenant = p_tenant AND queue = p_queue;
        DELETE FROM queen.eph_cursors WHERE tenant = p_tenant AND queue = p_queue;
        DELETE FROM queen.eph_groups WHERE tenant = p_tenant AND queue = p_queue;
        DELETE FROM queen.eph_partitions WHERE tenant = p_tenant AND queue = p_queue;
        DELETE FROM queen.eph_counts WHERE tenant = p_tenant AND queue = p_queue;
    END IF;
    DELETE FROM queen.eph_config WHERE tenant = p_tenant AND queue = p_queue;
    v_declared := FOUND;
    RETURN jsonb_build_object('queue', p_queue, 'deleted', v_ring OR v_declared,
                              'declared', v_declared);
END;
$$;

-- The queue's gauges: what the list shows per queue and the depth read starts from.
CREATE OR REPLACE FUNCTION queen.eph_gauges_v1(p_tenant uuid, p_queue text)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT jsonb_build_object(
        'queue', p_queue,
        'tier', CASE WHEN EXISTS (SELECT 1 FROM queen.eph_config c
                                   WHERE c.tenant = p_tenant AND c.queue = p_queue)
                     THEN 'declared' ELSE 'implicit' END,
        'depth', coalesce(n.depth, 0),
        'bytes', coalesce(n.bytes, 0),
        'partitions', (SELECT count(*) FROM queen.eph_partitions p
                        WHERE p.tenant = p_tenant AND p.queue = p_queue),
        'groups', (SELECT count(*) FROM queen.eph_groups g
                    WHERE g.tenant = p_tenant AND g.queue = p_queue),
        'drops', jsonb_build_object('bounds', coalesce(n.drops_bounds, 0),
                                    'ttl', coalesce(n.drops_ttl, 0),
                                    'retry', coalesce(n.drops_retry, 0)),
        'options', queen.eph_options_v1(p_tenant, p_queue))
      FROM (SELECT sum(c.depth) AS depth, sum(c.bytes) AS bytes,
                   sum(c.drops_bounds) AS drops_bounds, sum(c.drops_ttl) AS drops_ttl,
                   sum(c.drops_retry) AS drops_retry
              FROM queen.eph_counts c WHERE c.tenant = p_tenant AND c.queue = p_queue) n
$$;

CREATE OR REPLACE FUNCTION queen.eph_list_v1(p_tenant uuid, p_limit int4)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    WITH names AS (
        SELECT n.queue FROM (SELECT q.queue FROM queen.eph_queues q WHERE q.tenant = p_tenant
                             UNION
                             SELECT c.queue FROM queen.eph_config c WHERE c.tenant = p_tenant) n
         ORDER BY n.queue COLLATE "C" LIMIT p_limit + 1),
    firsts AS (
        SELECT n.queue FROM names n ORDER BY n.queue COLLATE "C" LIMIT p_limit)
    SELECT jsonb_build_object(
        'queues', coalesce((SELECT jsonb_agg(queen.eph_gauges_v1(p_tenant, f.queue)
                                             ORDER BY f.queue COLLATE "C") FROM firsts f),
                           '[]'::jsonb),
        'count', (SELECT count(*) FROM firsts),
        'truncated', (SELECT count(*) FROM names) > p_limit)
$$;

-- NULL when the queue has neither a ring nor a declaration (the route answers 404).
CREATE OR REPLACE FUNCTION queen.eph_depth_v1(p_tenant uuid, p_queue text, p_limit int4)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT g0.gauges || jsonb_build_object(
        'pending', g0.gauges -> 'depth',
        'partitionsPending', coalesce((
            SELECT jsonb_agg(jsonb_build_object('partition', x.partition, 'pending', x.n)
                             ORDER BY x.partition COLLATE "C")
              FROM (SELECT y.partition, y.n
                      FROM (SELECT p.partition, (SELECT coalesce(sum(k.live), 0)
                                                   FROM queen.eph_chunks k
                                                  WHERE k.pid = p.id) AS n
                              FROM queen.eph_partitions p
                             WHERE p.tenant = p_tenant AND p.queue = p_queue) y
                     WHERE y.n > 0 ORDER BY y.partition COLLATE "C" LIMIT p_limit) x),
            '[]'::jsonb),
        'consumerGroups', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'group', g.grp,
                       -- a chunk's stored messages past the cursor
                       'pending', (SELECT coalesce(sum(queen.eph_width_v1(
                                            int4multirange(int4range(
                                                greatest(0, coalesce(c.pos, 0) - k.base + 1)::int4,
                                                cardinality(k.offs) - 1)) - k.gone)), 0)
                                     FROM queen.eph_partitions p
                                     LEFT JOIN queen.eph_cursors c
                                       ON c.tenant = p.tenant AND c.queue = p.queue
                                      AND c.grp = g.grp AND c.partition = p.partition
                                     JOIN queen.eph_chunks k
                                       ON k.pid = p.id
                                      AND k.base + cardinality(k.offs) - 2 > coalesce(c.pos, 0)
                                    WHERE p.tenant = p_tenant AND p.queue = p_queue),
                       'inFlight', (SELECT coalesce(sum(cardinality(l.seqs)), 0)
                                      FROM queen.eph_leases l
                                     WHERE l.tenant = p_tenant AND l.queue = p_queue
                                       AND l.grp = g.grp))
                       ORDER BY g.grp COLLATE "C")
              FROM (SELECT g1.grp FROM queen.eph_groups g1
                     WHERE g1.tenant = p_tenant AND g1.queue = p_queue
                     ORDER BY g1.grp COLLATE "C" LIMIT p_limit) g),
            '[]'::jsonb))
      FROM (SELECT queen.eph_gauges_v1(p_tenant, p_queue) AS gauges) g0
     WHERE EXISTS (SELECT 1 FROM queen.eph_queues q WHERE q.tenant = p_tenant AND q.queue = p_queue)
        OR EXISTS (SELECT 1 FROM queen.eph_config c WHERE c.tenant = p_tenant AND c.queue = p_queue)
$$;
