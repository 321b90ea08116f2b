-- 020_system: instance-wide probes and flags.
-- Tables: queen.system_settings (read only here).
-- Locks: none. SQLSTATEs raised: none.

-- health_v1: the /health probe: one round trip that proves the database answers a query on
-- our schema and reports the maintenance flags every instance must honour.
CREATE OR REPLACE FUNCTION queen.health_v1()
RETURNS jsonb
LANGUAGE sql STABLE AS $$
    SELECT jsonb_build_object(
        'maintenance', COALESCE((SELECT (value #>> '{}')::boolean FROM queen.system_settings
                                  WHERE key = 'maintenance_mode'), false),
        'popMaintenance', COALESCE((SELECT (value #>> '{}')::boolean FROM queen.system_settings
                                     WHERE key = 'pop_maintenance_mode'), false),
        'inRecovery', pg_is_in_recovery(),
        'server', COALESCE(inet_server_addr()::text, 'local') || ':'
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
