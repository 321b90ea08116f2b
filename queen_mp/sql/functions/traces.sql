-- traces.sql: message traces (docs/api.md 2.13): named events a consumer records on a message,
-- and the three reads of them. Tables: schema/003_traces.sql.
--
-- Functions:
--   queen.trace_record_v1(uuid, int8, bytea, text, text, text, jsonb, text[]) -> jsonb
--       records one event on the message (tenant, partition id, transactionId):
--       {"recorded": true, "traceId", "offset"} or {"recorded": false} (no such message of the
--       tenant: nothing written)
--   queen.trace_message_v1(uuid, int8, text, int4) -> jsonb
--       {"traces": [trace...], "truncated"}: the message's traces in order, at most p_limit
--   queen.trace_by_name_v1(uuid, text, int4, int8) -> jsonb
--       {"traces": [trace + queue, partition...], "total"}: one page of the tenant's traces
--       carrying the name, in order
--   queen.trace_names_v1(uuid, int4, int8) -> jsonb
--       {"traceNames": [{"traceName", "traceCount", "messageCount", "lastSeen"}], "total"}:
--       one page of the tenant's names, most recently used first
--   A trace object: {"id", "transactionId", "partitionId" (decimal text), "consumerGroup",
--   "eventType", "data", "traceNames", "createdAt"}; order = seq (insertion order).
--
-- Which message a trace belongs to: the transactionId's xxh3_128 (p_hash, computed by the
--   broker) found in the partition's transactionId sidecar (queen.log_txns rows still backed by
--   segments), the identity acks and dedup use too (api.md 1.3). The newest occurrence's offset
--   is recorded: retention (functions/retention.sql) deletes the traces of the offsets it cuts.
--   A partition whose oldest retained segments are older than its sidecar (log_start_offset <
--   txns_start) may hold the message below the sidecar, where proving absence would mean
--   decoding segments: a hash the sidecar does not hold is then recorded at offset
--   txns_start - 1, the highest offset it can have, so the trace goes no later than its message
--   would. Anywhere else an unknown hash, partition, or another tenant's partition records
--   nothing ({"recorded": false}).
--
-- Tables touched: queen.queues (FOR KEY SHARE of the message's queue row), queen.log_partitions,
--   queen.log_txns (read, no lock); queen.message_traces, queen.message_trace_names (INSERT;
--   reads).
-- Lock order: trace_record_v1 key-share-locks the queue row first (what the insert's foreign
--   key would take anyway), so a queue delete running at the same time (queue_delete_v1: the
--   queue row FOR UPDATE first) either waits for the trace, or goes first and the trace finds
--   no such partition: never a foreign key error. No partition, consumer or kv row is locked.
-- SQLSTATEs raised: 22023 on a NULL partition id or a hash that is not 16 bytes.

CREATE OR REPLACE FUNCTION queen.trace_record_v1(
    p_tenant       uuid,
    p_partition_id int8,
    p_hash         bytea,
    p_txn          text,
    p_group        text,
    p_event        text,
    p_data         jsonb,
    p_names        text[]
)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_part  record;
    v_found int8;
    v_seq   int8;
    v_id    uuid := gen_random_uuid();
    v_names text[];
BEGIN
    IF p_partition_id IS NULL OR p_hash IS NULL OR octet_length(p_hash) <> 16 THEN
        RAISE EXCEPTION 'trace_record_v1: NULL partition id, or a hash that is not 16 bytes'
            USING ERRCODE = '22023';
    END IF;
    SELECT lp.queue_id, lp.log_start_offset AS log_start, lp.txns_start AS txns
      INTO v_part
      FROM queen.log_partitions lp
      JOIN queen.queues q ON q.id = lp.queue_id
     WHERE lp.id = p_partition_id AND q.tenant = p_tenant
       FOR KEY SHARE OF q;
    IF NOT FOUND THEN
        RETURN jsonb_build_object('recorded', false);
    END IF;

    -- the newest occurrence of the hash (messages.sql)
    v_found := queen.msg_txn_offset_v1(p_partition_id, p_hash, v_part.log_start, NULL);
    IF v_found IS NULL THEN
        IF v_part.log_start >= v_part.txns THEN
            RETURN jsonb_build_object('recorded', false);
        END IF;
        v_found := v_part.txns - 1;   -- below the sidecar: the highest offset it can have
    END IF;

    SELECT COALESCE(array_agg(DISTINCT n ORDER BY n), '{}') INTO v_names
      FROM unnest(COALESCE(p_names, '{}'::text[])) AS n;
    INSERT INTO queen.message_traces (id, tenant, queue_id, partition_id, "offset",
                                      transaction_id, consumer_group, event_type, data, names)
    VALUES (v_id, p_tenant, v_part.queue_id, p_partition_id, v_found, p_txn, p_group, p_event,
            p_data, v_names)
    RETURNING seq INTO v_seq;
    INSERT INTO queen.message_trace_names (trace_seq, name, tenant)
    SELECT v_seq, n, p_tenant FROM unnest(v_names) AS n;
    RETURN jsonb_build_object('recorded', true, 'traceId', v_id, 'offset', v_found);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- trace_json_v1: one trace row as the reads answer it.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.trace_json_v1(t queen.message_traces)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    RETURN jsonb_build_object(
        'id', t.id, 'transactionId', t.transaction_id, 'partitionId', t.partition_id::text,
        'consumerGroup', t.consumer_group, 'eventType', t.event_type, 'data', t.data,
        'traceNames', to_jsonb(t.names), 'createdAt', queen.iso_ms_v1(t.created_at));
END
$$;

CREATE OR REPLACE FUNCTION queen.trace_message_v1(
    p_tenant       uuid,
    p_partition_id int8,
    p_txn          text,
    p_limit        int4
)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_traces jsonb;
    v_count  int4;
BEGIN
    SELECT COALESCE(jsonb_agg(queen.trace_json_v1(p) ORDER BY p.seq), '[]'::jsonb), count(*)
      INTO v_traces, v_count
      FROM (SELECT t.*
              FROM queen.message_traces t
             WHERE t.partition_id = p_partition_id AND t.transaction_id = p_txn
               AND t.tenant = p_tenant
             ORDER BY t.seq
             LIMIT p_limit + 1) p;
    IF v_count > p_limit THEN
        v_traces := v_traces - p_limit;    -- the extra row only said there is more
    END IF;
    RETURN jsonb_build_object('traces', v_traces, 'truncated', v_count > p_limit);
END
$$;

CREATE OR REPLACE FUNCTION queen.trace_by_name_v1(
    p_tenant uuid,
    p_name   text,
    p_limit  int4,
    p_offset int8
)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_traces jsonb;
    v_total  int8;
BEGIN
    SELECT count(*) INTO v_total
      FROM queen.message_trace_names n
     WHERE n.tenant = p_tenant AND n.name = p_name;
    SELECT COALESCE(jsonb_agg(queen.trace_json_v1(t) || jsonb_build_object(
                                  'queue', q.name, 'partition', lp.name) ORDER BY t.seq),
                    '[]'::jsonb)
      INTO v_traces
      FROM (SELECT n.trace_seq
              FROM queen.message_trace_names n
             WHERE n.tenant = p_tenant AND n.name = p_name
             ORDER BY n.trace_seq
             LIMIT p_limit OFFSET p_offset) page
      JOIN queen.message_traces t ON t.seq = page.trace_seq
      JOIN queen.queues q ON q.id = t.queue_id
      LEFT JOIN queen.log_partitions lp ON lp.id = t.partition_id;
    RETURN jsonb_build_object('traces', v_traces, 'total', v_total);
END
$$;

CREATE OR REPLACE FUNCTION queen.trace_names_v1(p_tenant uuid, p_limit int4, p_offset int8)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_names jsonb;
    v_total int8;
BEGIN
    SELECT count(DISTINCT n.name) INTO v_total
      FROM queen.message_trace_names n
     WHERE n.tenant = p_tenant;
    SELECT COALESCE(jsonb_agg(jsonb_build_object(
                        'traceName', s.name, 'traceCount', s.traces, 'messageCount', s.messages,
                        'lastSeen', queen.iso_ms_v1(s.last_seen))
                    ORDER BY s.last_seen DESC, s.name), '[]'::jsonb)
      INTO v_names
      FROM (SELECT n.name, count(*) AS traces,
                   count(DISTINCT (t.partition_id, t.transaction_id)) AS messages,
                   max(t.created_at) AS last_seen
              FROM queen.message_trace_names n
              JOIN queen.message_traces t ON t.seq = n.trace_seq
             WHERE n.tenant = p_tenant
             GROUP BY n.name
             ORDER BY max(t.created_at) DESC, n.name
             LIMIT p_limit OFFSET p_offset) s;
    RETURN jsonb_build_object('traceNames', v_names, 'total', v_total);
END
$$;
