-- ephemeral.sql: ephemeral queues (api.md "Ephemeral queues", routes /api/v1/ephemeral/*) on the
-- UNLOGGED tables of schema/008_ephemeral.sql. Python (queen_mp/models/ephemeral.py) validates
-- every input first; queen_mp/db/ephemeral_procs.py is the only caller.
--
-- Model: one ring per (tenant, queue): messages numbered by a per-queue seq in push commit
-- order, each in a partition. Every consumer group ('__QUEUE_MODE__' without one) has a cursor
-- per partition (every seq <= pos was handed out to it) and leases on what it was given and
-- has not acknowledged. So groups fan out (each sees every message) and the consumers of one
-- group compete. A message is deleted once every group that has popped the queue is past it
-- and holds no lease on it, or earlier by the queue's bounds (maxLength/maxBytes with policy
-- dropOldest), its ttlSeconds, or after retryLimit redeliveries; each drop is counted.
--
-- Message ids are '<epoch>-<seq>-<attempts>': the epoch is the queue row's incarnation (new at
-- creation and at reset, and the row is gone after a PostgreSQL crash), so an ack of an older
-- incarnation answers 'stale'; the attempts fence an ack of a delivery that was redelivered
-- since ('unknown').
--
-- Functions:
--   queen.eph_defaults_v1() -> jsonb                      the options of an undeclared queue
--   queen.eph_options_v1(uuid, text) -> jsonb             effective options (defaults || declared)
--   queen.eph_lock_queue_v1(uuid, text) -> queen.eph_queues  the queue row, created if missing,
--                                                         locked FOR UPDATE
--   queen.eph_expire_v1(uuid, text, int4) -> void         drop messages older than ttlSeconds
--   queen.eph_settle_v1(uuid, text, int8[]) -> void       delete those of the seqs no group needs
--   queen.eph_configure_v1(uuid, text, jsonb) -> jsonb    declare (upsert eph_config)
--   queen.eph_push_v1(uuid, text, text, text[]) -> int4   append; QE001 when full (policy reject)
--   queen.eph_pop_v1(uuid, text, text, text, int4, boolean)
--       -> (messages text, claimed int4, wake_in_ms int8)
--   queen.eph_ack_v1(uuid, text, text, text[], int8[], int4[], text[])
--       -> (outcomes text[], redelivered int4)
--   queen.eph_reset_v1(uuid, text) -> int8                dropped messages
--   queen.eph_delete_v1(uuid, text) -> jsonb              {deleted, declared}
--   queen.eph_list_v1(uuid, int4) -> jsonb                {queues, count, truncated}
--   queen.eph_depth_v1(uuid, text, int4) -> jsonb         NULL when the queue does not exist
--
-- Tables touched: queen.eph_config (configure, delete: write; the rest: read),
--   queen.eph_queues, eph_partitions, eph_groups, eph_cursors, eph_leases, eph_messages.
--
-- Lock order: every writing function first locks the queue row (eph_queues FOR UPDATE, via
--   eph_lock_queue_v1, or a plain FOR UPDATE in ack/reset/delete) and only then touches that
--   queue's other rows; no function touches two queues. All writers of one queue are therefore
--   serialised on its row and cannot deadlock; seqs become visible in order. These tables are
--   outside every lock space of the durable log.
--
-- SQLSTATEs raised:
--   QE001  eph_push_v1: the queue is at maxLength/maxBytes and its policy is 'reject', or the
--          push alone is larger than the queue's bounds. MESSAGE 'queue_full', DETAIL says which.

CREATE OR REPLACE FUNCTION queen.eph_defaults_v1()
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT '{"maxBytes": 67108864, "maxLength": 100000, "policy": "reject", "ttlSeconds": 0,
             "leaseSeconds": 30, "retryLimit": 3, "windowBuffer": {"ms": 0, "count": 0}}'::jsonb
$$;

CREATE OR REPLACE FUNCTION queen.eph_options_v1(p_tenant uuid, p_queue text)
RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT queen.eph_defaults_v1()
        || coalesce((SELECT c.options FROM queen.eph_config c
                      WHERE c.tenant = p_tenant AND c.queue = p_queue), '{}'::jsonb)
$$;

CREATE OR REPLACE FUNCTION queen.eph_lock_queue_v1(p_tenant uuid, p_queue text)
RETURNS queen.eph_queues
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_q queen.eph_queues;
BEGIN
    SELECT * INTO v_q FROM queen.eph_queues
     WHERE tenant = p_tenant AND queue = p_queue FOR UPDATE;
    IF FOUND THEN
        RETURN v_q;
    END IF;
    INSERT INTO queen.eph_queues (tenant, queue, epoch)
    VALUES (p_tenant, p_queue, substr(replace(gen_random_uuid()::text, '-', ''), 1, 16))
    ON CONFLICT DO NOTHING;
    SELECT * INTO v_q FROM queen.eph_queues
     WHERE tenant = p_tenant AND queue = p_queue FOR UPDATE;
    RETURN v_q;
END;
$$;

-- Drops the messages older than p_ttl_s seconds (0 = no age limit). The queue row is locked.
CREATE OR REPLACE FUNCTION queen.eph_expire_v1(p_tenant uuid, p_queue text, p_ttl_s int4)
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_cutoff timestamptz;
    v_oldest timestamptz;
    v_keep int8;
    v_n int8;
    v_bytes int8;
BEGIN
    IF p_ttl_s IS NULL OR p_ttl_s <= 0 THEN
        RETURN;
    END IF;
    v_cutoff := clock_timestamp() - make_interval(secs => p_ttl_s);
    SELECT m.created_at INTO v_oldest FROM queen.eph_messages m
     WHERE m.tenant = p_tenant AND m.queue = p_queue ORDER BY m.seq LIMIT 1;
    IF v_oldest IS NULL OR v_oldest >= v_cutoff THEN
        RETURN;
    END IF;
    -- created_at is taken after the queue lock (clock_timestamp), so it grows with seq: the
    -- expired messages are a prefix; this walk stops at the first live one.
    SELECT m.seq INTO v_keep FROM queen.eph_messages m
     WHERE m.tenant = p_tenant AND m.queue = p_queue AND m.created_at >= v_cutoff
     ORDER BY m.seq LIMIT 1;
    WITH d AS (
        DELETE FROM queen.eph_messages m
         WHERE m.tenant = p_tenant AND m.queue = p_queue
           AND (v_keep IS NULL OR m.seq < v_keep)
        RETURNING m.bytes)
    SELECT count(*), coalesce(sum(d.bytes), 0) INTO v_n, v_bytes FROM d;
    DELETE FROM queen.eph_leases l
     WHERE l.tenant = p_tenant AND l.queue = p_queue AND (v_keep IS NULL OR l.seq < v_keep);
    UPDATE queen.eph_queues
       SET depth = depth - v_n, bytes = bytes - v_bytes, drops_ttl = drops_ttl + v_n
     WHERE tenant = p_tenant AND queue = p_queue;
END;
$$;

-- Deletes the messages among p_seqs that no group needs any more: every group that popped the
-- queue is past it in its partition and none holds a lease on it. The queue row is locked.
CREATE OR REPLACE FUNCTION queen.eph_settle_v1(p_tenant uuid, p_queue text, p_seqs int8[])
RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_n int8;
    v_bytes int8;
    v_lo int8;
    v_hi int8;
BEGIN
    IF p_seqs IS NULL OR cardinality(p_seqs) = 0 THEN
        RETURN;
    END IF;
    SELECT min(x), max(x) INTO v_lo, v_hi FROM unnest(p_seqs) AS u(x);
    -- the seq range makes the primary key the access path whatever the statistics say
    WITH d AS (
        DELETE FROM queen.eph_messages m
         WHERE m.tenant = p_tenant AND m.queue = p_queue
           AND m.seq BETWEEN v_lo AND v_hi AND m.seq = ANY (p_seqs)
           AND NOT EXISTS (SELECT 1 FROM queen.eph_leases l
                            WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.seq = m.seq)
           AND NOT EXISTS (SELECT 1 FROM queen.eph_groups g
                             LEFT JOIN queen.eph_cursors c
                               ON c.tenant = g.tenant AND c.queue = g.queue AND c.grp = g.grp
                              AND c.partition = m.partition
                            WHERE g.tenant = p_tenant AND g.queue = p_queue
                              AND coalesce(c.pos, 0) < m.seq)
        RETURNING m.bytes)
    SELECT count(*), coalesce(sum(d.bytes), 0) INTO v_n, v_bytes FROM d;
    IF v_n > 0 THEN
        UPDATE queen.eph_queues SET depth = depth - v_n, bytes = bytes - v_bytes
         WHERE tenant = p_tenant AND queue = p_queue;
    END IF;
END;
$$;

CREATE OR REPLACE FUNCTION queen.eph_configure_v1(p_tenant uuid, p_queue text, p_options jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    PERFORM queen.eph_lock_queue_v1(p_tenant, p_queue);
    INSERT INTO queen.eph_config (tenant, queue, options) VALUES (p_tenant, p_queue, p_options)
    ON CONFLICT (tenant, queue) DO UPDATE SET options = EXCLUDED.options, updated_at = now();
    RETURN jsonb_build_object('queue', p_queue, 'tier', 'declared', 'configured', true,
                              'options', queen.eph_options_v1(p_tenant, p_queue));
END;
$$;

CREATE OR REPLACE FUNCTION queen.eph_push_v1(p_tenant uuid, p_queue text, p_partition text,
                                             p_payloads text[])
RETURNS int4
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_q queen.eph_queues;
    v_o jsonb;
    v_n int8 := coalesce(cardinality(p_payloads), 0);
    v_bytes int8;
    v_max_len int8;
    v_max_bytes int8;
    v_need_len int8;
    v_need_bytes int8;
    v_cut int8;
    v_cnt int8 := 0;
    v_sum int8 := 0;
    r record;
BEGIN
    IF v_n = 0 THEN
        RETURN 0;
    END IF;
    v_q := queen.eph_lock_queue_v1(p_tenant, p_queue);
    v_o := queen.eph_options_v1(p_tenant, p_queue);
    PERFORM queen.eph_expire_v1(p_tenant, p_queue, (v_o ->> 'ttlSeconds')::int4);
    SELECT * INTO v_q FROM queen.eph_queues WHERE tenant = p_tenant AND queue = p_queue;
    SELECT sum(octet_length(p)) INTO v_bytes FROM unnest(p_payloads) AS u(p);
    v_max_len := (v_o ->> 'maxLength')::int8;
    v_max_bytes := (v_o ->> 'maxBytes')::int8;
    IF v_n > v_max_len OR v_bytes > v_max_bytes THEN
        RAISE EXCEPTION USING ERRCODE = 'QE001', MESSAGE = 'queue_full',
            DETAIL = format('this push (%s messages, %s bytes) is larger than the queue '
                            '(maxLength %s, maxBytes %s)', v_n, v_bytes, v_max_len, v_max_bytes);
    END IF;
    v_need_len := v_q.depth + v_n - v_max_len;
    v_need_bytes := v_q.bytes + v_bytes - v_max_bytes;
    IF v_need_len > 0 OR v_need_bytes > 0 THEN
        IF v_o ->> 'policy' = 'reject' THEN
            RAISE EXCEPTION USING ERRCODE = 'QE001', MESSAGE = 'queue_full',
                DETAIL = format('the queue holds %s messages, %s bytes (maxLength %s, maxBytes %s) '
                                'and its policy is reject', v_q.depth, v_q.bytes, v_max_len,
                                v_max_bytes);
        END IF;
        -- dropOldest: the shortest prefix of the ring that makes room
        FOR r IN SELECT m.seq, m.bytes FROM queen.eph_messages m
                  WHERE m.tenant = p_tenant AND m.queue = p_queue ORDER BY m.seq LOOP
            v_cnt := v_cnt + 1;
            v_sum := v_sum + r.bytes;
            v_cut := r.seq;
            EXIT WHEN v_cnt >= v_need_len AND v_sum >= v_need_bytes;
        END LOOP;
        IF v_cut IS NOT NULL THEN
            DELETE FROM queen.eph_messages m
             WHERE m.tenant = p_tenant AND m.queue = p_queue AND m.seq <= v_cut;
            DELETE FROM queen.eph_leases l
             WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.seq <= v_cut;
            UPDATE queen.eph_queues
               SET depth = depth - v_cnt, bytes = bytes - v_sum, drops_bounds = drops_bounds + v_cnt
             WHERE tenant = p_tenant AND queue = p_queue;
        END IF;
    END IF;
    INSERT INTO queen.eph_messages (tenant, queue, seq, partition, payload, bytes, created_at)
    SELECT p_tenant, p_queue, v_q.next_seq + u.i, p_partition, u.p, octet_length(u.p),
           clock_timestamp()
      FROM unnest(p_payloads) WITH ORDINALITY AS u(p, i);
    UPDATE queen.eph_queues
       SET next_seq = next_seq + v_n, depth = depth + v_n, bytes = bytes + v_bytes
     WHERE tenant = p_tenant AND queue = p_queue;
    INSERT INTO queen.eph_partitions (tenant, queue, partition, last_seq)
    VALUES (p_tenant, p_queue, p_partition, v_q.next_seq + v_n)
    ON CONFLICT (tenant, queue, partition) DO UPDATE SET last_seq = EXCLUDED.last_seq;
    RETURN v_n;
END;
$$;

-- Up to p_batch messages for p_group (redeliveries first, then new ones, the partitions whose
-- cursor is furthest behind first); p_partition NULL = any partition. messages is the JSON
-- array of the answer ([{id, partition, attempts, payload}], payloads verbatim), claimed its
-- length; wake_in_ms,
-- when nothing was claimable, says when a lease of this group expires (NULL: none).
CREATE OR REPLACE FUNCTION queen.eph_pop_v1(p_tenant uuid, p_queue text, p_partition text,
                                            p_group text, p_batch int4, p_auto_ack boolean,
                                            OUT messages text, OUT claimed int4,
                                            OUT wake_in_ms int8)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_q queen.eph_queues;
    v_o jsonb;
    v_lease interval;
    v_retry int4;
    v_seqs int8[] := '{}';
    v_parts text[] := '{}';
    v_atts int4[] := '{}';
    v_settle int8[] := '{}';
    v_taken int8[];
    v_need int4 := p_batch;
    v_dropped int8 := 0;
    r record;
BEGIN
    v_q := queen.eph_lock_queue_v1(p_tenant, p_queue);
    v_o := queen.eph_options_v1(p_tenant, p_queue);
    v_lease := make_interval(secs => (v_o ->> 'leaseSeconds')::int4);
    v_retry := (v_o ->> 'retryLimit')::int4;
    PERFORM queen.eph_expire_v1(p_tenant, p_queue, (v_o ->> 'ttlSeconds')::int4);
    INSERT INTO queen.eph_groups (tenant, queue, grp) VALUES (p_tenant, p_queue, p_group)
    ON CONFLICT DO NOTHING;

    -- 1. expired leases: redeliver, or drop after retryLimit redeliveries
    FOR r IN SELECT l.seq, l.partition, l.attempts FROM queen.eph_leases l
              WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
                AND l.lease_until <= now()  -- stable: an index condition of the due index
                AND (p_partition IS NULL OR l.partition = p_partition)
              ORDER BY l.seq LIMIT p_batch LOOP
        IF r.attempts > v_retry THEN
            DELETE FROM queen.eph_leases l
             WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
               AND l.seq = r.seq;
            v_dropped := v_dropped + 1;
            v_settle := v_settle || r.seq;
            CONTINUE;
        END IF;
        v_seqs := v_seqs || r.seq;
        v_parts := v_parts || r.partition;
        v_atts := v_atts || (r.attempts + 1);
        IF p_auto_ack THEN
            DELETE FROM queen.eph_leases l
             WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
               AND l.seq = r.seq;
            v_settle := v_settle || r.seq;
        ELSE
            UPDATE queen.eph_leases l
               SET attempts = r.attempts + 1, lease_until = clock_timestamp() + v_lease
             WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
               AND l.seq = r.seq;
        END IF;
        v_need := v_need - 1;
    END LOOP;
    IF v_dropped > 0 THEN
        UPDATE queen.eph_queues SET drops_retry = drops_retry + v_dropped
         WHERE tenant = p_tenant AND queue = p_queue;
    END IF;

    -- 2. new messages, partition by partition
    IF v_need > 0 THEN
        FOR r IN SELECT p.partition, p.last_seq, coalesce(c.pos, 0) AS pos
                   FROM queen.eph_partitions p
                   LEFT JOIN queen.eph_cursors c
                     ON c.tenant = p.tenant AND c.queue = p.queue AND c.grp = p_group
                    AND c.partition = p.partition
                  WHERE p.tenant = p_tenant AND p.queue = p_queue
                    AND (p_partition IS NULL OR p.partition = p_partition)
                    AND p.last_seq > coalesce(c.pos, 0)
                  ORDER BY coalesce(c.pos, 0), p.partition LOOP
            SELECT array_agg(s.seq ORDER BY s.seq) INTO v_taken
              FROM (SELECT m.seq FROM queen.eph_messages m
                     WHERE m.tenant = p_tenant AND m.queue = p_queue
                       AND m.partition = r.partition AND m.seq > r.pos
                     ORDER BY m.seq LIMIT v_need) s;
            INSERT INTO queen.eph_cursors (tenant, queue, grp, partition, pos)
            VALUES (p_tenant, p_queue, p_group, r.partition,
                    CASE WHEN v_taken IS NULL THEN r.last_seq
                         ELSE v_taken[cardinality(v_taken)] END)
            ON CONFLICT (tenant, queue, grp, partition) DO UPDATE SET pos = EXCLUDED.pos;
            CONTINUE WHEN v_taken IS NULL;  -- what was left there had been dropped
            v_seqs := v_seqs || v_taken;
            v_parts := v_parts || array_fill(r.partition, ARRAY[cardinality(v_taken)]);
            v_atts := v_atts || array_fill(1, ARRAY[cardinality(v_taken)]);
            IF p_auto_ack THEN
                v_settle := v_settle || v_taken;
            ELSE
                INSERT INTO queen.eph_leases (tenant, queue, grp, seq, partition, attempts,
                                              lease_until)
                SELECT p_tenant, p_queue, p_group, t.seq, r.partition, 1,
                       clock_timestamp() + v_lease
                  FROM unnest(v_taken) AS t(seq);
            END IF;
            v_need := v_need - cardinality(v_taken);
            EXIT WHEN v_need <= 0;
        END LOOP;
    END IF;

    -- compact JSON, built as text: the stored payload text goes out as it is. One primary
    -- key lookup per message: the tables are often younger than their statistics, and a
    -- join here was planned as a scan of the whole queue.
    SELECT '[' || coalesce(string_agg(
               '{"id":"' || v_q.epoch || '-' || s.seq || '-' || s.att
               || '","partition":' || to_json(s.part)::text
               || ',"attempts":' || s.att || ',"payload":'
               || (SELECT m.payload FROM queen.eph_messages m
                    WHERE m.tenant = p_tenant AND m.queue = p_queue AND m.seq = s.seq) || '}',
               ',' ORDER BY s.ord), '') || ']'
      INTO messages
      FROM unnest(v_seqs, v_parts, v_atts) WITH ORDINALITY AS s(seq, part, att, ord);
    PERFORM queen.eph_settle_v1(p_tenant, p_queue, v_settle);
    claimed := cardinality(v_seqs);
    IF claimed = 0 THEN
        SELECT greatest(0, ceil(extract(epoch FROM min(l.lease_until) - clock_timestamp())
                                * 1000))::int8
          INTO wake_in_ms
          FROM queen.eph_leases l
         WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
           AND (p_partition IS NULL OR l.partition = p_partition);
    END IF;
END;
$$;

-- One outcome per id, in order: acked | redelivered | stale | unknown (api.md). The ids come
-- parsed (queen_mp/models/ephemeral.py parse_id): p_epochs, p_seqs, p_atts, NULL for an id that
-- is not one of ours. A 'failed' or 'retry' status makes the message claimable again at once,
-- or drops it (counted) when it was already delivered 1 + retryLimit times: that settles it,
-- and answers 'acked'. An id given twice in one call is answered for its first occurrence;
-- the others are 'unknown'. redelivered counts the 'redelivered' outcomes (the caller wakes
-- parked pops). Set-based: one DELETE and one UPDATE of the leases, whatever the count.
CREATE OR REPLACE FUNCTION queen.eph_ack_v1(p_tenant uuid, p_queue text, p_group text,
                                            p_epochs text[], p_seqs int8[], p_atts int4[],
                                            p_statuses text[],
                                            OUT outcomes text[], OUT redelivered int4)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_q queen.eph_queues;
    v_retry int4;
    v_i int8[];
    v_seq int8[];
    v_att int4[];
    v_st text[];
    v_lo int8;
    v_hi int8;
    v_acked int8[] := '{}';
    v_settle int8[] := '{}';
    v_red int8[] := '{}';
    v_dropped int8 := 0;
BEGIN
    SELECT * INTO v_q FROM queen.eph_queues
     WHERE tenant = p_tenant AND queue = p_queue FOR UPDATE;
    v_retry := (queen.eph_options_v1(p_tenant, p_queue) ->> 'retryLimit')::int4;
    -- the ids of this incarnation, first occurrence of each message
    SELECT array_agg(x.i), array_agg(x.seq), array_agg(x.att), array_agg(x.st),
           min(x.seq), max(x.seq)
      INTO v_i, v_seq, v_att, v_st, v_lo, v_hi
      FROM (SELECT DISTINCT ON (u.seq) u.i, u.seq, u.att, u.st
              FROM unnest(p_epochs, p_seqs, p_atts, p_statuses)
                   WITH ORDINALITY AS u(ep, seq, att, st, i)
             WHERE u.ep = v_q.epoch AND u.seq IS NOT NULL AND u.att IS NOT NULL
             ORDER BY u.seq, u.i) AS x;
    IF v_i IS NOT NULL THEN
        -- the seq range keeps the primary key the access path whatever the statistics say
        WITH d AS (
            DELETE FROM queen.eph_leases l
             USING unnest(v_i, v_seq, v_att, v_st) AS p(i, seq, att, st)
             WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
               AND l.seq BETWEEN v_lo AND v_hi AND l.seq = p.seq AND l.attempts = p.att
               AND (p.st = 'completed' OR l.attempts > v_retry)
            RETURNING p.i, p.seq, p.st)
        SELECT coalesce(array_agg(d.i), '{}'), coalesce(array_agg(d.seq), '{}'),
               count(*) FILTER (WHERE d.st <> 'completed')
          INTO v_acked, v_settle, v_dropped
          FROM d;
        WITH r AS (
            UPDATE queen.eph_leases l SET lease_until = '-infinity'
              FROM unnest(v_i, v_seq, v_att, v_st) AS p(i, seq, att, st)
             WHERE l.tenant = p_tenant AND l.queue = p_queue AND l.grp = p_group
               AND l.seq BETWEEN v_lo AND v_hi AND l.seq = p.seq AND l.attempts = p.att
               AND p.st <> 'completed' AND l.attempts <= v_retry
            RETURNING p.i)
        SELECT coalesce(array_agg(r.i), '{}') INTO v_red FROM r;
    END IF;
    SELECT coalesce(array_agg(
               CASE WHEN a.i IS NOT NULL THEN 'acked'
                    WHEN d.i IS NOT NULL THEN 'redelivered'
                    WHEN u.ep IS NOT NULL AND u.ep IS DISTINCT FROM v_q.epoch THEN 'stale'
                    ELSE 'unknown' END ORDER BY u.i), '{}')
      INTO outcomes
      FROM unnest(p_epochs) WITH ORDINALITY AS u(ep, i)
      LEFT JOIN unnest(v_acked) AS a(i) ON a.i = u.i
      LEFT JOIN unnest(v_red) AS d(i) ON d.i = u.i;
    IF v_dropped > 0 THEN
        UPDATE queen.eph_queues SET drops_retry = drops_retry + v_dropped
         WHERE tenant = p_tenant AND queue = p_queue;
    END IF;
    PERFORM queen.eph_settle_v1(p_tenant, p_queue, v_settle);
    redelivered := cardinality(v_red);
END;
$$;

CREATE OR REPLACE FUNCTION queen.eph_reset_v1(p_tenant uuid, p_queue text)
RETURNS int8
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_q queen.eph_queues;
BEGIN
    SELECT * INTO v_q FROM queen.eph_queues
     WHERE tenant = p_tenant AND queue = p_queue FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    DELETE FROM queen.eph_messages WHERE tenant = p_tenant AND queue = p_queue;
    DELETE FROM queen.eph_leases WHERE tenant = p_tenant AND queue = p_queue;
    DELETE FROM queen.eph_cursors WHERE tenant = p_tenant AND queue = p_queue;
    DELETE FROM queen.eph_groups WHERE tenant = p_tenant AND queue = p_queue;
    DELETE FROM queen.eph_partitions WHERE tenant = p_tenant AND queue = p_queue;
    UPDATE queen.eph_queues
       SET depth = 0, bytes = 0, epoch = substr(replace(gen_random_uuid()::text, '-', ''), 1, 16)
     WHERE tenant = p_tenant AND queue = p_queue;
    RETURN v_q.depth;
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
    PERFORM 1 FROM queen.eph_queues WHERE tenant = p_tenant AND queue = p_queue FOR UPDATE;
    v_ring := FOUND;
    IF v_ring THEN
        DELETE FROM queen.eph_messages WHERE tenant = p_tenant AND queue = p_queue;
        DELETE FROM queen.eph_leases WHERE tenant = p_tenant AND queue = p_queue;
        DELETE FROM queen.eph_cursors WHERE tenant = p_tenant AND queue = p_queue;
        DELETE FROM queen.eph_groups WHERE tenant = p_tenant AND queue = p_queue;
        DELETE FROM queen.eph_partitions WHERE tenant = p_tenant AND queue = p_queue;
        DELETE FROM queen.eph_queues WHERE tenant = p_tenant AND queue = p_queue;
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
        'depth', coalesce(q.depth, 0),
        'bytes', coalesce(q.bytes, 0),
        'partitions', (SELECT count(*) FROM queen.eph_partitions p
                        WHERE p.tenant = p_tenant AND p.queue = p_queue),
        'groups', (SELECT count(*) FROM queen.eph_groups g
                    WHERE g.tenant = p_tenant AND g.queue = p_queue),
        'drops', jsonb_build_object('bounds', coalesce(q.drops_bounds, 0),
                                    'ttl', coalesce(q.drops_ttl, 0),
                                    'retry', coalesce(q.drops_retry, 0)),
        'options', queen.eph_options_v1(p_tenant, p_queue))
      FROM (SELECT 1) AS one
      LEFT JOIN queen.eph_queues q ON q.tenant = p_tenant AND q.queue = p_queue
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
    SELECT queen.eph_gauges_v1(p_tenant, p_queue) || jsonb_build_object(
        'pending', coalesce((SELECT q.depth FROM queen.eph_queues q
                              WHERE q.tenant = p_tenant AND q.queue = p_queue), 0),
        'partitionsPending', coalesce((
            SELECT jsonb_agg(jsonb_build_object('partition', x.partition, 'pending', x.n)
                             ORDER BY x.partition COLLATE "C")
              FROM (SELECT m.partition, count(*) AS n FROM queen.eph_messages m
                     WHERE m.tenant = p_tenant AND m.queue = p_queue
                     GROUP BY m.partition ORDER BY m.partition COLLATE "C" LIMIT p_limit) x),
            '[]'::jsonb),
        'consumerGroups', coalesce((
            SELECT jsonb_agg(jsonb_build_object(
                       'group', g.grp,
                       'pending', (SELECT count(*) FROM queen.eph_messages m
                                     LEFT JOIN queen.eph_cursors c
                                       ON c.tenant = m.tenant AND c.queue = m.queue
                                      AND c.grp = g.grp AND c.partition = m.partition
                                    WHERE m.tenant = p_tenant AND m.queue = p_queue
                                      AND m.seq > coalesce(c.pos, 0)),
                       'inFlight', (SELECT count(*) FROM queen.eph_leases l
                                     WHERE l.tenant = p_tenant AND l.queue = p_queue
                                       AND l.grp = g.grp))
                       ORDER BY g.grp COLLATE "C")
              FROM (SELECT g0.grp FROM queen.eph_groups g0
                     WHERE g0.tenant = p_tenant AND g0.queue = p_queue
                     ORDER BY g0.grp COLLATE "C" LIMIT p_limit) g),
            '[]'::jsonb))
     WHERE EXISTS (SELECT 1 FROM queen.eph_queues q WHERE q.tenant = p_tenant AND q.queue = p_queue)
        OR EXISTS (SELECT 1 FROM queen.eph_config c WHERE c.tenant = p_tenant AND c.queue = p_queue)
$$;
