-- locks.sql: locks and semaphores as KV rows (docs/api.md 2.14, POST /api/v1/locks).
--
-- A permit is ONE row of queen.kv in the namespace 'queen-locks' of the caller's tenant: key
-- '<name>#<slot>' (slot 0 for a lock, 0..limit-1 for a semaphore), value {"owner": owner|null},
-- expires_at = the end of its lease period. Its KV version IS the permit's token, taken from
-- queen.lock_token_seq (schema/003_traces.sql) at every acquire and renew: a later holder of a
-- slot always has a higher token than an earlier one, whatever happened between (release,
-- expiry, purge), which a plain KV write (version + 1, restarting at 1) would not promise. The
-- `guard` of an answer is the KV op {"op":"check","ns":"queen-locks","key","expect":token,
-- "required":true}: in a transaction's kv rider (functions/kv.sql) it commits the transaction
-- only while the row is still at that token, i.e. while that lease period is current. Since
-- the rows are ordinary KV rows, the KV routes read them (and an operator may delete a stuck
-- one); the sweep of expired KV rows (kv_purge_v1) removes old permits.
--
-- Functions:
--   queen.lock_guard_v1(text, int8) -> jsonb      the guard of a key at a token
--   queen.lock_holders_v1(uuid, text, int4, boolean, timestamptz) -> jsonb
--       the live permits of a name, by slot: [{"slot","owner"}] (brief), or with "token",
--       "since", "expiresAt", "renewedAt" (full); slots below p_limit, or every slot
--       (0..1023) when p_limit is NULL
--   queen.locks_apply_v1(uuid, jsonb) -> jsonb
--       applies a call's ops (normalised by queen_mp/models/locks.py; each names another lock)
--       and returns one result per op, index-aligned. The ops are independent verdicts, not
--       all-or-nothing; the caller's transaction commits them together.
--
-- The ops and their answers (every answer also has "index", "op", "name"):
--   acquire {name, ttlSeconds, owner|null, limit}
--       the owner already holds a slot below limit: that permit, "already": true (a call sent
--       again after a lost answer is the same permit); else a free slot (absent, or expired),
--       chosen at random among the free ones so that contenders spread, is written:
--       {"acquired": true, "slot", "token", "owner", "guard"}. Every slot held:
--       {"acquired": false, "reason": "held", "holders": [{"slot","owner"}]}; free slots seen
--       but every one taken by a concurrent caller first: "contended" (a semaphore; a lock says
--       "held").
--   renew {name, slot, token, ttlSeconds, owner|null}
--       the live row is at `token`, or names this owner (its own renew landed, the answer was
--       lost): rewritten with a NEW token and expiry: {"renewed": true, "slot", "token",
--       "guard"}; else {"renewed": false, "reason": "lost", "slot", "holders"}.
--   release {name, slot, token}
--       the live row at `token` is deleted: {"released": true, "slot"}; else
--       {"released": false, "reason": "lost", "slot", "holders"}.
--   get {name}
--       {"held", "holders": [{"slot","owner","token","since","expiresAt","renewedAt"}]}:
--       since = when the holder took the permit (the row's created_at, kept by renews),
--       renewedAt = its last write.
--
-- Tables touched: queen.kv (ns 'queen-locks' only): reads; SELECT ... FOR UPDATE [SKIP LOCKED]
--   of one row per op; INSERT ... ON CONFLICT DO NOTHING / UPDATE / DELETE of that row.
-- Lock order: kv rows (functions/kv.sql). The ops run in ascending name order (COLLATE "C"),
--   whatever their order in the call, and each op locks rows of its own name only, at most one
--   that it keeps (an acquire only locks a row it takes over, with SKIP LOCKED, so it never
--   waits on a holder): two lock calls cannot wait on each other in a cycle. A transaction
--   whose kv rider checks several permits in another order may still meet one in a deadlock
--   (40P01: nothing applied, the broker retries).
-- SQLSTATEs raised: 22023 on an unknown op (queen_mp/models/locks.py validated the rest).
-- Time: one instant per call, statement_timestamp(), the KV functions' notion of "live".

CREATE OR REPLACE FUNCTION queen.lock_guard_v1(p_key text, p_token int8)
RETURNS jsonb
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
    SELECT jsonb_build_object('op', 'check', 'ns', 'queen-locks', 'key', p_key,
                              'expect', p_token, 'required', true);
$$;

CREATE OR REPLACE FUNCTION queen.lock_holders_v1(
    p_tenant uuid,
    p_name   text,
    p_limit  int4,
    p_full   boolean,
    p_now    timestamptz
)
RETURNS jsonb
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_out jsonb;
BEGIN
    -- '#' is U+0023 and '$' U+0024: [name#, name$) is the range of the name's keys
    SELECT COALESCE(jsonb_agg(CASE WHEN p_full THEN jsonb_build_object(
                                  'slot', h.slot, 'owner', h.value -> 'owner',
                                  'token', h.version,
                                  'since', queen.iso_ms_v1(h.created_at),
                                  'expiresAt', queen.iso_ms_v1(h.expires_at),
                                  'renewedAt', queen.iso_ms_v1(h.updated_at))
                              ELSE jsonb_build_object('slot', h.slot,
                                                      'owner', h.value -> 'owner') END
                              ORDER BY h.slot), '[]'::jsonb)
      INTO v_out
      FROM (SELECT substr(k.key, length(p_name) + 2)::int4 AS slot, k.value, k.version,
                   k.created_at, k.expires_at, k.updated_at
              FROM queen.kv k
             WHERE k.tenant = p_tenant AND k.ns = 'queen-locks'
               AND k.key >= p_name || '#' AND k.key < p_name || '$'
               AND substr(k.key, length(p_name) + 2) ~ '^(0|[1-9][0-9]{0,3})$'
               AND (k.expires_at IS NULL OR k.expires_at > p_now)) h
     WHERE h.slot < COALESCE(p_limit, 1024);
    -- a row written by hand through the KV routes may hold any value: no owner then
    RETURN (SELECT COALESCE(jsonb_agg(CASE WHEN jsonb_typeof(e -> 'owner') = 'string' THEN e
                                           ELSE jsonb_set(e, '{owner}', 'null') END), '[]')
              FROM jsonb_array_elements(v_out) AS e);
END
$$;

CREATE OR REPLACE FUNCTION queen.locks_apply_v1(p_tenant uuid, p_ops jsonb)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
AS $$
DECLARE
    v_now    timestamptz := statement_timestamp();
    v_out    jsonb[];
    v_i      int4;
    v_op     jsonb;
    v_kind   text;
    v_name   text;
    v_owner  text;
    v_limit  int4;
    v_slot   int4;
    v_key    text;
    v_token  int8;
    v_expire timestamptz;
    v_tried  int4;
    v_value  jsonb;
    v_ver    int8;
    v_exp    timestamptz;
    v_live   boolean;
    v_res    jsonb;
    v_lost   boolean;
BEGIN
    IF p_ops IS NULL OR jsonb_typeof(p_ops) <> 'array' THEN
        RAISE EXCEPTION 'locks_apply_v1: p_ops must be a JSON array' USING ERRCODE = '22023';
    END IF;
    v_out := array_fill(NULL::jsonb, ARRAY[jsonb_array_length(p_ops)]);

    FOR v_i, v_op IN
        SELECT (t.o - 1)::int4, t.e
          FROM jsonb_array_elements(p_ops) WITH ORDINALITY AS t(e, o)
         ORDER BY t.e ->> 'name' COLLATE "C", t.o
    LOOP
        v_kind := v_op ->> 'op';
        v_name := v_op ->> 'name';
        v_owner := v_op ->> 'owner';
        v_res := jsonb_build_object('index', v_i, 'op', v_kind, 'name', v_name);
        v_lost := false;
        v_expire := v_now + make_interval(secs => COALESCE((v_op ->> 'ttlSeconds')::int8, 0));

        IF v_kind = 'get' THEN
            v_value := queen.lock_holders_v1(p_tenant, v_name, NULL, true, v_now);
            v_res := v_res || jsonb_build_object('held', jsonb_array_length(v_value) > 0,
                                                 'holders', v_value);

        ELSIF v_kind = 'acquire' THEN
            v_limit := (v_op ->> 'limit')::int4;
            v_token := NULL;
            v_tried := 0;
            -- the owner's own permit (an acquire sent again is the same permit)
            IF v_owner IS NOT NULL THEN
                SELECT (h ->> 'slot')::int4, (h ->> 'token')::int8 INTO v_slot, v_token
                  FROM jsonb_array_elements(
                           queen.lock_holders_v1(p_tenant, v_name, v_limit, true, v_now)) AS h
                 WHERE h ->> 'owner' = v_owner
                 ORDER BY (h ->> 'slot')::int4
                 LIMIT 1;
            END IF;
            IF v_token IS NOT NULL THEN
                v_res := v_res || jsonb_build_object('already', true);
            ELSE
                FOR v_slot IN
                    SELECT s FROM generate_series(0, v_limit - 1) AS s
                     WHERE NOT EXISTS (
                               SELECT 1 FROM queen.kv k
                                WHERE k.tenant = p_tenant AND k.ns = 'queen-locks'
                                  AND k.key = v_name || '#' || s
                                  AND (k.expires_at IS NULL OR k.expires_at > v_now))
                     ORDER BY random()
                LOOP
                    v_tried := v_tried + 1;
                    v_key := v_name || '#' || v_slot;
                    -- an expired permit: taken over, unless a concurrent call has it locked
                    PERFORM 1 FROM queen.kv k
                      WHERE k.tenant = p_tenant AND k.ns = 'queen-locks' AND k.key = v_key
                        AND k.expires_at IS NOT NULL AND k.expires_at <= v_now
                        FOR UPDATE SKIP LOCKED;
                    IF FOUND THEN
                        UPDATE queen.kv k
                           SET value = jsonb_build_object('owner', v_owner),
                               version = nextval('queen.lock_token_seq'), expires_at = v_expire,
                               created_at = v_now, updated_at = v_now
                         WHERE k.tenant = p_tenant AND k.ns = 'queen-locks' AND k.key = v_key
                        RETURNING k.version INTO v_token;
                    ELSE
                        INSERT INTO queen.kv AS k (tenant, ns, key, value, version, expires_at,
                                                   created_at, updated_at)
                        VALUES (p_tenant, 'queen-locks', v_key,
                                jsonb_build_object('owner', v_owner),
                                nextval('queen.lock_token_seq'), v_expire, v_now, v_now)
                        ON CONFLICT (tenant, ns, key) DO NOTHING
                        RETURNING k.version INTO v_token;
                    END IF;
                    EXIT WHEN v_token IS NOT NULL;
                END LOOP;
            END IF;
            IF v_token IS NOT NULL THEN
                v_key := v_name || '#' || v_slot;
                v_res := v_res || jsonb_build_object(
                    'acquired', true, 'slot', v_slot, 'token', v_token, 'owner', v_owner,
                    'guard', queen.lock_guard_v1(v_key, v_token));
            ELSE
                v_res := v_res || jsonb_build_object(
                    'acquired', false,
                    'reason', CASE WHEN v_tried = 0 OR v_limit = 1 THEN 'held'
                                   ELSE 'contended' END,
                    'holders', queen.lock_holders_v1(p_tenant, v_name, v_limit, false, v_now));
            END IF;

        ELSIF v_kind = 'renew' THEN
            v_slot := (v_op ->> 'slot')::int4;
            v_key := v_name || '#' || v_slot;
            v_token := NULL;
            SELECT k.value, k.version, k.expires_at INTO v_value, v_ver, v_exp
              FROM queen.kv k
             WHERE k.tenant = p_tenant AND k.ns = 'queen-locks' AND k.key = v_key
               FOR UPDATE;
            v_live := FOUND AND (v_exp IS NULL OR v_exp > v_now);
            IF v_live AND (v_ver = (v_op ->> 'token')::int8
                           OR (v_owner IS NOT NULL AND v_value ->> 'owner' = v_owner)) THEN
                UPDATE queen.kv k
                   SET version = nextval('queen.lock_token_seq'), expires_at = v_expire,
                       updated_at = v_now
                 WHERE k.tenant = p_tenant AND k.ns = 'queen-locks' AND k.key = v_key
                RETURNING k.version INTO v_token;
                v_res := v_res || jsonb_build_object(
                    'renewed', true, 'slot', v_slot, 'token', v_token,
                    'guard', queen.lock_guard_v1(v_key, v_token));
            ELSE
                v_lost := true;
            END IF;

        ELSIF v_kind = 'release' THEN
            v_slot := (v_op ->> 'slot')::int4;
            v_key := v_name || '#' || v_slot;
            DELETE FROM queen.kv k
             WHERE k.tenant = p_tenant AND k.ns = 'queen-locks' AND k.key = v_key
               AND k.version = (v_op ->> 'token')::int8
               AND (k.expires_at IS NULL OR k.expires_at > v_now);
            IF FOUND THEN
                v_res := v_res || jsonb_build_object('released', true, 'slot', v_slot);
            ELSE
                v_lost := true;
            END IF;

        ELSE
            RAISE EXCEPTION 'locks_apply_v1: unknown op % at index %', quote_literal(v_kind), v_i
                USING ERRCODE = '22023';
        END IF;
        IF v_lost THEN
            -- a renew or release whose token is not the live permit's: who holds the slot now
            v_res := v_res || jsonb_build_object(
                CASE v_kind WHEN 'renew' THEN 'renewed' ELSE 'released' END, false,
                'reason', 'lost', 'slot', v_slot,
                'holders', (SELECT COALESCE(jsonb_agg(h), '[]') FROM jsonb_array_elements(
                                queen.lock_holders_v1(p_tenant, v_name, NULL, false, v_now))
                                AS h WHERE (h ->> 'slot')::int4 = v_slot));
        END IF;
        v_out[v_i + 1] := v_res;
    END LOOP;

    RETURN to_jsonb(v_out);
END
$$;
