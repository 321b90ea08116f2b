-- streams.sql: the Streams SDK's routes (docs/api.md "Streams"; client-contract.md 1.11):
-- query registration, state reads, and the cycle that commits an operator step atomically.
--
-- Functions:
--   queen.stream_register_v1(uuid, text, text, text, text, boolean) -> jsonb
--       idempotent registration by (tenant, name), guarded by the config hash.
--   queen.stream_state_get_v1(uuid, uuid, int8, text[], text, numeric, int4) -> jsonb
--       state rows of one (query, partition) by keys, key prefix and ripeness.
--   queen.stream_cycle_v1(uuid, uuid, int8, text, jsonb, text[], text[], int4[], bytea[],
--                         bytea[], uuid, bytea, boolean, int4) -> jsonb
--       state ops + sink pushes + source ack, all or nothing, repeat-safe.
--
-- Tables touched: queen.stream_queries, queen.stream_state, queen.stream_cycles (schema 006);
--   queen.log_partitions, queen.queues, queen.log_consumers (read: tenant, source queue, lease);
--   through queen.log_transaction_wire_v1 (the sink pushes: provisioning, log_push_multi_v1,
--   push dedup, the maintenance guard) and queen.log_ack_at_v1 / queen.log_ack_by_hash_v1 (the
--   source ack) everything those touch.
--
-- Lock order (design.md invariant 4): stream_cycle_v1 first takes a transaction advisory lock
--   on (query, partition), which only cycles take, so every cycle of one state shard runs alone;
--   then the sink pushes (provisioning, partition rows ascending by id, inside
--   log_transaction_wire_v1), then the ONE consumer row of the source ack (log_ack_at_v1 or
--   log_ack_by_hash_v1), then stream_state rows and the stream_cycles row. The consumer row's
--   lease is read without a lock first (to find batch_end); the ack procedure re-checks it under
--   its lock.
--
-- SQLSTATEs raised: QM001 (push maintenance, from require_writable_v1: nothing attempted);
--   22023 (a state op of an unknown type; the broker validated them). Refusals are NOT errors:
--   the cycle body runs in a subtransaction, QS001 (a sink push is a duplicate) and QS002 (the
--   ack cannot act: lease lost, or the acked message already committed) roll it back and the
--   function returns {"success": false, ...}.
--
-- Repeat safety (the client retries a cycle whose answer it lost, e.g. 503 outcome_unknown):
--   * a cycle with an ack names the lease it acks under and the message it acks through; once
--     committed, its answer is kept in stream_cycles under (query, partition, lease, acked
--     message) for ten minutes, and a repeat gets that answer back with "repeat": true and changes
--     nothing. A pop mints a new lease and the cursor only moves forward, so two different
--     cycles never share that key (a partial ack and the rest of the batch ack different
--     messages).
--   * a cycle without an ack (the SDK's idle flush: the closed windows it read are deleted and
--     their results pushed) is guarded by its deletes: every deleted key must still exist. All
--     gone: the cycle already ran (or another flusher did it): "repeat": true, nothing applied.
--     Some gone: the state moved under it: refused "state_changed", nothing applied; the next
--     flush reads the state again. While a batch of the partition is leased to the cycle's
--     group, and for 2 s after a leased cycle of the shard committed, a cycle without an ack
--     is deferred ("deferred": true, nothing applied): the lease holder's cycle read that
--     state and will write it, or may just have written it after the flush read it.

-- ---------------------------------------------------------------------------------------------
-- stream_register_v1: register (tenant, name). Result:
--   {"ok": true, "queryId", "fresh": bool, "reset": bool}
--   {"ok": false, "queryId", "configHash": the registered hash}   (hash differs, no reset)
-- reset with a differing hash deletes the query's state and cycle ledger first.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.stream_register_v1(
    p_tenant uuid,
    p_name   text,
    p_source text,
    p_sink   text,
    p_hash   text,
    p_reset  boolean
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_id   uuid;
    v_hash text;
