-- ack.sql: the ack path (ack-internals.md; api.md 2.3, 2.4 and 4).
--
-- Functions:
--   queen.log_ack_by_hash_v1(uuid, int8, text, uuid, bytea[], text[]) -> jsonb
--       THE authoritative ack procedure: transactionId hashes -> offsets -> one cursor decision
--       (signal, retry budget, DLQ hand-off, lease release, repeat safety).
--   queen.log_dlq_head_v1(uuid, int8, text, uuid, int8, uuid, text, uuid, text, boolean, bytea,
--                         text, timestamptz) -> jsonb
--       files the log_dlq row of the poison offset handed off by log_ack_by_hash_v1
--       ("dlq": true) and moves the cursor past it.
--   queen.log_ack_at_v1(uuid, int8, text, uuid, int8, int4) -> jsonb
--       positional full-batch `completed` ack (the ack registry fast path).
--   queen.log_ack_multi_v3(uuid, int8[], text[], uuid[], int8[], int4[]) -> int8[]
--       ack fusion: log_ack_at_v1's decision for N rows in one transaction.
--
-- Tables touched:
--   queen.queues          read (tenant check, retry_limit, dead_letter_queue,
--                         dlq_after_max_retries)
--   queen.log_partitions  read (tenant check, txns_start, last_offset, name); never locked,
--                         except the one FOR KEY SHARE of the first-touch insert below
--   queen.log_txns        read (hash resolution, primary key range of one partition)
--   queen.log_consumers   SELECT ... FOR UPDATE, UPDATE (cursor, lease, counters, and ready_at
--                         where the cursor moves: pop.sql's log_ready_at_v1); INSERT of a
--                         missing row by a lease-less log_ack_by_hash_v1 only
--   queen.log_dlq         read (idempotency probe), INSERT (log_dlq_head_v1 only)
--
-- Lock order (design.md invariant 4):
--   * log_ack_by_hash_v1, log_dlq_head_v1, log_ack_at_v1 lock exactly ONE log_consumers row
--     (FOR UPDATE OF the consumer row; partitions and queues are joined, never locked). No
--     log_partitions row lock is ever waited for by the ack path (log_ready_at_v1's FOR SHARE
--     is SKIP LOCKED), so an ack cannot form a cycle with the push serializer (which locks
--     partition rows only).
--   * NOTE(ack): one exception, first touch only: a lease-less log_ack_by_hash_v1 on a
--     (partition, group) that has no consumer row yet inserts it, after taking FOR KEY SHARE
--     on its queue row (a group's start, FOR UPDATE of that row, then inserts cursor rows
--     without ON CONFLICT: groups.sql) and on the partition row: that keeps the partition
--     from being deleted before the new row commits (cursor rows have no foreign key:
--     schema/007_cursors_cascade.sql), and taken BEFORE inserting, the order stays
--     queue -> partition -> consumer (the global order). Taken after the insert it would be
--     consumer -> partition, which can deadlock with a transaction-wire ack that holds the
--     partition row and inserts the same consumer row. Neither KEY SHARE waits for a push
--     (an allocator holds partition rows FOR NO KEY UPDATE and queue rows FOR KEY SHARE).
--   * log_ack_multi_v3 locks its consumer rows one by one in ascending
--     (partition_id, consumer_group COLLATE "C") order, the primary key order.
--   A caller that runs several of these in one transaction must call them in that same order,
--   after any partition row lock it takes.
--
-- SQLSTATEs raised (everything else is a verdict in the result, never an exception):
--   22023  invalid_parameter_value: misaligned input arrays; NULL group; NULL hash or a hash
--          that is not 16 bytes; a status other than completed | failed | retry | dlq
--          (the broker maps the alias `success` to `completed` before the call); NULL offset
--          (log_dlq_head_v1)
--   23502  not_null_violation: log_dlq_head_v1 with a NULL message id or transaction id
--   P0002  no_data_found: log_ack_multi_v3's locked cursor row was not found by its ctid (its
--          UPDATE ... INTO STRICT)
--
-- Transaction isolation: READ COMMITTED. Every statement after the consumer row lock sees what
-- committed before it (the pushes the acked positions came from, the previous ack).
--
-- Result shapes (jsonb):
--   log_ack_by_hash_v1: one object
--     {"ok": bool, "error": null | "lease_invalid" | "partition_not_found",
--      "old": int8|null, "new": int8|null, "acked": new - old,
--      "leaseReleased": bool, "dlq": bool, "poison": int8|null,
--      "signalIndex": int|null, "signal": null | "failed" | "retry" | "dlq",
--      "dropped": bool, "retryCount": int|null,
--      "noop": [int], "stale": [int], "unresolved": [int], "clamped": [int], "invalid": [int],
--      "queue": text|null (the partition's queue name, null for partition_not_found: the broker
--      wakes pops parked on it when the lease was released)}
--     All lists hold 0-based INPUT indexes, ascending. "ok": false (lease_invalid,
--     partition_not_found) means nothing changed; then the lists are empty, "old"/"new" are the
--     current cursor (null for partition_not_found, 0 for a group without a consumer row).
--     "dlq": true = the broker must now call log_dlq_head_v1 for offset "poison".
--     "invalid" (an addition to the lead's shape) is only ever non-empty on a repeat (below):
--     items of a released lease that resolve ABOVE the cursor; the broker answers them
--     `lease_invalid` per item (api.md 2.4 item table: a released lease is not live).
--   log_dlq_head_v1: {"ok": bool, "error": null | "partition_not_found" | "lease_invalid" |
--                     "already_committed" | "already_filed" | "beyond_batch",
--                     "dlqId": int8|null, "new": int8|null, "leaseReleased": bool}
--   log_ack_at_v1:   {"ok": bool, "error": null | "lease_invalid" | "partition_not_found" |
--                     "beyond_batch" | "partly_committed", "old": int8|null, "new": int8|null,
--                     "leaseReleased": bool}   (partly_committed: the cursor is already inside
--                     the leased batch; the broker falls back to log_ack_by_hash_v1)
--   log_ack_multi_v3 (int8[], not jsonb): 3 elements per row in INPUT order, row k at
--     3k+1 .. 3k+3 (1-based): code (0 = log_ack_at_v1's ok, lease released; 1 lease_invalid,
--     2 partition_not_found, 3 beyond_batch, 4 partly_committed), old, new (as log_ack_at_v1:
--     NULL for partition_not_found). Empty input returns {}.
--
-- Lease conventions (shared with the pop path):
--   live lease      lease_id IS NOT NULL AND lease_expires_at > now(); worker_id = lease_id::text
--   release         released_lease_id := lease_id; lease_id, worker_id := NULL;
--                   lease_expires_at := NULL, or now() when the release is FOR REDELIVERY (a
--                   leased `failed` with budget left; not `retry`, a hand-back): the pop
--                   claims the cursor again only lease_expires_at + the queue's retryDelay
--                   later (pop.sql), as it does after a lease expired; batch_start,
--                   batch_end, leased_at and attempt_count are kept
--   attempt_count   reset to 0 when a batch completes (cursor reaches batch_end), on DLQ filing
--                   and on a dropped poison
--   batch_retry_count  explicit `failed` acks of the head (committed_offset + 1). When a call
--                   advances the cursor the count restarts at 0 BEFORE it is charged.
--
-- The decision (log_ack_by_hash_v1), ack-internals "The authoritative decision procedure":
--   span      [GREATEST(committed + 1, txns_start), span_end]; span_end = batch_end under a
--             lease, last_offset for a lease-less ack
--   eff       per input item: the lowest occurrence of its hash inside the span
--   below     per input item: some occurrence at or below committed
--   signal    the lowest eff among failed / dlq / retry items, ties dlq > failed > retry, then
--             the lowest input index
--   cursor    new = GREATEST(old, max eff of `completed` items below the signal (all of them
--             without a signal)); unmentioned positions below it are completed implicitly
--   lists     noop       eff NULL, below, completed          (harmless duplicate commit)
--             stale      eff NULL, below, failed/retry/dlq   (already_committed)
--             unresolved eff NULL, not below                  (unresolvable, redelivers)
--             clamped    eff >= signal eff, except the signal item itself (redelivers)
--   branches  (leased = a live p_lease_id was supplied)
--     dlq                               advance, keep the lease, dlq: true, poison = signal eff
--     failed, count < retry_limit       advance, charge +1, release for redelivery
--     failed, count >= limit, DLQ on    as dlq (keep the lease, dlq: true)
--     failed, count >= limit, DLQ off   new = signal eff (poison dropped), count 0,
--                                       attempt_count 0, release, dropped: true
--     retry                             advance, release (at once: a hand-back), no charge
--     none, new >= batch_end            advance, release, attempt_count 0, count 0
--     none, partial                     advance, keep the lease
--   lease-less (p_lease_id NULL): same decision over the span up to last_offset, but lease
--     columns are never touched, except that a call leaving the cursor at or past batch_end of
--     a live lease releases that lease (the batch is done: attempt_count and count reset, a
--     charge of this very call excepted).
--   repeat    p_lease_id not live but = released_lease_id: the call changes nothing. Items with
--             an occurrence at or below the cursor are in "noop" whatever their status; items
--             resolving only above it are "invalid"; items with no occurrence "unresolved".
--             Any other non-live p_lease_id (unknown, foreign, expired) -> lease_invalid.

-- ---------------------------------------------------------------------------------------------
-- log_ack_by_hash_v1: the authoritative ack.
--   p_tenant        the caller's tenant; a partition of another tenant is partition_not_found
--   p_partition_id  partition id
--   p_group         consumer group (`__QUEUE_MODE__` for queue mode)
--   p_lease_id      the lease the items were delivered under; NULL = lease-less ack
--   p_hashes        xxh3_128(transactionId), 16 bytes big-endian, one per item
--   p_statuses      'completed' | 'failed' | 'retry' | 'dlq', aligned with p_hashes
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_ack_by_hash_v1(
    p_tenant       uuid,
    p_partition_id int8,
    p_group        text,
    p_lease_id     uuid,
    p_hashes       bytea[],
    p_statuses     text[]
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    n              int4 := COALESCE(cardinality(p_hashes), 0);
    v_res          jsonb;
    v_found        boolean;
    -- the consumer row (locked) and its partition / queue (read)
    v_old          int8;
    v_lease        uuid;
    v_expires      timestamptz;
    v_released     uuid;
    v_batch_end    int8;
    v_attempts     int4;
    v_count0       int4;
    v_txns_start   int8;
    v_last         int8;
    v_retry_limit  int4;
    v_dlq_on       boolean;
    v_qname        text;
    -- decision
    v_live         boolean;
    v_repeat       boolean := false;
    v_span_end     int8;
    v_lo           int8;
    v_sig_i        int4;
    v_sig_s        text;
    v_sig_eff      int8;
    v_cand         int8;
    v_noop         int4[];
    v_stale        int4[];
    v_unres        int4[];
    v_clamped      int4[];
    v_invalid      int4[];
    v_new          int8;
    v_count        int4;
    v_release      boolean := false;
    v_reset_att    boolean := false;
    v_dlq          boolean := false;
    v_poison       int8;
    v_dropped      boolean := false;
    v_redeliver    boolean := false;  -- a leased release for redelivery (retryDelay applies)
BEGIN
    -- 1. Input guards: a misaligned call would apply statuses to the wrong items.
    IF COALESCE(cardinality(p_statuses), 0) <> n THEN
        RAISE EXCEPTION 'log_ack_by_hash_v1: misaligned arrays (% hashes, % statuses)',
            n, COALESCE(cardinality(p_statuses), 0)
            USING ERRCODE = '22023';
    END IF;
    IF p_group IS NULL THEN
        RAISE EXCEPTION 'log_ack_by_hash_v1: NULL consumer group' USING ERRCODE = '22023';
    END IF;
    IF n > 0 THEN
        IF EXISTS (SELECT 1 FROM unnest(p_hashes) AS u(h)
                   WHERE u.h IS NULL OR octet_length(u.h) <> 16) THEN
            RAISE EXCEPTION 'log_ack_by_hash_v1: every hash must be 16 bytes (xxh3_128)'
                USING ERRCODE = '22023';
        END IF;
        IF EXISTS (SELECT 1 FROM unnest(p_statuses) AS u(s)
                   WHERE u.s IS NULL OR u.s NOT IN ('completed', 'failed', 'retry', 'dlq')) THEN
            RAISE EXCEPTION 'log_ack_by_hash_v1: status must be completed, failed, retry or dlq'
                USING ERRCODE = '22023';
        END IF;
    END IF;

    v_res := jsonb_build_object(
        'ok', true, 'error', NULL, 'old', NULL, 'new', NULL, 'acked', 0,
        'leaseReleased', false, 'dlq', false, 'poison', NULL,
        'signalIndex', NULL, 'signal', NULL, 'dropped', false, 'retryCount', NULL,
        'noop', '[]'::jsonb, 'stale', '[]'::jsonb, 'unresolved', '[]'::jsonb,
        'clamped', '[]'::jsonb, 'invalid', '[]'::jsonb, 'queue', NULL);

    -- 2. The consumer row, locked, with its partition and queue read in the same statement
    --    (tenant check included). PERF: one statement on the common path (the row exists).
    SELECT c.committed_offset, c.lease_id, c.lease_expires_at, c.released_lease_id,
           c.batch_end, c.attempt_count, c.batch_retry_count,
           lp.txns_start, lp.last_offset, q.retry_limit,
           (q.dead_letter_queue OR q.dlq_after_max_retries), q.name
    INTO v_old, v_lease, v_expires, v_released, v_batch_end, v_attempts, v_count0,
         v_txns_start, v_last, v_retry_limit, v_dlq_on, v_qname
    FROM queen.log_consumers c
    JOIN queen.log_partitions lp ON lp.id = c.partition_id
    JOIN queen.queues q ON q.id = lp.queue_id
    WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group
      AND q.tenant = p_tenant
    FOR UPDATE OF c;
    v_found := FOUND;

    IF NOT v_found THEN
        -- Either the partition is not ours, or the group has no consumer row yet.
        PERFORM 1
        FROM queen.log_partitions lp
        JOIN queen.queues q ON q.id = lp.queue_id
        WHERE lp.id = p_partition_id AND q.tenant = p_tenant;
        IF NOT FOUND THEN
            RETURN v_res || jsonb_build_object('ok', false, 'error', 'partition_not_found');
        END IF;
        IF p_lease_id IS NOT NULL THEN
            -- no row, no lease: nothing was ever leased to this group here
            RETURN v_res || jsonb_build_object('ok', false, 'error', 'lease_invalid',
                                               'old', 0, 'new', 0, 'retryCount', 0);
        END IF;
        -- Lease-less first touch: create the row (cursor 0), then lock it. See the header for
        -- why the queue row's and the partition row's FOR KEY SHARE are taken first.
        PERFORM 1 FROM queen.queues q
        WHERE q.id = (SELECT lp.queue_id FROM queen.log_partitions lp
                      WHERE lp.id = p_partition_id)
        FOR KEY SHARE;
        PERFORM 1 FROM queen.log_partitions lp WHERE lp.id = p_partition_id FOR KEY SHARE;
        INSERT INTO queen.log_consumers (partition_id, consumer_group, committed_offset,
                                         queue_id, ready_at)
        SELECT p_partition_id, p_group, 0, lp.queue_id,
               queen.log_ready_at_v1(p_partition_id, 0, NULL, NULL)
        FROM queen.log_partitions lp WHERE lp.id = p_partition_id
        ON CONFLICT (partition_id, consumer_group) DO NOTHING;

        SELECT c.committed_offset, c.lease_id, c.lease_expires_at, c.released_lease_id,
               c.batch_end, c.attempt_count, c.batch_retry_count,
               lp.txns_start, lp.last_offset, q.retry_limit,
               (q.dead_letter_queue OR q.dlq_after_max_retries), q.name
        INTO v_old, v_lease, v_expires, v_released, v_batch_end, v_attempts, v_count0,
             v_txns_start, v_last, v_retry_limit, v_dlq_on, v_qname
        FROM queen.log_consumers c
        JOIN queen.log_partitions lp ON lp.id = c.partition_id
        JOIN queen.queues q ON q.id = lp.queue_id
        WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group
          AND q.tenant = p_tenant
        FOR UPDATE OF c;
        IF NOT FOUND THEN
            -- the partition was deleted between the two statements
            RETURN v_res || jsonb_build_object('ok', false, 'error', 'partition_not_found');
        END IF;
    END IF;

    v_res := v_res || jsonb_build_object('old', v_old, 'new', v_old, 'retryCount', v_count0,
                                         'queue', v_qname);

    -- 3. Lease validation, only when a lease id was supplied.
    v_live := v_lease IS NOT NULL AND v_expires > now();
    IF p_lease_id IS NOT NULL THEN
        IF v_live AND v_lease = p_lease_id THEN
            v_span_end := GREATEST(v_old, COALESCE(v_batch_end, v_old));
        ELSIF v_released IS NOT DISTINCT FROM p_lease_id THEN
            -- repeat of an ack that already released this lease: resolve, change nothing
            v_repeat := true;
            v_span_end := GREATEST(v_old, v_last);
        ELSE
            RETURN v_res || jsonb_build_object('ok', false, 'error', 'lease_invalid');
        END IF;
    ELSE
        v_span_end := GREATEST(v_old, v_last);
    END IF;
    v_lo := GREATEST(v_old + 1, v_txns_start);

    IF n = 0 THEN
        v_sig_i := NULL;  -- nothing to resolve; the branch logic below still runs
    ELSE
        -- 4. Resolution: one join, materialised once; every decision is an aggregate of it.
        --    * `input`: the items unnested once with their 0-based index;
        --    * `occ`: the (offset, hash) occurrences of the input hashes in log_txns rows with
        --      base_offset <= span_end (the lease bound: a row above the batch can resolve
        --      neither into the span nor below the cursor), offsets capped at span_end.
        --      PERF: `|| '\x'` behind OFFSET 0 detoasts each stored blob once per row, and
        --      `IN (...) IS TRUE` keeps the hash filter a hashed SubPlan over the input
        --      (as in log_push_one_v1), so only matches are joined back to their items;
        --    * `resolved`: per item, eff (lowest in-span occurrence) and below.
        WITH input AS MATERIALIZED (
            SELECT (u.o - 1)::int4 AS i, u.h, u.s
            FROM unnest(p_hashes, p_statuses) WITH ORDINALITY AS u(h, s, o)
        ),
        occ AS MATERIALIZED (
            SELECT s.off, s.h
            FROM (
                SELECT r.base_offset + j AS off, substr(r.hashes, j * 16 + 1, 16) AS h
                FROM (
                    SELECT t.base_offset, t.msg_count, t.hashes || '\x'::bytea AS hashes
                    FROM queen.log_txns t
                    WHERE t.partition_id = p_partition_id
                      AND t.base_offset <= v_span_end
                    OFFSET 0
                ) r
                CROSS JOIN LATERAL generate_series(
                    0, LEAST(r.msg_count - 1, v_span_end - r.base_offset)::int4) AS j
                OFFSET 0
            ) s
            WHERE (s.h IN (SELECT input.h FROM input)) IS TRUE
        ),
        resolved AS MATERIALIZED (
            SELECT inp.i, inp.s,
                   min(o.off) FILTER (WHERE o.off >= v_lo) AS eff,
                   COALESCE(bool_or(o.off <= v_old), false) AS below
            FROM input inp
            LEFT JOIN occ o ON o.h = inp.h
            GROUP BY inp.i, inp.s
        ),
        sig AS (
            SELECT r.i, r.s, r.eff
            FROM resolved r
            WHERE NOT v_repeat AND r.s <> 'completed' AND r.eff IS NOT NULL
            ORDER BY r.eff, CASE r.s WHEN 'dlq' THEN 0 WHEN 'failed' THEN 1 ELSE 2 END, r.i
            LIMIT 1
        )
        SELECT sg.i, sg.s, sg.eff,
               (SELECT max(r.eff) FROM resolved r
                WHERE NOT v_repeat AND r.s = 'completed' AND r.eff IS NOT NULL
                  AND (sg.eff IS NULL OR r.eff < sg.eff)),
               COALESCE((SELECT array_agg(r.i ORDER BY r.i) FROM resolved r
                         WHERE CASE WHEN v_repeat THEN r.below
                                    ELSE r.eff IS NULL AND r.below AND r.s = 'completed' END),
                        '{}'),
               COALESCE((SELECT array_agg(r.i ORDER BY r.i) FROM resolved r
                         WHERE NOT v_repeat AND r.eff IS NULL AND r.below
                           AND r.s <> 'completed'), '{}'),
               COALESCE((SELECT array_agg(r.i ORDER BY r.i) FROM resolved r
                         WHERE r.eff IS NULL AND NOT r.below), '{}'),
               COALESCE((SELECT array_agg(r.i ORDER BY r.i) FROM resolved r
                         WHERE sg.eff IS NOT NULL AND r.eff >= sg.eff AND r.i <> sg.i), '{}'),
               COALESCE((SELECT array_agg(r.i ORDER BY r.i) FROM resolved r
                         WHERE v_repeat AND NOT r.below AND r.eff IS NOT NULL), '{}')
        INTO v_sig_i, v_sig_s, v_sig_eff, v_cand, v_noop, v_stale, v_unres, v_clamped,
             v_invalid
        FROM (SELECT 1) AS one
        LEFT JOIN sig sg ON true;

        v_res := v_res || jsonb_build_object(
            'noop', to_jsonb(v_noop), 'stale', to_jsonb(v_stale),
            'unresolved', to_jsonb(v_unres), 'clamped', to_jsonb(v_clamped),
            'invalid', to_jsonb(v_invalid));
    END IF;

    IF v_repeat THEN
        -- NOTE(ack): a repeat never writes: no second charge, no second DLQ hand-off.
        RETURN v_res;
    END IF;

    -- 5. The cursor (never backwards) and the head's retry count.
    v_new := GREATEST(v_old, COALESCE(v_cand, v_old));
    v_count := CASE WHEN v_new > v_old THEN 0 ELSE v_count0 END;

    -- 6. The branch table. v_release here means "a leased call releases its lease".
    IF v_sig_s = 'dlq' THEN
        v_dlq := true;
        v_poison := v_sig_eff;
    ELSIF v_sig_s = 'failed' THEN
        IF v_count < v_retry_limit THEN
            v_count := v_count + 1;
            v_release := true;
            v_redeliver := true;
        ELSIF v_dlq_on THEN
            v_dlq := true;
            v_poison := v_sig_eff;
        ELSE
            v_dropped := true;
            v_poison := v_sig_eff;
            v_new := GREATEST(v_new, v_sig_eff);
            v_count := 0;
            v_reset_att := true;
            v_release := true;
        END IF;
    ELSIF v_sig_s = 'retry' THEN
        -- NOTE(ack): a hand-back, not a failure (the clients release what they will not
        -- process with it): no retryDelay, as no budget is charged
        v_release := true;
    ELSIF p_lease_id IS NOT NULL AND v_new >= v_span_end THEN
        -- no signal, leased batch complete
        v_release := true;
        v_reset_att := true;
        v_count := 0;
    END IF;

    IF p_lease_id IS NULL THEN
        -- Lease-less: only a live lease whose batch this call completed is released.
        v_release := v_live AND v_batch_end IS NOT NULL AND v_new >= v_batch_end;
        v_redeliver := false;
        IF v_release THEN
            v_reset_att := true;
            -- keep only this call's own charge (failed with budget left)
            IF v_sig_s IS DISTINCT FROM 'failed' OR v_dlq OR v_dropped THEN
                v_count := 0;
            END IF;
        END IF;
    END IF;

    -- 7. One write, only if something changes (a no-op ack leaves the row untouched).
    IF v_new > v_old OR v_count <> v_count0 OR v_release
       OR (v_reset_att AND v_attempts <> 0) THEN
        UPDATE queen.log_consumers c SET
            committed_offset  = v_new,
            ready_at          = CASE WHEN v_new > v_old
                                     THEN queen.log_ready_at_v1(c.partition_id, v_new,
                                                                c.next_offset, c.next_created_at)
                                     ELSE c.ready_at END,
            batch_retry_count = v_count,
            attempt_count     = CASE WHEN v_reset_att THEN 0 ELSE c.attempt_count END,
            total_consumed    = c.total_consumed + (v_new - v_old),
            last_consumed_at  = CASE WHEN v_new > v_old THEN now() ELSE c.last_consumed_at END,
            released_lease_id = CASE WHEN v_release THEN c.lease_id ELSE c.released_lease_id END,
            lease_id          = CASE WHEN v_release THEN NULL ELSE c.lease_id END,
            worker_id         = CASE WHEN v_release THEN NULL ELSE c.worker_id END,
            -- NOTE(ack): the release time of a redelivery is what the pop's retryDelay
            -- counts from (pop.sql); no live-lease test reads lease_expires_at without lease_id
            lease_expires_at  = CASE WHEN v_redeliver THEN now()
                                     WHEN v_release THEN NULL ELSE c.lease_expires_at END
        WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group;
    END IF;

    RETURN v_res || jsonb_build_object(
        'new', v_new, 'acked', v_new - v_old, 'leaseReleased', v_release,
        'dlq', v_dlq, 'poison', v_poison, 'signalIndex', v_sig_i, 'signal', v_sig_s,
        'dropped', v_dropped, 'retryCount', v_count);
END
$$;

COMMENT ON FUNCTION queen.log_ack_by_hash_v1(uuid, int8, text, uuid, bytea[], text[]) IS
'The authoritative ack: resolves xxh3_128 hashes to offsets and applies the signal / retry / '
'DLQ / lease rules. Returns {"ok","error","old","new","acked","leaseReleased","dlq","poison",'
'"signalIndex","signal","dropped","retryCount","noop","stale","unresolved","clamped","invalid"}.';

-- ---------------------------------------------------------------------------------------------
-- log_dlq_head_v1: file the DLQ row of a poison offset handed off by log_ack_by_hash_v1.
--   p_lease_id NOT NULL: must be the live lease; p_offset must lie in (committed, batch_end].
--   p_lease_id NULL:     p_offset must lie in (committed, last_offset]. NOTE(ack): the lead's
--                        brief asked for committed = p_offset - 1; that would refuse the hand-off
--                        of a lease-less [dlq @3] ack whose cursor stayed at 0 (nothing
--                        completed below the signal), a livelock, while the leased path files
--                        it. Both paths now behave alike: the cursor moves past the poison.
--   Either way a DLQ row already filed for (partition, group, offset) refuses the call, so
--   the call is idempotent: the second one returns ok:false and changes nothing.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_dlq_head_v1(
    p_tenant             uuid,
    p_partition_id       int8,
    p_group              text,
    p_lease_id           uuid,
    p_offset             int8,
    p_message_id         uuid,
    p_transaction_id     text,
    p_trace_id           uuid,
    p_producer_sub       text,
    p_encrypted          boolean,
    p_payload            bytea,
    p_error              text,
    p_message_created_at timestamptz
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_old        int8;
    v_lease      uuid;
    v_expires    timestamptz;
    v_batch_end  int8;
    v_count      int4;
    v_last       int8;
    v_queue_id   int8;
    v_qtenant    uuid;
    v_pname      text;
    v_live       boolean;
    v_span_end   int8;
    v_release    boolean;
    v_new        int8;
    v_id         int8;
BEGIN
    IF p_group IS NULL OR p_offset IS NULL THEN
        RAISE EXCEPTION 'log_dlq_head_v1: NULL consumer group or offset' USING ERRCODE = '22023';
    END IF;

    SELECT c.committed_offset, c.lease_id, c.lease_expires_at, c.batch_end,
           c.batch_retry_count, lp.last_offset, lp.queue_id, q.tenant, lp.name
    INTO v_old, v_lease, v_expires, v_batch_end, v_count, v_last, v_queue_id, v_qtenant,
         v_pname
    FROM queen.log_consumers c
    JOIN queen.log_partitions lp ON lp.id = c.partition_id
    JOIN queen.queues q ON q.id = lp.queue_id
    WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group
      AND q.tenant = p_tenant
    FOR UPDATE OF c;

    IF NOT FOUND THEN
        PERFORM 1
        FROM queen.log_partitions lp
        JOIN queen.queues q ON q.id = lp.queue_id
        WHERE lp.id = p_partition_id AND q.tenant = p_tenant;
        RETURN jsonb_build_object(
            'ok', false,
            'error', CASE WHEN FOUND THEN 'lease_invalid' ELSE 'partition_not_found' END,
            'dlqId', NULL, 'new', CASE WHEN FOUND THEN 0 END, 'leaseReleased', false);
    END IF;

    v_live := v_lease IS NOT NULL AND v_expires > now();
    IF p_lease_id IS NOT NULL AND NOT (v_live AND v_lease = p_lease_id) THEN
        RETURN jsonb_build_object('ok', false, 'error', 'lease_invalid', 'dlqId', NULL,
                                  'new', v_old, 'leaseReleased', false);
    END IF;
    IF p_offset <= v_old THEN
        RETURN jsonb_build_object('ok', false, 'error', 'already_committed', 'dlqId', NULL,
                                  'new', v_old, 'leaseReleased', false);
    END IF;
    -- the ackable span's end: the leased batch, or the log for a lease-less hand-off
    v_span_end := CASE WHEN p_lease_id IS NOT NULL THEN COALESCE(v_batch_end, v_old)
                       ELSE v_last END;
    IF p_offset > v_span_end THEN
        RETURN jsonb_build_object('ok', false, 'error', 'beyond_batch', 'dlqId', NULL,
                                  'new', v_old, 'leaseReleased', false);
    END IF;
    IF EXISTS (SELECT 1 FROM queen.log_dlq d
               WHERE d.partition_id = p_partition_id AND d.consumer_group = p_group
                 AND d."offset" = p_offset) THEN
        RETURN jsonb_build_object('ok', false, 'error', 'already_filed', 'dlqId', NULL,
                                  'new', v_old, 'leaseReleased', false);
    END IF;

    INSERT INTO queen.log_dlq (tenant, queue_id, partition_id, partition_name, consumer_group,
                               "offset", message_id, transaction_id, trace_id, producer_sub,
                               encrypted, payload, error, retry_count, message_created_at)
    VALUES (v_qtenant, v_queue_id, p_partition_id, v_pname, p_group,
            p_offset, p_message_id, p_transaction_id, p_trace_id, p_producer_sub,
            COALESCE(p_encrypted, false), p_payload, p_error, v_count, p_message_created_at)
    RETURNING id INTO v_id;

    v_new := GREATEST(v_old, p_offset);
    -- A leased call releases its lease; a lease-less one only a live lease it completed.
    v_release := CASE WHEN p_lease_id IS NOT NULL THEN true
                      ELSE v_live AND v_batch_end IS NOT NULL AND v_new >= v_batch_end END;

    UPDATE queen.log_consumers c SET
        committed_offset  = v_new,
        ready_at          = CASE WHEN v_new > v_old
                                 THEN queen.log_ready_at_v1(c.partition_id, v_new,
                                                            c.next_offset, c.next_created_at)
                                 ELSE c.ready_at END,
        batch_retry_count = 0,
        attempt_count     = 0,
        total_consumed    = c.total_consumed + (v_new - v_old),
        last_consumed_at  = now(),
        released_lease_id = CASE WHEN v_release THEN c.lease_id ELSE c.released_lease_id END,
        lease_id          = CASE WHEN v_release THEN NULL ELSE c.lease_id END,
        worker_id         = CASE WHEN v_release THEN NULL ELSE c.worker_id END,
        lease_expires_at  = CASE WHEN v_release THEN NULL ELSE c.lease_expires_at END
    WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group;

    RETURN jsonb_build_object('ok', true, 'error', NULL, 'dlqId', v_id, 'new', v_new,
                              'leaseReleased', v_release);
END
$$;

COMMENT ON FUNCTION queen.log_dlq_head_v1(uuid, int8, text, uuid, int8, uuid, text, uuid, text,
                                          boolean, bytea, text, timestamptz) IS
'File the DLQ row of a poison offset, move the cursor past it, reset retry state, release the '
'lease. Idempotent. Returns {"ok","error","dlqId","new","leaseReleased"}.';

-- ---------------------------------------------------------------------------------------------
-- log_ack_at_v1: positional full-batch `completed` ack under a live lease (registry fast path).
--   p_batch_end  the last offset of the delivered batch; must be <= the leased batch_end
--   p_count      messages acked, informational only (total_consumed counts the real advance)
-- A NULL p_lease_id is lease_invalid: the fast path only exists for leased pops.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_ack_at_v1(
    p_tenant       uuid,
    p_partition_id int8,
    p_group        text,
    p_lease_id     uuid,
    p_batch_end    int8,
    p_count        int4
) RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_old        int8;
    v_lease      uuid;
    v_expires    timestamptz;
    v_batch_end  int8;
    v_batch_start int8;
    v_new        int8;
BEGIN
    -- PERF: lock + tenant check in one statement; the failure path pays a second probe.
    SELECT c.committed_offset, c.lease_id, c.lease_expires_at, c.batch_end, c.batch_start
    INTO v_old, v_lease, v_expires, v_batch_end, v_batch_start
    FROM queen.log_consumers c
    JOIN queen.log_partitions lp ON lp.id = c.partition_id
    JOIN queen.queues q ON q.id = lp.queue_id
    WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group
      AND q.tenant = p_tenant
    FOR UPDATE OF c;

    IF NOT FOUND THEN
        PERFORM 1
        FROM queen.log_partitions lp
        JOIN queen.queues q ON q.id = lp.queue_id
        WHERE lp.id = p_partition_id AND q.tenant = p_tenant;
        IF NOT FOUND THEN
            RETURN jsonb_build_object('ok', false, 'error', 'partition_not_found',
                                      'old', NULL, 'new', NULL, 'leaseReleased', false);
        END IF;
        RETURN jsonb_build_object('ok', false, 'error', 'lease_invalid',
                                  'old', 0, 'new', 0, 'leaseReleased', false);
    END IF;

    IF p_lease_id IS NULL OR v_lease IS DISTINCT FROM p_lease_id OR NOT (v_expires > now()) THEN
        RETURN jsonb_build_object('ok', false, 'error', 'lease_invalid',
                                  'old', v_old, 'new', v_old, 'leaseReleased', false);
    END IF;
    IF p_batch_end IS NULL OR v_batch_end IS NULL OR p_batch_end > v_batch_end THEN
        RETURN jsonb_build_object('ok', false, 'error', 'beyond_batch',
                                  'old', v_old, 'new', v_old, 'leaseReleased', false);
    END IF;
    -- NOTE(ack): part of the batch was already committed (a lease-less ack moved the cursor
    -- inside it): those items must be answered noop, which only the hash path can tell.
    IF v_batch_start IS NOT NULL AND v_old >= v_batch_start THEN
        RETURN jsonb_build_object('ok', false, 'error', 'partly_committed',
                                  'old', v_old, 'new', v_old, 'leaseReleased', false);
    END IF;

    v_new := GREATEST(v_old, p_batch_end);
    UPDATE queen.log_consumers c SET
        committed_offset  = v_new,
        ready_at          = CASE WHEN v_new > v_old
                                 THEN queen.log_ready_at_v1(c.partition_id, v_new,
                                                            c.next_offset, c.next_created_at)
                                 ELSE c.ready_at END,
        batch_retry_count = 0,
        attempt_count     = 0,
        total_consumed    = c.total_consumed + (v_new - v_old),
        last_consumed_at  = CASE WHEN v_new > v_old THEN now() ELSE c.last_consumed_at END,
        released_lease_id = c.lease_id,
        lease_id          = NULL,
        worker_id         = NULL,
        lease_expires_at  = NULL
    WHERE c.partition_id = p_partition_id AND c.consumer_group = p_group;

    RETURN jsonb_build_object('ok', true, 'error', NULL, 'old', v_old, 'new', v_new,
                              'leaseReleased', true);
END
$$;

COMMENT ON FUNCTION queen.log_ack_at_v1(uuid, int8, text, uuid, int8, int4) IS
'Positional full-batch completed ack under the live lease (ack registry fast path). Returns '
'{"ok","error","old","new","leaseReleased"}; error lease_invalid | partition_not_found | '
'beyond_batch.';

-- ---------------------------------------------------------------------------------------------
-- log_ack_multi_v3: ack fusion, N positional acks in one transaction. Rows with the same
-- (partition, group, lease) were folded by the caller (max batch_end); two different leases on
-- one (partition, group) stay two rows and are validated independently (the second one sees
-- the first one's release). Each row decides exactly as log_ack_at_v1 does, written out here.
--
-- Revision (issue 26): replaces log_ack_multi_v1 (jsonb, a log_ack_at_v1 call per row).
-- Why: the suite's consume loop acks each 100-message pop with one row here. A row cost its
-- backend 626 thousand instructions (bench/popsql.py --callgrind), of which about 110
-- thousand were the jsonb answer (an object per row, the || of its ordinal, to_jsonb) and the
-- ordering query around a one-row call, and about 45 thousand the nested function call; the
-- shard then parsed the JSON text with the stdlib. Now: one int8[] read in binary, the row's
-- statements inline, no ordering query for one row, the tenant checked through the cursor's
-- queue_id (one join less), and the cursor row updated by the ctid its locking read returned
-- (that read locks the newest version, so the ctid is the row's current one; no other
-- transaction can move it while the lock is held).
-- Revision (issue 26, pgcons10): the row's decision (code) is computed by its locking SELECT,
-- the argument tests are one IF on the good path, and each row's three results are set by the
-- one assignment that ends its turn (so the completeness loop is gone: every ordinal of the
-- permutation v_order gets one); the UPDATE returns the new cursor INTO STRICT (its guard):
-- 398,860 -> 389,546 instructions an ack of 100 (bench/popsql.py --callgrind). The inputs stay
-- variables: read as p_x[k] inside the statements they cost 19,000 more.
-- Revision (issue 26, pgpop12, taken from pgcons11's reverted 9ca0cfc): log_ack_multi_v3
-- replaces log_ack_multi_v2 (same arguments and answer) with two expressions fewer a call: no
-- array_fill (the results' slices build the array) and no assignment of the one-row order:
-- 389,708 -> 384,363 instructions an ack of 100 (bench/popsql.py --callgrind).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_ack_multi_v3(
    p_tenant        uuid,
    p_partition_ids int8[],
    p_groups        text[],
    p_lease_ids     uuid[],
    p_batch_ends    int8[],
    p_counts        int4[]
) RETURNS int8[]
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    n             int4 := COALESCE(cardinality(p_partition_ids), 0);
    v_res         int8[];
    v_order       int4[];
    k             int4;
    v_pid         int8;
    v_grp         text;
    v_bend        int8;
    v_lease_in    uuid;
    v_ctid        tid;
    v_code        int8;
    v_old         int8;
    v_new         int8;
BEGIN
    -- PERF: one test on the good path (each plpgsql expression a call evaluates is
    -- initialized anew in each transaction: about 2,500 instructions; bench/popsql.py)
    IF COALESCE(cardinality(p_groups), 0) <> n
       OR COALESCE(cardinality(p_lease_ids), 0) <> n
       OR COALESCE(cardinality(p_batch_ends), 0) <> n
       OR COALESCE(cardinality(p_counts), 0) <> n
       OR n = 0 OR array_position(p_partition_ids, NULL) IS NOT NULL
       OR array_position(p_groups, NULL) IS NOT NULL THEN
        IF COALESCE(cardinality(p_groups), 0) <> n
           OR COALESCE(cardinality(p_lease_ids), 0) <> n
           OR COALESCE(cardinality(p_batch_ends), 0) <> n
           OR COALESCE(cardinality(p_counts), 0) <> n THEN
            RAISE EXCEPTION 'log_ack_multi_v3: misaligned arrays (partitions %, groups %, leases %, batch_ends %, counts %)',
                cardinality(p_partition_ids), cardinality(p_groups), cardinality(p_lease_ids),
                cardinality(p_batch_ends), cardinality(p_counts)
                USING ERRCODE = '22023';
        END IF;
        IF n = 0 THEN
            RETURN '{}'::int8[];
        END IF;
        RAISE EXCEPTION 'log_ack_multi_v3: NULL partition id or group'
            USING ERRCODE = '22023';
    END IF;

    -- The lock order: consumer rows ascending by (partition_id, consumer_group) in the
    -- primary key's collation; input ordinal last so equal keys run in input order (one row:
    -- v_order stays NULL, the order is {1}).
    IF n > 1 THEN
        SELECT array_agg(u.o::int4 ORDER BY u.pid, u.grp COLLATE "C", u.o) INTO v_order
        FROM unnest(p_partition_ids, p_groups) WITH ORDINALITY AS u(pid, grp, o);
    END IF;

    -- Each ordinal of v_order (a permutation of 1..n) gets its three results in the one
    -- slice assignment that ends its turn: v_res starts NULL, and a slice assigned to a NULL
    -- or a one-dimensional array creates or extends it (positions between stay NULL until
    -- their turn), so once every ordinal had its turn it is exactly [1:3n].
    FOREACH k IN ARRAY COALESCE(v_order, '{1}') LOOP
        v_pid := p_partition_ids[k];
        v_grp := p_groups[k];
        v_lease_in := p_lease_ids[k];
        v_bend := p_batch_ends[k];
        -- PERF: lock + tenant check + the row's decision in one statement, the inputs read
        -- there (a plpgsql assignment or test is an expression initialized anew in every
        -- transaction), the queue reached by the cursor's own queue_id (the partition's
        -- queue, never changes: schema/002_ready_index.sql), not through the partition row;
        -- the failure path pays a second probe. A row an older build left without queue_id
        -- (the families' repair fills it) answers lease_invalid here, and the broker takes
        -- the authoritative path for it. The tenant is a subquery, a primary key probe: as a
        -- join, the generic plan read the queues of the tenant (a bitmap scan of its index)
        -- and filtered them by id. Codes: 0 ok, 1 lease_invalid, 3 beyond_batch,
        -- 4 partly_committed: part of the batch was already committed (a lease-less ack
        -- moved the cursor inside it), and those items must be answered noop, which only the
        -- hash path can tell.
        SELECT c.ctid, c.committed_offset,
               CASE WHEN v_lease_in IS NULL OR c.lease_id IS DISTINCT FROM v_lease_in
                         OR NOT (c.lease_expires_at > now()) THEN 1
                    WHEN v_bend IS NULL OR c.batch_end IS NULL
                         OR v_bend > c.batch_end THEN 3
                    WHEN c.batch_start IS NOT NULL AND c.committed_offset >= c.batch_start
                         THEN 4
                    ELSE 0 END,
               GREATEST(c.committed_offset, v_bend)
        INTO v_ctid, v_old, v_code, v_new
        FROM queen.log_consumers c
        WHERE c.partition_id = v_pid AND c.consumer_group = v_grp
          AND (SELECT q.tenant FROM queen.queues q WHERE q.id = c.queue_id) = p_tenant
        FOR UPDATE OF c;

        IF NOT FOUND THEN
            PERFORM 1
            FROM queen.log_partitions lp
            JOIN queen.queues q ON q.id = lp.queue_id
            WHERE lp.id = v_pid AND q.tenant = p_tenant;
            IF NOT FOUND THEN
                v_code := 2;  -- partition_not_found: old and new stay NULL
            ELSE  -- lease_invalid: the group has no cursor here
                v_code := 1;
                v_old := 0;
                v_new := 0;
            END IF;
        ELSIF v_code = 0 THEN
            -- The released lease's row (schema/014_lease_table.sql) goes with it when this
            -- was its one cursor: no cursor can hold the lease again, and housekeeping's
            -- reclaim would pay a probe of the cursor and a statement of its own for it
            -- (measured, bench/README.md). A lease of several partitions is left to that
            -- reclaim. INTO STRICT: the row is locked by this call, so its version cannot
            -- have moved (P0002 if it did).
            WITH gone AS (
                DELETE FROM queen.log_leases l
                WHERE l.lease_id = v_lease_in AND cardinality(l.partition_ids) = 1
            )
            UPDATE queen.log_consumers c SET
                committed_offset  = v_new,
                -- PERF: log_ready_at_v1's claim-record answer written out (no call on the
                -- common path: the batch acked is the last claim)
                ready_at          = CASE WHEN c.next_offset = v_new + 1
                                          AND c.next_created_at IS NOT NULL
                                         THEN c.next_created_at
                                         WHEN v_new > v_old
                                         THEN queen.log_ready_at_v1(c.partition_id, v_new,
                                                                    NULL, NULL)
                                         ELSE c.ready_at END,
                batch_retry_count = 0,
                attempt_count     = 0,
                total_consumed    = c.total_consumed + (v_new - v_old),
                last_consumed_at  = CASE WHEN v_new > v_old THEN now()
                                         ELSE c.last_consumed_at END,
                released_lease_id = c.lease_id,
                lease_id          = NULL,
                worker_id         = NULL,
                lease_expires_at  = NULL
            WHERE c.ctid = v_ctid AND c.partition_id = v_pid
              AND c.consumer_group = v_grp
            RETURNING c.committed_offset INTO STRICT v_new;
        ELSE  -- refused: the cursor stays
            v_new := v_old;
        END IF;
        v_res[3 * k - 2 : 3 * k] := ARRAY[v_code, v_old, v_new];
    END LOOP;

    RETURN v_res;
END
$$;

COMMENT ON FUNCTION queen.log_ack_multi_v3(uuid, int8[], text[], uuid[], int8[], int4[]) IS
'Ack fusion: log_ack_at_v1''s decision per row in (partition_id, consumer_group) order; returns '
'int8[] of 3 per row in input order: code (0 ok and lease released, 1 lease_invalid, '
'2 partition_not_found, 3 beyond_batch, 4 partly_committed), old cursor, new cursor (NULL '
'for partition_not_found).';
