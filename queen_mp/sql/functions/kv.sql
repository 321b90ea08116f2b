-- kv.sql: the versioned key/value store (api.md 2.5 "KV ops", 2.11 POST /api/v1/kv) and the
-- maintenance guard shared by every write family that is not a push (KV, timers, transactions).
--
-- Functions:
--   queen.require_writable_v1() -> void
--       raises QM001 when push maintenance is on (system_settings maintenance_mode).
--   queen.iso_ms_v1(timestamptz) -> text
--       api.md 1.3 time out: 'YYYY-MM-DDTHH:MM:SS.mmmZ' (UTC, milliseconds truncated); NULL in,
--       NULL out.
--   queen.kv_prefix_end_v1(text) -> text
--       the smallest string above every string that starts with the prefix (COLLATE "C"
--       order = code point order), or NULL when there is none (empty prefix).
--   queen.kv_apply_v1(uuid, jsonb) -> jsonb
--       applies an array of normalised KV ops (queen_mp/models/kv.py) IN ORDER in the caller's
--       transaction and returns one result object per op (below).
--   queen.kv_purge_v1(int4) -> int4
--       deletes up to p_limit expired rows; returns how many.
--
-- Tables touched:
--   queen.kv               get/getMany/getPrefix: plain reads (no lock); put, putIfAbsent,
--                          delete, check, incr: SELECT ... FOR UPDATE of the one row, then
--                          INSERT ... ON CONFLICT DO NOTHING / UPDATE / DELETE of that row;
--                          kv_purge_v1: SELECT ... FOR UPDATE SKIP LOCKED, DELETE
--   queen.system_settings  read only (require_writable_v1), no lock
--
-- Lock order (design.md invariant 4; schema/001_baseline.sql header):
--   kv rows are outside the partition and consumer lock spaces. A transaction that takes
--   partition or consumer row locks (POST /api/v1/transaction, transaction.sql) calls
--   kv_apply_v1 AFTER all of them, never before, so the global order is
--   partition rows -> consumer rows -> kv rows -> timer rows. kv_apply_v1 itself never locks a
--   partition or consumer row. Inside one call the kv rows are locked ONE AT A TIME IN OP ORDER
--   (each write op locks exactly its own row, SELECT ... FOR UPDATE, or creates it with
--   INSERT ... ON CONFLICT DO NOTHING); reads lock nothing. Two calls that write the same keys
--   in opposite op orders can therefore deadlock: PostgreSQL aborts one with 40P01 (nothing
--   applied; the broker retries it). A `check` of an ABSENT key locks nothing (there is no row
--   to lock): its verdict holds for the snapshot, a concurrent creator is not excluded.
--   kv_purge_v1 never waits on a row lock (SKIP LOCKED), so it cannot join a cycle.
--
-- SQLSTATEs raised:
--   QM001  require_writable_v1: push maintenance is on. MESSAGE 'maintenance'.
--   QK001  kv_apply_v1: an op with "required": true failed its precondition. MESSAGE
--          'kv precondition failed at index <i>' (i = 0-based position in p_ops), DETAIL the
--          JSON text {"failedIndex": i, "kvReason": reason, "version": v|null, "value": v|null}
--          (the current live row, null when absent). The caller's transaction, or the caller's
--          subtransaction, rolls back every earlier write of the call.
--   22023  kv_apply_v1: p_ops is not an array, or an op kind is unknown (queen_mp/models/kv.py
--          validated everything else; malformed fields are not re-checked here).
--   40P01 / 40001 may reach the caller through the row locks (nothing applied; retryable).
--
-- Transaction isolation: READ COMMITTED (each statement sees rows committed before it; the
-- FOR UPDATE re-read after a lock wait sees the winner's row, which the precondition race
-- relies on). Under REPEATABLE READ a lost race is 40001 instead of a verdict.
--
-- Input: p_ops is the array built by queen_mp.kv.parse_kv_ops (its docstring is the
-- reference); every field of an op kind is present, null when not given:
--   {"op":"get",         "ns", "key"}
--   {"op":"getMany",     "ns", "keys": [text, ...]}
--   {"op":"getPrefix",   "ns", "prefix", "after": text|null, "limit": 1..1000, "keysOnly": bool}
--   {"op":"put",         "ns", "key", "value", "ttlSeconds": int|null, "expect": int|null,
--                        "required": bool}
--   {"op":"putIfAbsent", "ns", "key", "value", "ttlSeconds": int|null, "required": bool}
--   {"op":"delete",      "ns", "key", "expect": int|null, "required": bool}
--   {"op":"check",       "ns", "key", "expect": int, "required": bool}
--   {"op":"incr",        "ns", "key", "delta": int, "min": int|null, "max": int|null,
--                        "ttlSeconds": int|null, "required": bool}
--   ttlSeconds null = forever (expires_at NULL).
--
-- Semantics:
--   * Time: one instant per call, v_now = statement_timestamp(). A row is LIVE when
--     expires_at IS NULL OR expires_at > v_now. An expired row is invisible to every op: it
--     reads as absent, fails `expect: N > 0` with `absent`, passes `expect: 0`, and a write over
--     it starts a new lineage (version 1, created_at reset). kv_purge_v1 deletes
--     expires_at <= now(), the same boundary.
--   * Versions: the effective version of an absent key is 0; a write stores effective + 1, so a
--     key's versions run 1, 2, 3 ... and restart at 1 after a delete or an expiry.
--   * Reads see the earlier writes of the same call (same transaction, later statements).
--   * put: replaces value AND expiry (a put never inherits the old expiry). With `expect` it
--     applies only when expect = effective version. putIfAbsent = put with expect 0.
--   * delete: without expect, applies when the key is live; with expect, when expect = the
--     effective version (expect 0 on an absent key applies and deletes nothing).
--   * check: applies when expect = the effective version; writes nothing, but locks a live row
--     (FOR UPDATE) so the verdict holds until commit.
--   * incr: value := (live value, or 0 when absent) + delta; refused (`bounds`) when the result
--     falls outside [min, max] or outside int8; refused (`type`) when the live value is not a
--     JSON number. ttlSeconds / forever apply only when the incr CREATES the key (absent or
--     expired): a live key keeps its expiry (a fixed-window counter closes on time).
--   * Failure reasons: `exists` (expect 0, key live), `absent` (expect > 0 or plain delete, key
--     absent), `version` (live, other version), `bounds`, `type` (incr).
--   * Read budget: the values returned by one call (get, getMany, getPrefix together) may total
--     queen.kv_read_budget_bytes (a custom setting; default 8 MiB) of JSON text. A get always
--     answers; a getMany or getPrefix row whose preceding rows of the same op already reach the
--     remaining budget is cut: getMany reports cut keys neither in rows nor in missing and sets
--     truncated; getPrefix stops its page there (truncated, nextAfter). A row straddling the
--     budget is still included, so a call with budget left always returns a row.
--
-- Result shapes (one object per op, index-aligned, no "index"/"type": the broker adds them;
-- times are iso_ms_v1 text):
--   get        {"op","found":true,"key","value","version","expiresAt","updatedAt"}
--              {"op","found":false,"key","value":null,"version":null,"expiresAt":null,
--               "updatedAt":null}
--   getMany    {"op","rows":[{"key","value","version","expiresAt","updatedAt"}],
--               "missing":[key,...],"truncated":bool}       rows and missing in request order,
--                                                           a repeated key answered once
--   getPrefix  {"op","rows":[...],"truncated":bool,"nextAfter":key|null}   rows in key order
--              (COLLATE "C" = code point order); keysOnly rows carry no "value". nextAfter is
--              the last returned key when truncated (the `after` of the next page), else null.
--   put, putIfAbsent  {"op","applied":true,"version"}
--   delete, check     {"op","applied":true}
--   incr              {"op","applied":true,"value","version"}
--   any failed write  {"op","applied":false,"reason","version":v|null,"value":v|null}
--                     (the current live row; null, null when absent)

