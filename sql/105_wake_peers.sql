-- 105_wake_peers.sql: does any other broker instance listen for wake-ups?
--
-- Functions: queen.wake_peers_v1(text) -> boolean
--   true when a session of another instance LISTENs on queen_wake (its application_name is
--   'queen-mp wake listener <instance>', queen_mp/wakeup.py). A shard or front worker with no
--   peer skips its batched NOTIFY: that NOTIFY was a transaction every 5 ms per process under
--   load (most of the commits of a 1-item push benchmark), and each woke every listener
--   backend, for nobody. Asked again every couple of seconds, so a new instance is reached
--   within that delay (a pop parked meanwhile still ends at its deadline or lease hint).
-- Tables touched: pg_stat_activity (read). Lock order: none. SQLSTATEs raised: none.

CREATE FUNCTION queen.wake_peers_v1(p_instance text)
RETURNS boolean
LANGUAGE sql STABLE
AS $$
    SELECT EXISTS (
        SELECT 1 FROM pg_stat_activity
        WHERE application_name LIKE 'queen-mp wake listener %'
          AND application_name <> left('queen-mp wake listener ' || p_instance, 63))
$$;
