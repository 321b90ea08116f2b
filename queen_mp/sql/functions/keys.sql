-- keys.sql: the registry of payload encryption keys (schema/005_keys.sql).
-- Tables: queen.encryption_keys (read, INSERT, UPDATE).
-- Locks: transaction advisory lock (hashtext('queen.encryption_keys')), so that two instances
--   booting at once see each other's keys. SQLSTATEs raised: none (bad ids or fingerprints
--   fail the table's CHECKs: 23514).

-- encryption_keys_register_v1: an instance's boot step (queen_mp/db/key_procs.py).
--
--   p_instance  the instance's name (QUEEN_INSTANCE_ID or host:port)
--   p_create    the instance made a new random key (no key file yet) and asks to keep it
--   p_keys      [{"id", "fingerprint", "current"}]: its keys ([] with no key)
--
-- Answers {"created": bool, "known": [...]}: "known" the keys recorded BEFORE this call
-- ({"id", "fingerprint", "registeredBy", "registeredAt", "currentBy", "currentSince"}, oldest
-- first). With p_create and keys already known, nothing is recorded and "created" is false:
-- the instance must not start a key of its own. Otherwise its keys are recorded (a key already
-- known is marked seen; with "current", current_by names this instance, and no other key
-- keeps naming it) and "created" is
-- p_create. A key whose id is known under another fingerprint is left as it is (the caller
-- compares fingerprints and reports it).
CREATE OR REPLACE FUNCTION queen.encryption_keys_register_v1(p_instance text, p_create boolean,
                                                             p_keys jsonb)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_known jsonb;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('queen.encryption_keys'));
    SELECT COALESCE(jsonb_agg(jsonb_build_object(
               'id', key_id, 'fingerprint', fingerprint, 'registeredBy', registered_by,
               'registeredAt', registered_at, 'currentBy', current_by,
               'currentSince', current_since) ORDER BY registered_at, key_id), '[]'::jsonb)
      INTO v_known
      FROM queen.encryption_keys;
    IF p_create AND jsonb_array_length(v_known) > 0 THEN
        RETURN jsonb_build_object('created', false, 'known', v_known);
    END IF;
    INSERT INTO queen.encryption_keys AS e (key_id, fingerprint, registered_by, current_by,
                                            current_since, last_seen_by)
    SELECT k.id, k.fingerprint, p_instance,
           CASE WHEN k.current THEN p_instance END,
           CASE WHEN k.current THEN now() END, p_instance
      FROM jsonb_to_recordset(COALESCE(p_keys, '[]'::jsonb))
           AS k(id text, fingerprint text, current boolean)
    ON CONFLICT (key_id) DO UPDATE
       SET last_seen_by = EXCLUDED.last_seen_by, last_seen_at = now(),
           current_by = COALESCE(EXCLUDED.current_by, e.current_by),
           current_since = CASE WHEN EXCLUDED.current_by IS NULL THEN e.current_since
                                WHEN e.current_by IS NOT DISTINCT FROM EXCLUDED.current_by
                                     AND e.current_since IS NOT NULL THEN e.current_since
                                ELSE now() END
     WHERE e.fingerprint = EXCLUDED.fingerprint;
    -- current_by names an instance only on the key it encrypts with now
    UPDATE queen.encryption_keys
       SET current_by = NULL, current_since = NULL
     WHERE current_by = p_instance
       AND key_id NOT IN (SELECT k.id FROM jsonb_to_recordset(COALESCE(p_keys, '[]'::jsonb))
                                           AS k(id text, current boolean) WHERE k.current);
    RETURN jsonb_build_object('created', p_create, 'known', v_known);
END;
$$;