-- ---------------------------------------------------------------------------------------------
-- require_writable_v1: the push-maintenance guard (api.md 5). Reads the flag without a lock:
-- a write racing the switch may still pass, as a push racing it may still be stored.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.require_writable_v1()
RETURNS void
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM queen.system_settings s
               WHERE s.key = 'maintenance_mode' AND s.value #>> '{}' = 'true') THEN
        RAISE EXCEPTION USING ERRCODE = 'QM001', MESSAGE = 'maintenance',
            HINT = 'push maintenance is on: transactions, KV and timer writes are refused';
    END IF;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- iso_ms_v1: a time as api.md 1.3 renders it. to_char's MS truncates the microseconds, as the
-- broker's queen_mp.wire.times.iso_ms does.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.iso_ms_v1(p_ts timestamptz)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $$
    SELECT to_char(p_ts AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"');
$$;

-- ---------------------------------------------------------------------------------------------
-- kv_prefix_end_v1: exclusive upper bound of the keys starting with p_prefix, for an index
-- range [prefix, end). Increments the last code point, jumping over the surrogate block (no
-- text can hold one) and dropping trailing U+10FFFF (which cannot be incremented).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.kv_prefix_end_v1(p_prefix text)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    v_s  text := p_prefix;
    v_cp int4;
BEGIN
    WHILE v_s IS NOT NULL AND v_s <> '' LOOP
        v_cp := ascii(right(v_s, 1));
        IF v_cp >= 1114111 THEN
            v_s := left(v_s, -1);
            CONTINUE;
        END IF;
        v_cp := CASE WHEN v_cp = 55295 THEN 57344 ELSE v_cp + 1 END;
        RETURN left(v_s, -1) || chr(v_cp);
    END LOOP;
    RETURN NULL;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- kv_apply_v1: see the header for input, semantics and results.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.kv_apply_v1(p_tenant uuid, p_ops jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    -- NOTE(kv): a key holds at most 1024 bytes (schema/001_baseline.sql), so 257 x U+10FFFF (1028 bytes)
    -- sorts above every key: the upper bound of an empty prefix's range.
    c_top      constant text := repeat(chr(1114111), 257);
    c_int8_min constant numeric := -9223372036854775808;
    c_int8_max constant numeric := 9223372036854775807;
    v_now      timestamptz := statement_timestamp();
    v_budget   int8 := COALESCE(NULLIF(current_setting('queen.kv_read_budget_bytes', true),
                                       '')::int8, 8388608);
    v_out      jsonb[] := '{}';
    v_i        int4;
    v_op       jsonb;
    v_kind     text;
    v_ns       text;
    v_key      text;
    v_res      jsonb;
    -- write ops: the locked row and the decision
    v_expect   int8;
    v_exists   boolean;
    v_live     boolean;
    v_cur_val  jsonb;
    v_cur_ver  int8;
    v_cur_exp  timestamptz;
    v_cur_upd  timestamptz;
    v_eff_ver  int8;
    v_reason   text;
    v_write    text;      -- 'upsert' | 'delete' | NULL (nothing to write)
    v_new_val  jsonb;
    v_new_exp  timestamptz;
    v_next     numeric;
    v_count    int8;
    -- multi-row reads
    v_rows     jsonb;
    v_missing  jsonb;
    v_bytes    numeric;
    v_last     text;
    v_trunc    boolean;
    v_prefix   text;
    v_end      text;
    v_limit    int4;
    v_keys_only boolean;
BEGIN
    IF p_ops IS NULL OR jsonb_typeof(p_ops) <> 'array' THEN
        RAISE EXCEPTION 'kv_apply_v1: p_ops must be a JSON array' USING ERRCODE = '22023';
    END IF;

    FOR v_i IN 0 .. jsonb_array_length(p_ops) - 1 LOOP
        v_op := p_ops -> v_i;
        v_kind := v_op ->> 'op';
        v_ns := v_op ->> 'ns';
        v_key := v_op ->> 'key';

        -- ------------------------------------------------------------------------- reads
        IF v_kind = 'get' THEN
            SELECT k.value, k.version, k.expires_at, k.updated_at
              INTO v_cur_val, v_cur_ver, v_cur_exp, v_cur_upd
              FROM queen.kv k
             WHERE k.tenant = p_tenant AND k.ns = v_ns AND k.key = v_key
               AND (k.expires_at IS NULL OR k.expires_at > v_now);
            IF FOUND THEN
                v_budget := v_budget - octet_length(v_cur_val::text);
                v_res := jsonb_build_object(
                    'op', 'get', 'found', true, 'key', v_key, 'value', v_cur_val,
                    'version', v_cur_ver, 'expiresAt', queen.iso_ms_v1(v_cur_exp),
                    'updatedAt', queen.iso_ms_v1(v_cur_upd));
            ELSE
                v_res := jsonb_build_object(
                    'op', 'get', 'found', false, 'key', v_key, 'value', NULL,
                    'version', NULL, 'expiresAt', NULL, 'updatedAt', NULL);
            END IF;
            v_out := array_append(v_out, v_res);
            CONTINUE;
        END IF;

        IF v_kind = 'getMany' THEN
            WITH want AS (
                SELECT t.k, min(t.o) AS o
                  FROM jsonb_array_elements_text(v_op -> 'keys') WITH ORDINALITY AS t(k, o)
                 GROUP BY t.k
            ), hit AS (
                SELECT w.o, k.key, k.value, k.version, k.expires_at, k.updated_at,
                       octet_length(k.value::text)::int8 AS blen
                  FROM want w
                  JOIN queen.kv k ON k.tenant = p_tenant AND k.ns = v_ns AND k.key = w.k
                 WHERE k.expires_at IS NULL OR k.expires_at > v_now
            ), acc AS (
                SELECT h.*, sum(h.blen) OVER (ORDER BY h.o ROWS UNBOUNDED PRECEDING) - h.blen
                           AS before
                  FROM hit h
            )
            SELECT (SELECT COALESCE(jsonb_agg(jsonb_build_object(
                               'key', a.key, 'value', a.value, 'version', a.version,
                               'expiresAt', queen.iso_ms_v1(a.expires_at),
                               'updatedAt', queen.iso_ms_v1(a.updated_at)) ORDER BY a.o),
                           '[]'::jsonb)
                      FROM acc a WHERE a.before < v_budget),
                   (SELECT COALESCE(sum(a.blen), 0) FROM acc a WHERE a.before < v_budget),
                   (SELECT count(*) FROM acc a WHERE a.before >= v_budget),
                   (SELECT COALESCE(jsonb_agg(to_jsonb(w.k) ORDER BY w.o), '[]'::jsonb)
                      FROM want w WHERE NOT EXISTS (SELECT 1 FROM hit h WHERE h.o = w.o))
              INTO v_rows, v_bytes, v_count, v_missing;
            v_budget := v_budget - v_bytes::int8;
            v_out := array_append(v_out, jsonb_build_object(
                'op', 'getMany', 'rows', v_rows, 'missing', v_missing,
                'truncated', v_count > 0));
            CONTINUE;
        END IF;

        IF v_kind = 'getPrefix' THEN
            v_prefix := COALESCE(v_op ->> 'prefix', '');
            v_limit := COALESCE((v_op ->> 'limit')::int4, 100);
            v_keys_only := COALESCE((v_op ->> 'keysOnly')::boolean, false);
            v_end := COALESCE(queen.kv_prefix_end_v1(v_prefix), c_top);
            -- PERF(kv): [prefix, end) and `after` are all index bounds of the primary key, so a
            -- page reads at most limit + 1 rows however large the namespace.
            WITH page AS (
                SELECT k.key, k.value, k.version, k.expires_at, k.updated_at,
                       CASE WHEN v_keys_only THEN 0 ELSE octet_length(k.value::text) END::int8
                           AS blen
                  FROM queen.kv k
                 WHERE k.tenant = p_tenant AND k.ns = v_ns
                   AND k.key >= v_prefix AND k.key < v_end
                   AND k.key > COALESCE(v_op ->> 'after', '')
                   AND starts_with(k.key, v_prefix)
                   AND (k.expires_at IS NULL OR k.expires_at > v_now)
                 ORDER BY k.key
                 LIMIT v_limit + 1
            ), acc AS (
                SELECT p.*, row_number() OVER w AS rn, sum(p.blen) OVER w - p.blen AS before
                  FROM page p
                WINDOW w AS (ORDER BY p.key ROWS UNBOUNDED PRECEDING)
            ), kept AS (
                SELECT a.* FROM acc a WHERE a.rn <= v_limit AND a.before < v_budget
            )
            SELECT (SELECT COALESCE(jsonb_agg(
                               CASE WHEN v_keys_only
                                    THEN jsonb_build_object(
                                        'key', x.key, 'version', x.version,
                                        'expiresAt', queen.iso_ms_v1(x.expires_at),
                                        'updatedAt', queen.iso_ms_v1(x.updated_at))
                                    ELSE jsonb_build_object(
                                        'key', x.key, 'value', x.value, 'version', x.version,
                                        'expiresAt', queen.iso_ms_v1(x.expires_at),
                                        'updatedAt', queen.iso_ms_v1(x.updated_at))
                               END ORDER BY x.rn), '[]'::jsonb)
                      FROM kept x),
                   (SELECT COALESCE(sum(x.blen), 0) FROM kept x),
                   (SELECT x.key FROM kept x ORDER BY x.rn DESC LIMIT 1),
                   (SELECT count(*) FROM kept) < (SELECT count(*) FROM acc)
              INTO v_rows, v_bytes, v_last, v_trunc;
            v_budget := v_budget - v_bytes::int8;
            v_out := array_append(v_out, jsonb_build_object(
                'op', 'getPrefix', 'rows', v_rows, 'truncated', v_trunc,
                'nextAfter', CASE WHEN v_trunc THEN COALESCE(v_last, v_op ->> 'after') END));
            CONTINUE;
        END IF;

        -- ------------------------------------------------------------------------ writes
        IF v_kind NOT IN ('put', 'putIfAbsent', 'delete', 'check', 'incr') THEN
            RAISE EXCEPTION 'kv_apply_v1: unknown op % at index %', quote_literal(v_kind), v_i
                USING ERRCODE = '22023';
        END IF;
        v_expect := CASE WHEN v_kind = 'putIfAbsent' THEN 0
                         ELSE (v_op ->> 'expect')::int8 END;

        <<locked>>
        LOOP
            -- Lock the one row of this op (the lock order of the header: op order).
            SELECT k.value, k.version, k.expires_at
              INTO v_cur_val, v_cur_ver, v_cur_exp
              FROM queen.kv k
             WHERE k.tenant = p_tenant AND k.ns = v_ns AND k.key = v_key
               FOR UPDATE;
            v_exists := FOUND;
            v_live := v_exists AND (v_cur_exp IS NULL OR v_cur_exp > v_now);
            v_eff_ver := CASE WHEN v_live THEN v_cur_ver ELSE 0 END;
            v_reason := NULL;
            v_write := NULL;
            v_new_val := NULL;
            v_new_exp := NULL;

            IF v_kind = 'incr' AND v_live AND jsonb_typeof(v_cur_val) <> 'number' THEN
                v_reason := 'type';
            ELSIF v_kind = 'incr' THEN
                v_next := CASE WHEN v_live THEN (v_cur_val #>> '{}')::numeric ELSE 0 END
                          + (v_op ->> 'delta')::numeric;
                IF v_next < COALESCE((v_op ->> 'min')::numeric, c_int8_min)
                   OR v_next > COALESCE((v_op ->> 'max')::numeric, c_int8_max)
                   OR v_next < c_int8_min OR v_next > c_int8_max THEN
                    v_reason := 'bounds';
                ELSE
                    v_write := 'upsert';
                    v_new_val := to_jsonb(v_next);
                    v_new_exp := CASE
                        WHEN v_live THEN v_cur_exp
                        WHEN v_op ->> 'ttlSeconds' IS NULL THEN NULL
                        ELSE v_now + make_interval(secs => (v_op ->> 'ttlSeconds')::int8) END;
                END IF;
            ELSIF v_expect IS NOT NULL AND v_expect <> v_eff_ver THEN
                v_reason := CASE WHEN v_expect = 0 THEN 'exists'
                                 WHEN NOT v_live THEN 'absent'
                                 ELSE 'version' END;
            ELSIF v_kind IN ('put', 'putIfAbsent') THEN
                v_write := 'upsert';
                v_new_val := v_op -> 'value';
                v_new_exp := CASE WHEN v_op ->> 'ttlSeconds' IS NULL THEN NULL
                                  ELSE v_now + make_interval(secs => (v_op ->> 'ttlSeconds')::int8)
                             END;
            ELSIF v_kind = 'delete' THEN
                IF v_live THEN
                    v_write := 'delete';
                ELSIF v_expect IS NULL THEN
                    v_reason := 'absent';
                END IF;
                -- (delete with expect 0 of an absent key: applied, nothing to delete)
            END IF;
            -- (check: a matching expect applies and writes nothing)

            IF v_write = 'upsert' AND NOT v_exists THEN
                INSERT INTO queen.kv (tenant, ns, key, value, version, expires_at, created_at,
                                      updated_at)
                VALUES (p_tenant, v_ns, v_key, v_new_val, v_eff_ver + 1, v_new_exp, v_now, v_now)
                ON CONFLICT (tenant, ns, key) DO NOTHING;
                GET DIAGNOSTICS v_count = ROW_COUNT;
                -- NOTE(kv): a concurrent call created the key after our lookup; the INSERT
                -- waited for it to commit. Decide again on its row, now visible and lockable.
                CONTINUE locked WHEN v_count = 0;
            ELSIF v_write = 'upsert' THEN
                UPDATE queen.kv k
                   SET value = v_new_val, version = v_eff_ver + 1, expires_at = v_new_exp,
                       updated_at = v_now,
                       created_at = CASE WHEN v_live THEN k.created_at ELSE v_now END
                 WHERE k.tenant = p_tenant AND k.ns = v_ns AND k.key = v_key;
            ELSIF v_write = 'delete' THEN
                DELETE FROM queen.kv k
                 WHERE k.tenant = p_tenant AND k.ns = v_ns AND k.key = v_key;
            END IF;
            EXIT locked;
        END LOOP;

        IF v_reason IS NULL THEN
            v_res := jsonb_build_object('op', v_kind, 'applied', true);
            IF v_kind IN ('put', 'putIfAbsent') THEN
                v_res := v_res || jsonb_build_object('version', v_eff_ver + 1);
            ELSIF v_kind = 'incr' THEN
                v_res := v_res || jsonb_build_object('value', v_new_val,
                                                     'version', v_eff_ver + 1);
            END IF;
        ELSE
            IF COALESCE((v_op ->> 'required')::boolean, false) THEN
                RAISE EXCEPTION USING ERRCODE = 'QK001',
                    MESSAGE = format('kv precondition failed at index %s', v_i),
                    DETAIL = jsonb_build_object(
                        'failedIndex', v_i, 'kvReason', v_reason,
                        'version', CASE WHEN v_live THEN v_cur_ver END,
                        'value', CASE WHEN v_live THEN v_cur_val END)::text;
            END IF;
            v_res := jsonb_build_object(
                'op', v_kind, 'applied', false, 'reason', v_reason,
                'version', CASE WHEN v_live THEN v_cur_ver END,
                'value', CASE WHEN v_live THEN v_cur_val END);
        END IF;
        v_out := array_append(v_out, v_res);
    END LOOP;

    RETURN to_jsonb(v_out);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- kv_purge_v1: the background sweep of expired rows (kv_expires_at_idx), oldest expiry first.
-- Rows locked by a running KV call are skipped (next sweep); the DELETE re-checks the expiry
-- on the locked row, so a key rewritten live meanwhile survives.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.kv_purge_v1(p_limit int4)
RETURNS int4
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_n int4;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 THEN
        RETURN 0;
    END IF;
    WITH doomed AS (
        SELECT k.tenant, k.ns, k.key
          FROM queen.kv k
         WHERE k.expires_at <= now()
         ORDER BY k.expires_at
         LIMIT p_limit
           FOR UPDATE SKIP LOCKED
    )
    DELETE FROM queen.kv k
     USING doomed d
     WHERE k.tenant = d.tenant AND k.ns = d.ns AND k.key = d.key
       AND k.expires_at <= now();
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