BEGIN
    INSERT INTO queen.stream_queries (id, tenant, name, source_queue, sink_queue, config_hash)
    VALUES (gen_random_uuid(), p_tenant, p_name, p_source, p_sink, p_hash)
    ON CONFLICT (tenant, name) DO NOTHING
    RETURNING id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN jsonb_build_object('ok', true, 'queryId', v_id, 'fresh', true, 'reset', false);
    END IF;

    SELECT q.id, q.config_hash INTO v_id, v_hash
    FROM queen.stream_queries q
    WHERE q.tenant = p_tenant AND q.name = p_name
    FOR UPDATE;

    IF v_hash = p_hash THEN
        UPDATE queen.stream_queries
        SET source_queue = p_source, sink_queue = p_sink, updated_at = now()
        WHERE id = v_id;
        RETURN jsonb_build_object('ok', true, 'queryId', v_id, 'fresh', false, 'reset', false);
    END IF;
    IF NOT p_reset THEN
        RETURN jsonb_build_object('ok', false, 'queryId', v_id, 'configHash', v_hash);
    END IF;
    DELETE FROM queen.stream_state WHERE query_id = v_id;
    DELETE FROM queen.stream_cycles WHERE query_id = v_id;
    UPDATE queen.stream_queries
    SET source_queue = p_source, sink_queue = p_sink, config_hash = p_hash, updated_at = now()
    WHERE id = v_id;
    RETURN jsonb_build_object('ok', true, 'queryId', v_id, 'fresh', false, 'reset', true);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- stream_state_get_v1: rows of (p_query_id, p_partition_id) in key order, filtered (AND) by
--   p_keys (empty = every key), p_prefix (NULL = none), p_ripe (NULL = none: else only rows whose
--   value has a numeric windowEnd <= p_ripe), at most p_limit rows. Result:
--   {"found": false}   (no such query for this tenant)
--   {"found": true, "rows": [{"key", "value", "updated_at"}], "truncated": bool}
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.stream_state_get_v1(
    p_tenant       uuid,
    p_query_id     uuid,
    p_partition_id int8,
    p_keys         text[],
    p_prefix       text,
    p_ripe         numeric,
    p_limit        int4
) RETURNS jsonb
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
DECLARE
    v_rows jsonb;
    v_n    int4;
BEGIN
    PERFORM 1 FROM queen.stream_queries q WHERE q.id = p_query_id AND q.tenant = p_tenant;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('found', false);
    END IF;
    SELECT COALESCE(jsonb_agg(jsonb_build_object(
               'key', s.key, 'value', s.value, 'updated_at', queen.iso_ms_v1(s.updated_at))
               ORDER BY s.key), '[]'::jsonb),
           count(*)
    INTO v_rows, v_n
    FROM (SELECT st.key, st.value, st.updated_at
          FROM queen.stream_state st
          WHERE st.query_id = p_query_id AND st.partition_id = p_partition_id
            AND (cardinality(p_keys) = 0 OR st.key = ANY (p_keys))
            AND (p_prefix IS NULL OR starts_with(st.key, p_prefix))
            AND (p_ripe IS NULL OR (jsonb_typeof(st.value -> 'windowEnd') = 'number'
                                    AND (st.value ->> 'windowEnd')::numeric <= p_ripe))
          ORDER BY st.key
          LIMIT p_limit + 1) s;
    IF v_n > p_limit THEN
        v_rows := v_rows - p_limit;  -- drop the probe row (the last one, in key order)
    END IF;
    RETURN jsonb_build_object('found', true, 'rows', v_rows, 'truncated', v_n > p_limit);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- stream_cycle_v1: one operator step of (p_query_id, p_partition_id), all or nothing.
