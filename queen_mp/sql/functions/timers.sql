-- timers.sql: durable timers (api.md 2.5 "Timer ops", 2.11, section 6 timer routes).
-- A timer pushes its payload into (queue, partition) at fire_at, with the transactionId and the
-- message id fixed at scheduling; at-least-once, deduplicated on the transactionId by the push
-- path. Python (queen_mp/models/timers.py) validates and normalises ops and mints the ids; the shard
-- firers (queen_mp/shards/timerfire.py) build the frames and push them.
--
-- Functions:
--   queen.timer_provision_v1(uuid, text[]) -> void
--       create missing queues (timer scheduling creates unknown queues, api.md 1.9).
--   queen.timer_apply_v1(uuid, jsonb) -> jsonb
--       apply normalised ops in order, in the caller's transaction; a JSON array of results.
--   queen.timer_get_v1(uuid, text, text) -> jsonb        one timer (peek), NULL if absent
--   queen.timer_list_v1(uuid, text, int4, int8) -> jsonb pending timers of a queue, paged
--   queen.timer_due_v2() -> boolean
--       the firer's idle probe (autocommit, no locks): is any pending timer due (and push
--       maintenance off)?
--   queen.timer_claim_due_v1(int4, int8, boolean) -> table
--       the firer's claim: lock the partitions of due timers, then claim the timers.
--   queen.timer_mark_fired_v1(int8[], text[]) -> int4    claimed timers -> fired
--   queen.timer_purge_v1(int4, int4) -> int4             forget fired/cancelled rows
--   queen.timer_retention_s() -> int4                    QUEEN_TIMER_FIRED_RETENTION_S as
--                                                        last published by timer_purge_v1
--
-- Tables touched:
--   queen.queues          INSERT (provisioning only); read (tenant, name -> id, encryption)
--   queen.timers          INSERT / UPDATE (apply, mark fired), DELETE (purge), read
--   queen.log_partitions  INSERT (claim: provisioning of the firing partitions), FOR NO KEY UPDATE
--   queen.system_settings read (maintenance_mode, timer_fired_retention_s); upsert of
--                         timer_fired_retention_s (purge)
--
-- Lock order (design.md invariant 4; schema/001_baseline.sql header): timer rows come AFTER every
--   other row lock: (1) provisioning inserts, (2) log_partitions rows ascending by id,
--   (3) log_consumers rows, (4) timer rows.
--   * timer_provision_v1 is provisioning: callers run it FIRST in their transaction (one
--     INSERT ... ORDER BY name ON CONFLICT DO NOTHING, speculative locks in key order).
--   * timer_apply_v1 locks timer rows only: first every existing row its ops name, in one
--     statement ordered by (queue_id, timer_key), then row by row in op order (new keys:
--     INSERT ... ON CONFLICT DO NOTHING, retried as an update if a concurrent insert won).
--   * The firer follows the same order although it starts from the timers:
--     timer_claim_due_v1 (a) peeks at due timers WITHOUT locking them, (b) provisions their
--     partitions (sorted insert), (c) locks those partition rows ascending by id, and only
--     then (d) claims the timers FOR UPDATE SKIP LOCKED. Its caller then pushes with
--     log_push_multi_v1 (provisioning skipped, partition rows already held) and marks the
--     timers fired. So a firer never holds a timer row while it waits for a partition row,
--     and a transaction that pushes and then schedules (log_transaction_wire_v1) cannot
--     deadlock with it. SKIP LOCKED keeps concurrent firers disjoint; firers whose peeks
--     overlap serialise on the partition rows and the later one finds the timers fired.
--
-- SQLSTATEs raised:
--   22023  invalid_parameter_value: p_ops not an array, an op without a known kind, a schedule
--          without delayMs / messageId / txn, a SCHEDULE on a queue that does not exist (not
--          provisioned); bad arguments of the list / claim / purge functions.
--   23503 (foreign_key_violation) may reach the firer when a queue is deleted under a claim
--          (nothing committed; the next round finds the timers gone with their queue).
--   40P01 / 55P03 / 40001 are not raised here but may reach callers through row locks.
--
-- Isolation: READ COMMITTED.
--
-- Normalised op (jsonb, queen_mp/models/timers.py after mint()):
--   {"op": "schedule" | "reschedule", "queue", "timerKey", "partition", "payload" (standard
--    base64 text of the stored bytes, "" = null message), "payloadZstd": bool, "delayMs": int
--    >= 0, "txn", "messageId" (uuid text)[, "producerSub" (broker-stamped, never the client's)]}
--   {"op": "cancel", "queue", "timerKey", "txn": text | null}
-- Result (one per op, in op order):
--   {"ok", "status", "queue", "timerKey", "txn", "messageId", "deliverAt"}
--   schedule   -> scheduled | rescheduled (it replaced a PENDING timer); always ok. A fired or
--                 cancelled row of the same key is replaced (status scheduled).
--   reschedule -> rescheduled (ok) | too_late (fired within the retention) | absent
--   cancel     -> cancelled (ok) | too_late | absent
--   txn / messageId / deliverAt: the new timer's for scheduled / rescheduled; the stored
--   timer's for cancelled and too_late; for absent the op's txn and nulls. A reschedule or
--   cancel naming a queue that does not exist answers absent (only schedule provisions).
--   deliverAt = fire_at as ISO-8601 UTC with milliseconds and Z; delayMs counts from the
--   database clock at apply time (now()).
-- The cancel op's txn is echoed only; it does not select among timers (a key has one timer).

-- ---------------------------------------------------------------------------------------------
-- helpers
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.timer_iso(p_t timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN to_char(p_t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"');

CREATE OR REPLACE FUNCTION queen.timer_retention_s() RETURNS int4
LANGUAGE sql STABLE PARALLEL SAFE
RETURN COALESCE((SELECT (s.value #>> '{}')::int4 FROM queen.system_settings s
                 WHERE s.key = 'timer_fired_retention_s'), 3600);

-- One stored timer as the peek / list routes show it (payload as standard base64).
CREATE OR REPLACE FUNCTION queen.timer_json(p_t queen.timers, p_queue text) RETURNS jsonb
LANGUAGE sql STABLE PARALLEL SAFE
RETURN jsonb_build_object(
    'queue', p_queue, 'timerKey', p_t.timer_key, 'partition', p_t.partition,
    'state', p_t.state, 'txn', p_t.transaction_id, 'messageId', p_t.message_id::text,
    'deliverAt', queen.timer_iso(p_t.fire_at),
    'payload', translate(encode(COALESCE(p_t.payload, '\x'::bytea), 'base64'), E'\n', ''),
    'payloadZstd', p_t.payload_zstd, 'attempts', p_t.attempts,
    'firedAt', queen.timer_iso(p_t.fired_at), 'createdAt', queen.timer_iso(p_t.created_at),
    'updatedAt', queen.timer_iso(p_t.updated_at));

-- ---------------------------------------------------------------------------------------------
-- timer_provision_v1: create the missing queues among p_queues (defaults of api.md 4).
-- Provisioning step of the lock order: run it first in the transaction.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.timer_provision_v1(p_tenant uuid, p_queues text[]) RETURNS void
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
BEGIN
    IF p_tenant IS NULL THEN
        RAISE EXCEPTION 'timer_provision_v1: NULL tenant' USING ERRCODE = '22023';
    END IF;
    IF COALESCE(cardinality(p_queues), 0) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO queen.queues (tenant, name)
    SELECT DISTINCT p_tenant, u.q COLLATE "C"
    FROM unnest(p_queues) AS u(q)
    WHERE u.q IS NOT NULL
      AND NOT EXISTS (SELECT 1 FROM queen.queues qu WHERE qu.tenant = p_tenant AND qu.name = u.q)
    ORDER BY 2
    ON CONFLICT (tenant, name) DO NOTHING;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- timer_apply_v1: the ops, in order, in the caller's transaction (see the header).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.timer_apply_v1(p_tenant uuid, p_ops jsonb) RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_ret    interval := make_interval(secs => queen.timer_retention_s());
    v_out    jsonb := '[]'::jsonb;
    v_op     jsonb;
    v_kind   text;
    v_queue  text;
    v_key    text;
    v_qid    int8;
    v_row    queen.timers%ROWTYPE;
    v_found  boolean;
    v_delay  int8;
    v_fire   timestamptz;
    v_txn    text;
    v_mid    uuid;
    v_status text;
    v_done   boolean;
BEGIN
    IF p_ops IS NULL OR jsonb_typeof(p_ops) <> 'array' THEN
        RAISE EXCEPTION 'timer_apply_v1: ops must be a JSON array' USING ERRCODE = '22023';
    END IF;

    -- 1. every existing row the ops name, in key order (lock order among timer rows)
    PERFORM 1
    FROM queen.timers t
    JOIN queen.queues q ON q.id = t.queue_id
    JOIN (SELECT DISTINCT e ->> 'queue' AS qn, e ->> 'timerKey' AS k
          FROM jsonb_array_elements(p_ops) AS e) o
      ON q.tenant = p_tenant AND q.name = o.qn AND t.timer_key = o.k
    ORDER BY t.queue_id, t.timer_key
    FOR UPDATE OF t;

    -- 2. the ops, in order
    FOR v_op IN SELECT a.e FROM jsonb_array_elements(p_ops) WITH ORDINALITY AS a(e, n)
                ORDER BY a.n
    LOOP
        v_kind := v_op ->> 'op';
        v_queue := v_op ->> 'queue';
        v_key := v_op ->> 'timerKey';
        IF v_kind IS NULL OR v_kind NOT IN ('schedule', 'reschedule', 'cancel')
           OR v_queue IS NULL OR v_key IS NULL THEN
            RAISE EXCEPTION 'timer_apply_v1: bad op %', v_op USING ERRCODE = '22023';
        END IF;

        SELECT q.id INTO v_qid FROM queen.queues q
        WHERE q.tenant = p_tenant AND q.name = v_queue;
        IF NOT FOUND THEN
            IF v_kind = 'schedule' THEN
                RAISE EXCEPTION 'timer_apply_v1: queue % does not exist (not provisioned)',
                    v_queue USING ERRCODE = '22023';
            END IF;
            v_out := v_out || jsonb_build_array(jsonb_build_object(
                'ok', false, 'status', 'absent', 'queue', v_queue, 'timerKey', v_key,
                'txn', v_op ->> 'txn', 'messageId', NULL, 'deliverAt', NULL));
            CONTINUE;
        END IF;

        IF v_kind = 'cancel' THEN
            SELECT * INTO v_row FROM queen.timers t
            WHERE t.queue_id = v_qid AND t.timer_key = v_key
            FOR UPDATE;
            v_found := FOUND;
            IF v_found AND v_row.state = 'pending' THEN
                UPDATE queen.timers t SET state = 'cancelled', updated_at = now()
                WHERE t.queue_id = v_qid AND t.timer_key = v_key;
                v_status := 'cancelled';
            ELSIF v_found AND v_row.state = 'fired' AND v_row.fired_at >= now() - v_ret THEN
                v_status := 'too_late';
            ELSE
                v_status := 'absent';
            END IF;
            IF v_status = 'absent' THEN
                v_out := v_out || jsonb_build_array(jsonb_build_object(
                    'ok', false, 'status', v_status, 'queue', v_queue, 'timerKey', v_key,
                    'txn', v_op ->> 'txn', 'messageId', NULL, 'deliverAt', NULL));
            ELSE
                v_out := v_out || jsonb_build_array(jsonb_build_object(
                    'ok', v_status = 'cancelled', 'status', v_status, 'queue', v_queue,
                    'timerKey', v_key, 'txn', v_row.transaction_id,
                    'messageId', v_row.message_id::text,
                    'deliverAt', queen.timer_iso(v_row.fire_at)));
            END IF;
            CONTINUE;
        END IF;

        -- schedule / reschedule
        v_delay := (v_op ->> 'delayMs')::int8;
        v_txn := v_op ->> 'txn';
        v_mid := (v_op ->> 'messageId')::uuid;
        IF v_delay IS NULL OR v_txn IS NULL OR v_txn = '' OR v_mid IS NULL THEN
            RAISE EXCEPTION 'timer_apply_v1: % op without delayMs, txn or messageId', v_kind
                USING ERRCODE = '22023';
        END IF;
        v_fire := now() + GREATEST(v_delay, 0) * interval '1 millisecond';

        v_done := false;
        WHILE NOT v_done LOOP
            SELECT * INTO v_row FROM queen.timers t
            WHERE t.queue_id = v_qid AND t.timer_key = v_key
            FOR UPDATE;
            v_found := FOUND;

            IF v_kind = 'reschedule' AND NOT (v_found AND v_row.state = 'pending') THEN
                IF v_found AND v_row.state = 'fired' AND v_row.fired_at >= now() - v_ret THEN
                    v_out := v_out || jsonb_build_array(jsonb_build_object(
                        'ok', false, 'status', 'too_late', 'queue', v_queue, 'timerKey', v_key,
                        'txn', v_row.transaction_id, 'messageId', v_row.message_id::text,
                        'deliverAt', queen.timer_iso(v_row.fire_at)));
                ELSE
                    v_out := v_out || jsonb_build_array(jsonb_build_object(
                        'ok', false, 'status', 'absent', 'queue', v_queue, 'timerKey', v_key,
                        'txn', v_txn, 'messageId', NULL, 'deliverAt', NULL));
                END IF;
                v_done := true;
                CONTINUE;
            END IF;

            IF v_found THEN
                UPDATE queen.timers t SET
                    fire_at = v_fire,
                    payload = decode(v_op ->> 'payload', 'base64'),
                    payload_zstd = COALESCE((v_op ->> 'payloadZstd')::boolean, false),
                    partition = COALESCE(NULLIF(v_op ->> 'partition', ''), 'Default'),
                    transaction_id = v_txn,
                    message_id = v_mid,
                    producer_sub = v_op ->> 'producerSub',
                    state = 'pending',
                    attempts = 0,
                    fired_at = NULL,
                    created_at = CASE WHEN t.state = 'pending' THEN t.created_at ELSE now() END,
                    updated_at = now()
                WHERE t.queue_id = v_qid AND t.timer_key = v_key;
                v_status := CASE WHEN v_kind = 'reschedule' OR v_row.state = 'pending'
                                 THEN 'rescheduled' ELSE 'scheduled' END;
                v_done := true;
            ELSE
                INSERT INTO queen.timers (tenant, queue_id, timer_key, fire_at, payload,
                                          payload_zstd, partition, transaction_id, message_id,
                                          producer_sub)
                VALUES (p_tenant, v_qid, v_key, v_fire, decode(v_op ->> 'payload', 'base64'),
                        COALESCE((v_op ->> 'payloadZstd')::boolean, false),
                        COALESCE(NULLIF(v_op ->> 'partition', ''), 'Default'), v_txn, v_mid,
                        v_op ->> 'producerSub')
                ON CONFLICT (queue_id, timer_key) DO NOTHING;
                -- a concurrent insert of the same key won: go again, as an update
                v_done := FOUND;
                v_status := 'scheduled';
            END IF;
            IF v_done THEN
                v_out := v_out || jsonb_build_array(jsonb_build_object(
                    'ok', true, 'status', v_status, 'queue', v_queue, 'timerKey', v_key,
                    'txn', v_txn, 'messageId', v_mid::text,
                    'deliverAt', queen.timer_iso(v_fire)));
            END IF;
        END LOOP;
    END LOOP;

    RETURN v_out;
END
$$;

COMMENT ON FUNCTION queen.timer_apply_v1(uuid, jsonb) IS
'Apply normalised timer ops (queen_mp/models/timers.py) in order; returns a JSON array of '
'{"ok","status","queue","timerKey","txn","messageId","deliverAt"}.';

-- ---------------------------------------------------------------------------------------------
-- timer_get_v1: one timer of any state, NULL when there is none (another tenant's, a fired or
-- cancelled one past the retention, an unknown queue).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.timer_get_v1(p_tenant uuid, p_queue text, p_key text) RETURNS jsonb
LANGUAGE sql STABLE
AS $$
    SELECT queen.timer_json(t, q.name)
    FROM queen.queues q
    JOIN queen.timers t ON t.queue_id = q.id
    WHERE q.tenant = p_tenant AND q.name = p_queue AND t.timer_key = p_key
      AND (t.state = 'pending'
           OR t.updated_at >= now() - make_interval(secs => queen.timer_retention_s()))
$$;

-- ---------------------------------------------------------------------------------------------
-- timer_list_v1: the PENDING timers of a queue in (fire_at, timer_key) order, one page, and
-- the total: {"total": n, "timers": [timer_json...]}. An unknown queue lists nothing.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.timer_list_v1(p_tenant uuid, p_queue text, p_limit int4, p_offset int8)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_qid   int8;
    v_total int8;
    v_page  jsonb;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_offset IS NULL OR p_offset < 0 THEN
        RAISE EXCEPTION 'timer_list_v1: limit must be >= 1 and offset >= 0'
            USING ERRCODE = '22023';
    END IF;
    SELECT q.id INTO v_qid FROM queen.queues q WHERE q.tenant = p_tenant AND q.name = p_queue;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('total', 0, 'timers', '[]'::jsonb);
    END IF;
    SELECT count(*) INTO v_total FROM queen.timers t
    WHERE t.queue_id = v_qid AND t.state = 'pending';
    SELECT COALESCE(jsonb_agg(queen.timer_json(p.tr, p_queue) ORDER BY p.fa, p.k),
                    '[]'::jsonb)
    INTO v_page
    FROM (SELECT t AS tr, t.fire_at AS fa, t.timer_key AS k FROM queen.timers t
          WHERE t.queue_id = v_qid AND t.state = 'pending'
          ORDER BY t.fire_at, t.timer_key
          LIMIT p_limit OFFSET p_offset) p;
    RETURN jsonb_build_object('total', v_total, 'timers', v_page);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- timer_due_v2: whether a round would find work; lets an idle firer skip the transaction.
-- plpgsql, so its plan is cached per session: v1 was an SQL function, whose body PostgreSQL
-- planned anew at each call, ten calls a second per shard: 230-250 us of its backend's CPU a
-- call, 45-65 us as plpgsql (`SELECT 1`: 21 us; 2,000 prepared calls on a private cluster).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.timer_due_v2() RETURNS boolean
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN EXISTS (SELECT 1 FROM queen.timers t
                   WHERE t.state = 'pending' AND t.fire_at <= now())
           AND NOT COALESCE((SELECT (s.value #>> '{}')::boolean FROM queen.system_settings s
                             WHERE s.key = 'maintenance_mode'), false);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- timer_claim_due_v1: the firer's claim (lock order in the header).
--   p_limit      most timers claimed (>= 1)
--   p_max_bytes  stop claiming once the stored payload bytes claimed reach this (at least one
--                timer is always claimed)
--   p_encrypted  false: leave timers of encrypted queues alone (a firer without the key)
-- Nothing while push maintenance is on. Rows come back in (fire_at, queue_id, timer_key)
-- order, locked until the caller's transaction ends; the caller pushes them and calls
-- timer_mark_fired_v1.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.timer_claim_due_v1(
    p_limit     int4,
    p_max_bytes int8 DEFAULT 16777216,
    p_encrypted boolean DEFAULT true
) RETURNS TABLE (
    tenant         uuid,
    queue_id       int8,
    queue          text,
    timer_key      text,
    partition      text,
    payload        bytea,
    payload_zstd   boolean,
    transaction_id text,
    message_id     uuid,
    producer_sub   text,
    encrypted      boolean,
    fire_at        timestamptz
)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
#variable_conflict use_column
DECLARE
    v_qids  int8[];
    v_parts text[];
    v_bytes int8 := 0;
    r       record;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RAISE EXCEPTION 'timer_claim_due_v1: limit must be >= 1' USING ERRCODE = '22023';
    END IF;
    IF COALESCE((SELECT (s.value #>> '{}')::boolean FROM queen.system_settings s
                 WHERE s.key = 'maintenance_mode'), false) THEN
        RETURN;
    END IF;

    -- (a) peek, no locks: the partitions of the first due timers
    SELECT array_agg(d.queue_id ORDER BY d.queue_id, d.partition),
           array_agg(d.partition ORDER BY d.queue_id, d.partition)
    INTO v_qids, v_parts
    FROM (SELECT DISTINCT due.queue_id, due.partition
          FROM (SELECT t.queue_id, t.partition
                FROM queen.timers t
                JOIN queen.queues q ON q.id = t.queue_id
                WHERE t.state = 'pending' AND t.fire_at <= now()
                  AND (p_encrypted OR NOT q.encryption_enabled)
                ORDER BY t.fire_at, t.queue_id, t.timer_key
                LIMIT p_limit) due) d;
    IF v_qids IS NULL THEN
        RETURN;
    END IF;

    -- (b) provisioning: the partitions that do not exist yet, in key order
    INSERT INTO queen.log_partitions (queue_id, name)
    SELECT d.dq, d.dp
    FROM unnest(v_qids, v_parts) AS d(dq, dp)
    WHERE NOT EXISTS (SELECT 1 FROM queen.log_partitions lp
                      WHERE lp.queue_id = d.dq AND lp.name = d.dp)
    ORDER BY d.dq, d.dp
    ON CONFLICT (queue_id, name) DO NOTHING;

    -- (c) the partition rows, ascending id
    PERFORM 1
    FROM queen.log_partitions lp
    JOIN unnest(v_qids, v_parts) AS d(dq, dp) ON lp.queue_id = d.dq AND lp.name = d.dp
    ORDER BY lp.id
    FOR NO KEY UPDATE OF lp;

    -- (d) the timers of those partitions, skipping rows another transaction holds
    FOR r IN
        SELECT q.tenant AS tn, t.queue_id AS qid, q.name AS qn, t.timer_key AS k,
               t.partition AS p, t.payload AS pl, t.payload_zstd AS z,
               t.transaction_id AS txn, t.message_id AS mid, t.producer_sub AS sub,
               q.encryption_enabled AS enc, t.fire_at AS fa
        FROM queen.timers t
        JOIN queen.queues q ON q.id = t.queue_id
        JOIN unnest(v_qids, v_parts) AS d(dq, dp) ON t.queue_id = d.dq AND t.partition = d.dp
        WHERE t.state = 'pending' AND t.fire_at <= now()
          AND (p_encrypted OR NOT q.encryption_enabled)
        ORDER BY t.fire_at, t.queue_id, t.timer_key
        LIMIT p_limit
        FOR UPDATE OF t SKIP LOCKED
    LOOP
        tenant := r.tn; queue_id := r.qid; queue := r.qn; timer_key := r.k;
        partition := r.p; payload := r.pl; payload_zstd := r.z; transaction_id := r.txn;
        message_id := r.mid; producer_sub := r.sub; encrypted := r.enc; fire_at := r.fa;
        RETURN NEXT;
        v_bytes := v_bytes + COALESCE(octet_length(r.pl), 0);
        EXIT WHEN v_bytes >= COALESCE(p_max_bytes, 16777216);
    END LOOP;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- timer_mark_fired_v1: the claimed (still pending) timers -> fired. Returns rows updated.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.timer_mark_fired_v1(p_queue_ids int8[], p_keys text[]) RETURNS int4
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_n int4;
BEGIN
    IF COALESCE(cardinality(p_queue_ids), 0) <> COALESCE(cardinality(p_keys), 0) THEN
        RAISE EXCEPTION 'timer_mark_fired_v1: misaligned arrays' USING ERRCODE = '22023';
    END IF;
    UPDATE queen.timers t SET
        state = 'fired', fired_at = now(), attempts = t.attempts + 1, updated_at = now()
    FROM unnest(p_queue_ids, p_keys) AS u(q, k)
    WHERE t.queue_id = u.q AND t.timer_key = u.k AND t.state = 'pending';
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- timer_purge_v1: publish the retention (timer_retention_s reads it) and delete up to p_batch
-- fired / cancelled rows older than it. Returns rows deleted (p_batch: call again).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.timer_purge_v1(p_retention_s int4, p_batch int4 DEFAULT 10000)
RETURNS int4
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_n int4;
BEGIN
    IF p_retention_s IS NULL OR p_retention_s < 0 OR p_batch IS NULL OR p_batch < 1 THEN
        RAISE EXCEPTION 'timer_purge_v1: retention must be >= 0 and batch >= 1'
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO queen.system_settings AS s (key, value)
    VALUES ('timer_fired_retention_s', to_jsonb(p_retention_s))
    ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, updated_at = now()
        WHERE s.value IS DISTINCT FROM EXCLUDED.value;

    DELETE FROM queen.timers t
    WHERE t.ctid = ANY (ARRAY(
        SELECT d.ctid FROM queen.timers d
        WHERE d.state <> 'pending'
          AND d.updated_at < now() - make_interval(secs => p_retention_s)
        LIMIT p_batch));
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
