-- 099_health_host.sql: /health names the PostgreSQL host it reached as `address:port`.
--
-- Functions: queen.health_v1() -> jsonb, replaced (same signature and result keys as in
--   020_system.sql); `server` used inet_server_addr()::text, which renders a netmask
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
