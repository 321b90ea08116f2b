-- transaction.sql: POST /api/v1/transaction, one PostgreSQL transaction for a worker's step
-- (api.md 2.5; life-of-a-step.md "Transaction"; ack-internals.md "Acks inside a transaction").
--
-- Functions:
--   queen.log_transaction_wire_v1(uuid, text[], text[], int4[], bytea[], bytea[],
--                                 int8[], text[], uuid[], bytea[], text[], int4[], text[],
--                                 jsonb, uuid[], jsonb, jsonb, text[]) -> jsonb
--       pushes, acks, required leases, KV ops and timer ops, all or nothing.
--
-- Tables touched: through the procedures it calls, in this order:
--   queen.timer_provision_v1 (queues of timer ops, with the pushed queues: one sorted insert),
--   queen.log_push_multi_v1 (queues, log_partitions, log_segments, log_txns),
--   queen.log_ack_by_hash_v1 / queen.log_dlq_head_v1 (log_consumers, log_dlq),
--   queen.log_consumers (read: required leases), queen.kv_apply_v1 (kv),
--   queen.timer_apply_v1 (timers); queen.require_writable_v1 (system_settings).
--
-- Lock order (design.md invariant 4): provisioning (one sorted insert of every queue the
--   transaction names, then log_push_multi_v1's partitions), partition rows ascending by id
--   (log_push_multi_v1's pre-lock), consumer rows ascending by (partition_id, group) (one
--   log_ack_by_hash_v1 per (partition, group, lease), called in that order), then kv rows in
--   op order, then timer rows. NOTE(queen): a lease-less FIRST-touch ack (no consumer row yet)
--   takes FOR KEY SHARE on its partition row after the push pre-lock; that one case can meet a
--   push bundle in the other order, and PostgreSQL's deadlock detector then aborts one of them
--   (40P01: retried by the caller, nothing applied).
--
-- SQLSTATEs raised:
--   QM001  maintenance (from require_writable_v1): push maintenance is on, nothing attempted
--   22023  invalid_parameter_value: misaligned arrays
--   Rollbacks are NOT errors: the body runs in a subtransaction; a rejected ack (QT001), a
--   duplicate push (QT002) or a required KV precondition (QK001) rolls it back and the function
--   returns {"success": false, ...} (below). A DLQ hand-off whose payload snapshot the broker has
--   not supplied yet also rolls back, with reason "needs_snapshot" (the broker reads the poison
--   frame and calls again with it; see p_snapshots).
--
-- Inputs (arrays aligned per family):
--   pushes   p_push_queues, p_push_partitions, p_push_counts, p_push_hashes, p_push_blobs:
--            one SEGMENT per (queue, partition), as log_push_multi_v1 takes them
--   acks     p_ack_pids, p_ack_groups, p_ack_leases (NULL = lease-less), p_ack_hashes (16 B),
--            p_ack_statuses, p_ack_ops (the ack's position in the flat result list),
--            p_ack_errors (the nack's `error`, stored on a DLQ row): one element per ack op
--   p_snapshots  [{"pid", "off", "messageId", "transactionId", "traceId", "producerSub",
--                 "encrypted", "payload" (base64), "createdAt"}] poison frames read by the broker
--   p_required   lease ids that must each hold at least one live lease at commit
--   p_kv, p_timers  the normalised op arrays of queen_mp/models/kv.py and queen_mp/models/timers.py
--   p_timer_queues  queues named by timer ops (provisioned with the pushed ones)
--
-- Result:
--   {"success": true, "push": [per-segment log_push_multi_v1 results, input order],
--    "acks": [{"i": ack element, "leaseReleased": bool, "dlq": bool, "queue": text}],
--    "kv": [kv results], "timers": [timer results]}
--   {"success": false, "reason": "rejected_ack" | "duplicate" | "kv_precondition" |
--    "needs_snapshot", "error": text, "detail": jsonb}
--     detail: rejected_ack {"op": flat index, "error": lease_invalid | already_committed |
--             unresolvable | clamped | partition_not_found | lease_not_live};
--             duplicate {"segment": k, "frame": i};
--             kv_precondition: kv_apply_v1's detail (failedIndex within the kv ops, kvReason,
--             version, value); needs_snapshot {"pid", "off", "op"}

CREATE OR REPLACE FUNCTION queen.log_transaction_wire_v1(
    p_tenant           uuid,
    p_push_queues      text[],
    p_push_partitions  text[],
    p_push_counts      int4[],
    p_push_hashes      bytea[],
    p_push_blobs       bytea[],
    p_ack_pids         int8[],
    p_ack_groups       text[],
    p_ack_leases       uuid[],
    p_ack_hashes       bytea[],
    p_ack_statuses     text[],
    p_ack_ops          int4[],
    p_ack_errors       text[],
    p_snapshots        jsonb,
    p_required         uuid[],
    p_kv               jsonb,
    p_timers           jsonb,
    p_timer_queues     text[]
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    n_push    int4 := COALESCE(cardinality(p_push_queues), 0);
    n_ack     int4 := COALESCE(cardinality(p_ack_pids), 0);
    v_push    jsonb := '[]'::jsonb;
    v_acks    jsonb := '[]'::jsonb;
    v_kv      jsonb := '[]'::jsonb;
    v_timers  jsonb := '[]'::jsonb;
    v_res     jsonb;
    v_grp     record;
    v_snap    jsonb;
    v_filed   jsonb;
    v_bad     int4;
    v_err     text;
    v_lease   uuid;
    v_state   text;
    v_msg     text;
    v_detail  text;
BEGIN
    PERFORM queen.require_writable_v1();
    IF COALESCE(cardinality(p_push_partitions), 0) <> n_push
       OR COALESCE(cardinality(p_push_counts), 0) <> n_push
       OR COALESCE(cardinality(p_push_hashes), 0) <> n_push
       OR COALESCE(cardinality(p_push_blobs), 0) <> n_push
       OR COALESCE(cardinality(p_ack_groups), 0) <> n_ack
       OR COALESCE(cardinality(p_ack_leases), 0) <> n_ack
       OR COALESCE(cardinality(p_ack_hashes), 0) <> n_ack
       OR COALESCE(cardinality(p_ack_statuses), 0) <> n_ack
       OR COALESCE(cardinality(p_ack_ops), 0) <> n_ack
       OR COALESCE(cardinality(p_ack_errors), 0) <> n_ack THEN
        RAISE EXCEPTION 'log_transaction_wire_v1: misaligned input arrays' USING ERRCODE = '22023';
    END IF;

    BEGIN
        -- 1. provisioning: every queue the transaction names, one sorted insert
        IF n_push > 0 OR COALESCE(cardinality(p_timer_queues), 0) > 0 THEN
            PERFORM queen.timer_provision_v1(p_tenant, ARRAY(
                SELECT DISTINCT q FROM unnest(COALESCE(p_push_queues, '{}') ||
                                              COALESCE(p_timer_queues, '{}')) AS u(q)
                ORDER BY q));
        END IF;

        -- 2. pushes: one bundle, partition rows pre-locked ascending by id
        IF n_push > 0 THEN
            v_push := queen.log_push_multi_v1(
                p_push_queues, p_push_partitions, p_push_counts, p_push_hashes,
                array_fill(0::int8, ARRAY[n_push]), p_push_blobs,
                array_fill(p_tenant, ARRAY[n_push]));
            SELECT (e ->> 'i')::int4, e -> 'dups' -> 0 ->> 'i' INTO v_bad, v_err
            FROM jsonb_array_elements(v_push) AS e
            WHERE e ->> 's' = 'duplicate'
            ORDER BY (e ->> 'i')::int4
            LIMIT 1;
            IF v_bad IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'QT002',
                    MESSAGE = 'a pushed transactionId is already stored in its partition',
                    DETAIL = jsonb_build_object('segment', v_bad, 'frame', v_err::int4)::text;
            END IF;
        END IF;

        -- 3. required leases: each must hold a live lease (checked before the acks, which may
        --    release them as part of this very step); a lease's cursors are its log_leases
        --    row's, each a key probe (OFFSET 0 keeps it a probe, never a scan of the group)
        SELECT r.lease INTO v_lease
        FROM unnest(COALESCE(p_required, '{}')) AS r(lease)
        WHERE NOT EXISTS (SELECT 1
                          FROM queen.log_leases l
                          CROSS JOIN LATERAL unnest(l.partition_ids) AS lc(pid)
                          WHERE l.lease_id = r.lease AND l.tenant = p_tenant
                            AND EXISTS (SELECT 1 FROM queen.log_consumers c
                                        WHERE c.partition_id = lc.pid
                                          AND c.consumer_group = l.consumer_group
                                          AND c.lease_id = r.lease
                                          AND c.lease_expires_at > now()
                                        OFFSET 0))
        LIMIT 1;
        IF v_lease IS NOT NULL THEN
            RAISE EXCEPTION USING ERRCODE = 'QT001', MESSAGE = 'required lease not live',
                DETAIL = jsonb_build_object('op', NULL, 'error', 'lease_not_live',
                                            'leaseId', v_lease)::text;
        END IF;

        -- 4. acks: one authoritative call per (partition, group, lease), consumer row order
        FOR v_grp IN
            SELECT a.pid, a.grp, a.lease, array_agg(a.h ORDER BY a.n) AS hashes,
                   array_agg(a.st ORDER BY a.n) AS statuses, array_agg(a.n ORDER BY a.n) AS ns,
                   array_agg(a.op ORDER BY a.n) AS ops, array_agg(a.err ORDER BY a.n) AS errs
            FROM unnest(p_ack_pids, p_ack_groups, p_ack_leases, p_ack_hashes, p_ack_statuses,
                        p_ack_ops, p_ack_errors)
                     WITH ORDINALITY AS a(pid, grp, lease, h, st, op, err, n)
            GROUP BY a.pid, a.grp, a.lease
            ORDER BY a.pid, a.grp COLLATE "C", a.lease
        LOOP
            v_res := queen.log_ack_by_hash_v1(p_tenant, v_grp.pid, v_grp.grp, v_grp.lease,
                                              v_grp.hashes, v_grp.statuses);
            IF NOT (v_res ->> 'ok')::boolean THEN
                RAISE EXCEPTION USING ERRCODE = 'QT001', MESSAGE = 'ack rejected',
                    DETAIL = jsonb_build_object('op', v_grp.ops[1],
                                                'error', v_res ->> 'error')::text;
            END IF;
            -- any item that can no longer act (noop, stale, unresolved, invalid, clamped)
            SELECT x.k, x.why INTO v_bad, v_err
            FROM (SELECT (j.v)::int4 AS k, l.why
                  FROM (VALUES ('noop', 'already_committed'), ('stale', 'already_committed'),
                               ('unresolved', 'unresolvable'), ('invalid', 'lease_invalid'),
                               ('clamped', 'clamped')) AS l(key, why)
                  CROSS JOIN LATERAL jsonb_array_elements_text(v_res -> l.key) AS j(v)) x
            ORDER BY x.k
            LIMIT 1;
            IF v_bad IS NOT NULL THEN
                RAISE EXCEPTION USING ERRCODE = 'QT001', MESSAGE = 'ack rejected',
                    DETAIL = jsonb_build_object('op', v_grp.ops[v_bad + 1],
                                                'error', v_err)::text;
            END IF;
            IF (v_res ->> 'dlq')::boolean THEN
                v_snap := NULL;
                SELECT s.value INTO v_snap
                FROM jsonb_array_elements(COALESCE(p_snapshots, '[]')) AS s(value)
                WHERE (s.value ->> 'pid')::int8 = v_grp.pid
                  AND (s.value ->> 'off')::int8 = (v_res ->> 'poison')::int8
                LIMIT 1;
                IF v_snap IS NULL THEN
                    RAISE EXCEPTION USING ERRCODE = 'QT009', MESSAGE = 'needs snapshot',
                        DETAIL = jsonb_build_object(
                            'pid', v_grp.pid, 'off', (v_res ->> 'poison')::int8,
                            'op', v_grp.ops[(v_res ->> 'signalIndex')::int4 + 1])::text;
                END IF;
                v_filed := queen.log_dlq_head_v1(
                    p_tenant, v_grp.pid, v_grp.grp, v_grp.lease, (v_res ->> 'poison')::int8,
                    (v_snap ->> 'messageId')::uuid, v_snap ->> 'transactionId',
                    (v_snap ->> 'traceId')::uuid, v_snap ->> 'producerSub',
                    COALESCE((v_snap ->> 'encrypted')::boolean, false),
                    decode(v_snap ->> 'payload', 'base64'),
                    v_grp.errs[(v_res ->> 'signalIndex')::int4 + 1],
                    (v_snap ->> 'createdAt')::timestamptz);
                IF NOT (v_filed ->> 'ok')::boolean THEN
                    RAISE EXCEPTION USING ERRCODE = 'QT001', MESSAGE = 'ack rejected',
                        DETAIL = jsonb_build_object(
                            'op', v_grp.ops[(v_res ->> 'signalIndex')::int4 + 1],
                            'error', v_filed ->> 'error')::text;
                END IF;
                v_res := v_res || jsonb_build_object('leaseReleased',
                                                     (v_filed ->> 'leaseReleased')::boolean);
            END IF;
            v_acks := v_acks || (
                SELECT jsonb_agg(jsonb_build_object(
                    'i', n - 1, 'leaseReleased', (v_res ->> 'leaseReleased')::boolean,
                    'dlq', (v_res ->> 'dlq')::boolean
                           AND k - 1 = (v_res ->> 'signalIndex')::int4,
                    'queue', v_res ->> 'queue'))
                FROM unnest(v_grp.ns) WITH ORDINALITY AS u(n, k));
        END LOOP;

        -- 5. KV, then 6. timers
        IF p_kv IS NOT NULL AND jsonb_array_length(p_kv) > 0 THEN
            v_kv := queen.kv_apply_v1(p_tenant, p_kv);
        END IF;
        IF p_timers IS NOT NULL AND jsonb_array_length(p_timers) > 0 THEN
            v_timers := queen.timer_apply_v1(p_tenant, p_timers);
        END IF;
    EXCEPTION WHEN SQLSTATE 'QT001' OR SQLSTATE 'QT002' OR SQLSTATE 'QK001'
                   OR SQLSTATE 'QT009' THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT,
                                v_detail = PG_EXCEPTION_DETAIL;
        RETURN jsonb_build_object(
            'success', false,
            'reason', CASE v_state WHEN 'QT001' THEN 'rejected_ack'
                                   WHEN 'QT002' THEN 'duplicate'
                                   WHEN 'QK001' THEN 'kv_precondition'
                                   ELSE 'needs_snapshot' END,
            'error', v_msg,
            'detail', COALESCE(NULLIF(v_detail, '')::jsonb, '{}'::jsonb));
    END;

    RETURN jsonb_build_object('success', true, 'push', v_push, 'acks', v_acks, 'kv', v_kv,
                              'timers', v_timers);
END
$$;