--   p_group        the source consumer group
--   p_state_ops    [{"type": "upsert", "key", "value"} | {"type": "delete", "key"}], in order
--   p_push_*       the sink pushes: one SEGMENT per (queue, partition), as
--                  log_transaction_wire_v1 takes them
--   p_lease        the source lease the ack acts under; NULL = no ack (then p_ack_hash,
--                  p_release and p_count are ignored)
--   p_ack_hash     xxh3_128 of the acked message's transactionId (the last one processed)
--   p_release      true: the whole leased batch is done (cursor to batch_end, lease released);
--                  false: only up to the acked message, the lease is kept (a gate's partial ack)
--   p_count        messages acked, as the client counts them (informational)
-- Result:
--   {"success": true, "repeat": bool, "deferred"?: true, "stateOpsApplied": n,
--    "push": [log_push_multi_v1
--    segment results], "ack": null | {"count", "leaseReleased", "old", "new"},
--    "queue": the source queue, "sinkQueues": [names]}
--   {"success": false, "reason": "unknown_query" | "unknown_partition" | "lease_lost" |
--    "ack_rejected" | "duplicate" | "state_changed", "error": text}
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.stream_cycle_v1(
    p_tenant           uuid,
    p_query_id         uuid,
    p_partition_id     int8,
    p_group            text,
    p_state_ops        jsonb,
    p_push_queues      text[],
    p_push_partitions  text[],
    p_push_counts      int4[],
    p_push_hashes      bytea[],
    p_push_blobs       bytea[],
    p_lease            uuid,
    p_ack_hash         bytea,
    p_release          boolean,
    p_count            int4
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    n_push     int4 := COALESCE(cardinality(p_push_queues), 0);
    v_source   text;
    v_queue    text;
    v_prev     jsonb;
    v_deletes  int4;
    v_present  int4;
    v_wire     jsonb;
    v_push     jsonb := '[]'::jsonb;
    v_ack      jsonb := 'null'::jsonb;
    v_res      jsonb;
    v_end      int8;
    v_bad      text;
    v_op       jsonb;
    v_applied  int4 := 0;
    v_result   jsonb;
    v_state    text;
    v_msg      text;
BEGIN
    PERFORM queen.require_writable_v1();

    SELECT q.source_queue INTO v_source
    FROM queen.stream_queries q WHERE q.id = p_query_id AND q.tenant = p_tenant;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('success', false, 'reason', 'unknown_query',
                                  'error', 'no such query');
    END IF;
    SELECT q.name INTO v_queue
    FROM queen.log_partitions lp JOIN queen.queues q ON q.id = lp.queue_id
    WHERE lp.id = p_partition_id AND q.tenant = p_tenant;
    IF NOT FOUND OR v_queue <> v_source THEN
        RETURN jsonb_build_object('success', false, 'reason', 'unknown_partition',
                                  'error', format('partition %s is not a partition of the '
                                                  'query''s source queue %s', p_partition_id,
                                                  v_source));
    END IF;

    -- one cycle of a state shard at a time (cycles of other shards are not held up)
    PERFORM pg_advisory_xact_lock(hashtextextended(p_query_id::text || ':' || p_partition_id, 0));

    IF p_lease IS NOT NULL THEN
        SELECT c.result INTO v_prev
        FROM queen.stream_cycles c
        WHERE c.query_id = p_query_id AND c.partition_id = p_partition_id
          AND c.lease_id = p_lease AND c.ack_hash = p_ack_hash;
        IF FOUND THEN
            RETURN v_prev || jsonb_build_object('repeat', true);
        END IF;
    ELSE
        -- NOTE(streams): two runners of one query, one flushing a partition the other
        -- holds. While a batch of it is leased to the group, the holder's cycle has read the
        -- state and will write it: a flush now could emit a window that cycle emits again.
        -- Right after a leased cycle committed, the flush may have read the state before that
        -- cycle wrote it, and would delete the newer window while emitting the older one. So
        -- a flush applies only when no lease is live and the shard's last leased cycle is 2 s
        -- old (far longer than a flush's read-to-commit); else it is deferred: nothing
        -- applied, the rows stay for the next flush.
        PERFORM 1 FROM queen.log_consumers c
        WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group
          AND c.lease_id IS NOT NULL AND c.lease_expires_at > now();
        IF NOT FOUND THEN
            PERFORM 1 FROM queen.stream_cycles c
            WHERE c.query_id = p_query_id AND c.partition_id = p_partition_id
              AND c.committed_at > now() - interval '2 seconds';
        END IF;
        IF FOUND THEN
            RETURN jsonb_build_object('success', true, 'repeat', false, 'deferred', true,
                                      'stateOpsApplied', 0, 'push', '[]'::jsonb, 'ack', NULL,
                                      'queue', v_queue, 'sinkQueues', '[]'::jsonb);
        END IF;
        SELECT count(DISTINCT o ->> 'key'), count(DISTINCT s.key)
        INTO v_deletes, v_present
        FROM jsonb_array_elements(COALESCE(p_state_ops, '[]'::jsonb)) AS o
        LEFT JOIN queen.stream_state s
               ON s.query_id = p_query_id AND s.partition_id = p_partition_id
              AND s.key = o ->> 'key'
        WHERE o ->> 'type' = 'delete';
        IF v_deletes > 0 AND v_present = 0 THEN
            RETURN jsonb_build_object('success', true, 'repeat', true, 'stateOpsApplied', 0,
                                      'push', '[]'::jsonb, 'ack', NULL, 'queue', v_queue,
                                      'sinkQueues', '[]'::jsonb);
        END IF;
        IF v_present < v_deletes THEN
            RETURN jsonb_build_object('success', false, 'reason', 'state_changed',
                                      'error', format('%s of the %s deleted keys are gone: the '
                                                      'state changed since it was read',
                                                      v_deletes - v_present, v_deletes));
        END IF;
    END IF;

    BEGIN
        -- 1. sink pushes: provisioning, partition pre-lock, dedup (the transaction's own path)
        IF n_push > 0 THEN
            v_wire := queen.log_transaction_wire_v1(
                p_tenant, p_push_queues, p_push_partitions, p_push_counts, p_push_hashes,
                p_push_blobs, '{}'::int8[], '{}'::text[], '{}'::uuid[], '{}'::bytea[],
                '{}'::text[], '{}'::int4[], '{}'::text[], '[]'::jsonb, '{}'::uuid[],
                '[]'::jsonb, '[]'::jsonb, '{}'::text[]);
            IF NOT (v_wire ->> 'success')::boolean THEN
                RAISE EXCEPTION USING ERRCODE = 'QS001', MESSAGE = 'a sink push is a duplicate',
                    DETAIL = COALESCE(v_wire ->> 'detail', '{}');
            END IF;
            v_push := v_wire -> 'push';
        END IF;

        -- 2. the source ack, under the lease the batch was delivered with
        IF p_lease IS NOT NULL THEN
            SELECT c.batch_end INTO v_end
            FROM queen.log_consumers c
            WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group
              AND c.lease_id = p_lease AND c.lease_expires_at > now();
            IF NOT FOUND THEN
                RAISE EXCEPTION USING ERRCODE = 'QS002', MESSAGE = 'lease_lost';
            END IF;
            v_res := NULL;
            IF p_release THEN
                v_res := queen.log_ack_at_v1(p_tenant, p_partition_id, p_group, p_lease, v_end,
                                             p_count);
                IF NOT (v_res ->> 'ok')::boolean AND v_res ->> 'error' <> 'partly_committed' THEN
                    RAISE EXCEPTION USING ERRCODE = 'QS002', MESSAGE = v_res ->> 'error';
                END IF;
            END IF;
            IF v_res IS NULL OR NOT (v_res ->> 'ok')::boolean THEN
                v_res := queen.log_ack_by_hash_v1(p_tenant, p_partition_id, p_group, p_lease,
                                                  ARRAY[p_ack_hash], ARRAY['completed']);
                v_bad := CASE
                    WHEN NOT (v_res ->> 'ok')::boolean THEN v_res ->> 'error'
                    WHEN jsonb_array_length(v_res -> 'noop') > 0 THEN 'already_committed'
                    WHEN jsonb_array_length(v_res -> 'unresolved') > 0 THEN 'unresolvable'
                    WHEN jsonb_array_length(v_res -> 'invalid') > 0 THEN 'lease_invalid'
                    WHEN jsonb_array_length(v_res -> 'clamped') > 0 THEN 'clamped' END;
                IF v_bad IS NOT NULL THEN
                    RAISE EXCEPTION USING ERRCODE = 'QS002', MESSAGE = v_bad;
                END IF;
            END IF;
            v_ack := jsonb_build_object('count', p_count,
                                        'leaseReleased', (v_res ->> 'leaseReleased')::boolean,
                                        'old', (v_res ->> 'old')::int8,
                                        'new', (v_res ->> 'new')::int8);
        END IF;

        -- 3. state ops, in order
        FOR v_op IN SELECT o FROM jsonb_array_elements(COALESCE(p_state_ops, '[]'::jsonb)) AS o
        LOOP
            IF v_op ->> 'type' = 'upsert' THEN
                INSERT INTO queen.stream_state AS s (query_id, partition_id, key, value)
                VALUES (p_query_id, p_partition_id, v_op ->> 'key', v_op -> 'value')
                ON CONFLICT (query_id, partition_id, key)
                DO UPDATE SET value = EXCLUDED.value, updated_at = now();
            ELSIF v_op ->> 'type' = 'delete' THEN
                DELETE FROM queen.stream_state
                WHERE query_id = p_query_id AND partition_id = p_partition_id
                  AND key = v_op ->> 'key';
            ELSE
                RAISE EXCEPTION 'stream_cycle_v1: unknown state op type %', v_op ->> 'type'
                    USING ERRCODE = '22023';
            END IF;
            v_applied := v_applied + 1;
        END LOOP;

        v_result := jsonb_build_object(
            'success', true, 'repeat', false, 'stateOpsApplied', v_applied, 'push', v_push,
            'ack', v_ack, 'queue', v_queue,
            'sinkQueues', to_jsonb(ARRAY(SELECT DISTINCT q FROM unnest(p_push_queues) AS u(q))));

        -- 4. the ledger of leased cycles: a repeat answers from it
        IF p_lease IS NOT NULL THEN
            DELETE FROM queen.stream_cycles c
            WHERE c.query_id = p_query_id AND c.partition_id = p_partition_id
              AND c.committed_at < now() - interval '10 minutes';
            INSERT INTO queen.stream_cycles (query_id, partition_id, lease_id, ack_hash, result)
            VALUES (p_query_id, p_partition_id, p_lease, p_ack_hash, v_result);
        END IF;
    EXCEPTION WHEN SQLSTATE 'QS001' OR SQLSTATE 'QS002' THEN
        GET STACKED DIAGNOSTICS v_state = RETURNED_SQLSTATE, v_msg = MESSAGE_TEXT;
        RETURN jsonb_build_object(
            'success', false,
            'reason', CASE WHEN v_state = 'QS001' THEN 'duplicate'
                           WHEN v_msg IN ('lease_lost', 'lease_invalid') THEN 'lease_lost'
                           ELSE 'ack_rejected' END,
            'error', CASE WHEN v_state = 'QS001' THEN v_msg
                          WHEN v_msg IN ('lease_lost', 'lease_invalid') THEN
                              'the source lease is not live: the batch is no longer this '
                              'consumer''s (nothing applied)'
                          ELSE 'the source ack cannot act: ' || v_msg || ' (nothing applied)'
                     END);
    END;
    RETURN v_result;
END
$$;
