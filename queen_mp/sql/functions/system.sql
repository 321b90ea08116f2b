-- system.sql: instance-wide probes and flags.
-- Tables: queen.system_settings (read only here).
-- Locks: none. SQLSTATEs raised: none.

-- health_v1: the /health probe: one round trip that proves the database answers a query on
-- our schema and reports the maintenance flags every instance must honour.

-- Revision (old migration 099_health_host.sql): /health names the PostgreSQL host it reached as `address:port`.
--
-- Functions: queen.health_v1() -> jsonb, replaced (same signature and result keys as in
--   system.sql); `server` used inet_server_addr()::text, which renders a netmask
--   ("127.0.0.1/32:5432"); host() gives the bare address, which is what an operator compares
--   with the hosts of a multi-host DSN after a failover.
-- Tables touched: queen.system_settings (read). Lock order: none. SQLSTATEs raised: none.

CREATE OR REPLACE FUNCTION queen.health_v1()
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'maintenance', COALESCE((SELECT (value #>> '{}')::boolean FROM queen.system_settings
                                  WHERE key = 'maintenance_mode'), false),
        'popMaintenance', COALESCE((SELECT (value #>> '{}')::boolean FROM queen.system_settings
                                     WHERE key = 'pop_maintenance_mode'), false),
        'inRecovery', pg_is_in_recovery(),
        'server', COALESCE(host(inet_server_addr()), 'local') || ':'
                  || COALESCE(inet_server_port()::text, current_setting('port')));
$$;

-- queue_flags_v1: per-queue switches the front worker needs before it builds frames
-- (encryption). Read-only; an unknown queue answers the defaults of a new queue.
CREATE OR REPLACE FUNCTION queen.queue_flags_v1(p_tenant uuid, p_name text)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'exists', q.id IS NOT NULL,
        'encryption', COALESCE(q.encryption_enabled, false))
    FROM (SELECT 1) AS one
    LEFT JOIN queen.queues q ON q.tenant = p_tenant AND q.name = p_name;
$$;

-- Revision (old migration 090_maintenance.sql): the maintenance switches of api.md 5 and how every instance learns of
-- a change at once.
--
-- Functions:
--   queen.maintenance_flags_v1() -> jsonb
--       {"maintenance": bool, "popMaintenance": bool, "version": int8}: the two switches and
--       the version of system_settings they were read at.
--   queen.set_maintenance_v1(text, boolean) -> jsonb
--       p_kind 'push' (maintenance_mode) or 'pop' (pop_maintenance_mode); sets the switch and
--       answers maintenance_flags_v1 as it is after the change, in the same transaction.
--   queen.settings_changed_v1() -> trigger
--       statement trigger of queen.system_settings: bumps settings_version and sends
--       NOTIFY queen_settings with the flags (the payload of maintenance_flags_v1, as text).
--
-- Every change of queen.system_settings, by set_maintenance_v1 or by a plain UPDATE, bumps the
-- 'settings_version' row and NOTIFYs channel queen_settings at commit. Front workers LISTEN on
-- it (queen_mp/ipc/wakeup.py) and keep the flags in shared memory (queen_mp/ipc/flags.py); the
-- version lets them drop a read that raced a newer change. A listener that missed a
-- notification (connection lost) re-reads maintenance_flags_v1 on reconnect and every second.
--
-- Tables touched:
--   queen.system_settings  UPDATE/INSERT of one switch row and of the settings_version row
--                          (row locks on those rows only, in that order; the version row lock
--                          serialises concurrent changes, so versions follow commit order)
-- Lock order: system_settings rows are outside the partition / consumer / kv / timer lock
--   spaces; nothing here locks anything else.
-- SQLSTATEs raised: 22023 for an unknown p_kind or a NULL p_enabled.

CREATE OR REPLACE FUNCTION queen.maintenance_flags_v1()
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'maintenance', COALESCE((SELECT (value #>> '{}')::boolean FROM queen.system_settings
                                  WHERE key = 'maintenance_mode'), false),
        'popMaintenance', COALESCE((SELECT (value #>> '{}')::boolean FROM queen.system_settings
                                     WHERE key = 'pop_maintenance_mode'), false),
        'version', COALESCE((SELECT (value #>> '{}')::int8 FROM queen.system_settings
                              WHERE key = 'settings_version'), 0));
$$;

CREATE OR REPLACE FUNCTION queen.settings_changed_v1()
RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    -- NOTE(sql): the version bump below is itself an UPDATE of this table; its own trigger
    -- call (depth 2) does nothing.
    IF pg_trigger_depth() > 1 THEN
        RETURN NULL;
    END IF;
    INSERT INTO queen.system_settings AS s (key, value, updated_at)
    VALUES ('settings_version', '1'::jsonb, now())
    ON CONFLICT (key) DO UPDATE
        SET value = to_jsonb(COALESCE((s.value #>> '{}')::int8, 0) + 1), updated_at = now();
    PERFORM pg_notify('queen_settings', (queen.maintenance_flags_v1() || queen.spool_holds_v1())::text);
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER system_settings_changed
    AFTER INSERT OR UPDATE OR DELETE ON queen.system_settings
    FOR EACH STATEMENT EXECUTE FUNCTION queen.settings_changed_v1();

-- Spool holds (schema/010_spool_holds.sql): the order of a producer's items across instances
-- while spools drain (docs/architecture.md, "Spool and order").
--
-- Functions:
--   queen.spool_holds_v1() -> jsonb
--       {"holds": [{"instance": holder, "oldestUs": int8}, ...]}: the live holds (expires_at
--       not passed), as every queen_settings notification carries them.
--   queen.spool_view_v2(p_instance text) -> jsonb
--       maintenance_flags_v1() || spool_holds_v1() || {"peers": bool}: what a front
--       worker's listener reads about once a second, in one snapshot, so an instance that
--       learns that maintenance ended learns in the same read who still holds records;
--       "peers" is whether another instance's wake listener is connected to this database
--       (wake_peers_v2; v1 also counted listeners of other databases of the server, which
--       made every front worker send NOTIFYs that reached nobody).
--   queen.spool_hold_v2(p_holder text, p_oldest_us int8, p_ttl_ms int, p_instance text,
--                       p_episode int8, p_buckets int8[]) -> jsonb
--       upserts the holder's row for hold p_episode (a write of an earlier episode than the
--       row's changes nothing), or with p_oldest_us NULL deletes it if its episode is not
--       later than p_episode (the withdrawal of an ended hold never removes the next one,
--       whatever order the two writes commit in); then answers spool_view_v2(p_instance)
--       read after the write, in a statement of its own, with "buckets": {holder: [int8]}
--       of the live holds that published them (p_buckets: the oldest per bucket of
--       partitions, a drain's; NULL keeps those of the same episode: what a drain published
--       only becomes conservative as it goes on). A holder is a spool directory
--       (instance name and path: the same across restarts, so a restarted instance takes its
--       row over); p_instance is the instance's wake prefix.
-- Each write changes queen.spool_holds, whose statement trigger (settings_changed_v1) bumps
-- settings_version and notifies queen_settings: so a hold and a maintenance switch are ordered
-- by the settings_version row lock, and an instance that reads "maintenance off" (from a
-- notification or a read) also sees every hold committed before that switch.
-- Tables touched: queen.spool_holds (one row), queen.system_settings (version row, by the
-- trigger). SQLSTATEs raised: 22023 for a NULL instance or a TTL below 1 ms.

CREATE OR REPLACE FUNCTION queen.spool_holds_v1()
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object('holds', COALESCE(jsonb_agg(jsonb_build_object(
               'instance', instance,
               'oldestUs', (extract(epoch FROM oldest_at) * 1000000)::int8)
               ORDER BY instance), '[]'::jsonb))
    FROM queen.spool_holds
    WHERE expires_at > now();
$$;

CREATE OR REPLACE FUNCTION queen.spool_view_v2(p_instance text)
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT queen.maintenance_flags_v1() || queen.spool_holds_v1()
           || jsonb_build_object('peers', queen.wake_peers_v2(p_instance));
$$;

CREATE OR REPLACE FUNCTION queen.spool_hold_v2(p_holder text, p_oldest_us int8,
                                               p_ttl_ms int, p_instance text, p_episode int8,
                                               p_buckets int8[])
RETURNS jsonb
LANGUAGE plpgsql AS $$
BEGIN
    IF p_holder IS NULL OR p_episode IS NULL OR p_ttl_ms IS NULL OR p_ttl_ms < 1 THEN
        RAISE EXCEPTION 'spool_hold_v2: holder, episode and a positive TTL are required'
            USING ERRCODE = '22023';
    END IF;
    IF p_oldest_us IS NULL THEN
        DELETE FROM queen.spool_holds WHERE instance = p_holder AND episode <= p_episode;
    ELSE
        INSERT INTO queen.spool_holds AS h (instance, oldest_at, expires_at, episode,
                                            buckets, updated_at)
        VALUES (p_holder, to_timestamp(p_oldest_us / 1000000.0),
                now() + make_interval(secs => p_ttl_ms / 1000.0), p_episode, p_buckets, now())
        ON CONFLICT (instance) DO UPDATE
            SET oldest_at = EXCLUDED.oldest_at, expires_at = EXCLUDED.expires_at,
                episode = EXCLUDED.episode, updated_at = now(),
                -- a heartbeat (no buckets) keeps those of its own hold
                buckets = CASE WHEN EXCLUDED.buckets IS NOT NULL THEN EXCLUDED.buckets
                               WHEN h.episode = EXCLUDED.episode THEN h.buckets END
            WHERE h.episode <= EXCLUDED.episode;
    END IF;
    -- NOTE(sql): a statement of its own, so its snapshot comes after the version row lock the
    -- trigger took: a maintenance switch committed before this hold is seen here.
    RETURN queen.spool_view_v2(p_instance) || jsonb_build_object('buckets', COALESCE(
        (SELECT jsonb_object_agg(instance, to_jsonb(buckets)) FROM queen.spool_holds
         WHERE expires_at > now() AND buckets IS NOT NULL), '{}'::jsonb));
END
$$;

CREATE OR REPLACE TRIGGER spool_holds_changed
    AFTER INSERT OR UPDATE OR DELETE ON queen.spool_holds
    FOR EACH STATEMENT EXECUTE FUNCTION queen.settings_changed_v1();

CREATE OR REPLACE FUNCTION queen.set_maintenance_v1(p_kind text, p_enabled boolean)
RETURNS jsonb
LANGUAGE plpgsql AS $$
DECLARE
    v_key text;
BEGIN
    IF p_enabled IS NULL THEN
        RAISE EXCEPTION 'set_maintenance_v1: p_enabled must not be NULL' USING ERRCODE = '22023';
    END IF;
    v_key := CASE p_kind WHEN 'push' THEN 'maintenance_mode'
                         WHEN 'pop' THEN 'pop_maintenance_mode' END;
    IF v_key IS NULL THEN
        RAISE EXCEPTION 'set_maintenance_v1: unknown kind %', p_kind USING ERRCODE = '22023';
    END IF;
    -- The statement trigger bumps settings_version and NOTIFYs queen_settings (delivered at
    -- commit), also when the value does not change: a repeated switch re-announces the state.
    -- NOTE(sql): UPDATE, then INSERT only when the row is missing: INSERT ... ON CONFLICT DO
    -- UPDATE would fire both the INSERT and the UPDATE statement triggers (two bumps).
    UPDATE queen.system_settings SET value = to_jsonb(p_enabled), updated_at = now()
    WHERE key = v_key;
    IF NOT FOUND THEN
        INSERT INTO queen.system_settings (key, value) VALUES (v_key, to_jsonb(p_enabled));
    END IF;
    RETURN queen.maintenance_flags_v1();
END
$$;

-- Does any other broker instance listen for wake-ups on this database?
--
-- Functions: queen.wake_peers_v2(text) -> boolean
--   true when a session of another instance, connected to the current database, LISTENs on
--   queen_wake (its application_name is 'queen-mp wake listener <instance>',
--   queen_mp/ipc/wakeup.py). A shard or front worker with no peer skips its batched NOTIFY:
--   that NOTIFY was a transaction every 5 ms per process under load (most of the commits of a
--   1-item push benchmark), and each woke every listener backend, for nobody. Asked again
--   every couple of seconds, so a new instance is reached within that delay (a pop parked
--   meanwhile still ends at its deadline or lease hint). v1 also counted listeners of other
--   databases of the server, which a NOTIFY never reaches.
-- Tables touched: pg_stat_activity (read). Lock order: none. SQLSTATEs raised: none.

CREATE OR REPLACE FUNCTION queen.wake_peers_v2(p_instance text)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_stat_activity
        WHERE datname = current_database()
          AND application_name LIKE 'queen-mp wake listener %'
          AND application_name <> left('queen-mp wake listener ' || p_instance, 63))
$$;

-- server_info_v1: what the console's System page and GET /api/v1/status/system show of the
-- PostgreSQL server the broker uses (docs/api.md 5.2).
--
-- Functions: queen.server_info_v1() -> jsonb
--   {"version", "versionNum", "startedAt", "inRecovery", "database", "databaseBytes",
--    "maxConnections", "connections": {"total", "active", "idle", "idleInTransaction",
--    "queenMp"}, "replication": [{"name", "clientAddr", "state", "syncState",
--    "replayLagSeconds"}]}
--   Connections are the server's client backends (every database); "queenMp" those whose
--   application_name the broker set ('queen-mp ...', queen_mp/db/pooled.py). Replication lists
--   pg_stat_replication: empty on a standby or without replicas, and without a
--   superuser or pg_monitor role the address and lag read as null.
-- Tables touched: pg_stat_activity, pg_stat_replication (read). Lock order: none.
-- SQLSTATEs raised: none.

CREATE OR REPLACE FUNCTION queen.server_info_v1()
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'version', current_setting('server_version'),
        'versionNum', current_setting('server_version_num')::int,
        'startedAt', pg_postmaster_start_time(),
        'inRecovery', pg_is_in_recovery(),
        'database', current_database(),
        'databaseBytes', pg_database_size(current_database()),
        'maxConnections', current_setting('max_connections')::int,
        'connections', (
            SELECT jsonb_build_object(
                'total', count(*),
                'active', count(*) FILTER (WHERE state = 'active'),
                'idle', count(*) FILTER (WHERE state = 'idle'),
                'idleInTransaction', count(*) FILTER (WHERE state LIKE 'idle in transaction%'),
                'queenMp', count(*) FILTER (WHERE application_name LIKE 'queen-mp%'))
            FROM pg_stat_activity WHERE backend_type = 'client backend'),
        'replication', COALESCE((
            SELECT jsonb_agg(jsonb_build_object(
                'name', application_name, 'clientAddr', host(client_addr), 'state', state,
                'syncState', sync_state,
                'replayLagSeconds', extract(epoch FROM replay_lag)::float8)
                ORDER BY application_name)
            FROM pg_stat_replication), '[]'::jsonb));
$$;
