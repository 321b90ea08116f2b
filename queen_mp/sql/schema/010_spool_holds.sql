-- 010_spool_holds.sql: which broker instances hold undrained spool records (issue 29, fault 8).
--
-- Tables: queen.spool_holds, one row per instance whose local disk spool holds records that
-- were answered `buffered` and are not stored yet. Written by that instance
-- (queen.spool_hold_v1, queen_mp/front/spoolhold.py): inserted before it answers the first
-- `buffered` of an episode, refreshed about once a second (expires_at) while records remain,
-- its oldest_at moved on as its drain progresses, deleted once the spool is drained. Read by
-- every instance (queen.spool_view_v1 and the queen_settings notifications): while another
-- live instance holds records, pushes are not stored directly, and a drain stores a record
-- only when no other live instance holds an older one, so a producer's items are stored in
-- the order they were accepted, whichever instance took each (up to the clock skew between
-- the instances' hosts: oldest_at is the broker host's clock).
--
-- A row whose expires_at has passed is ignored by every reader: an instance that died holding
-- records blocks the others for at most its TTL. Lock order: outside the partition / consumer
-- / kv / timer lock spaces; a write also takes the settings_version row of
-- queen.system_settings (its statement trigger), which orders it against maintenance switches.

CREATE TABLE queen.spool_holds (
    instance   text        PRIMARY KEY,  -- the holder: instance name and spool path
    oldest_at  timestamptz NOT NULL,     -- accept time of its oldest undrained record
    expires_at timestamptz NOT NULL,     -- ignored after this (server clock)
    episode    int8        NOT NULL,     -- accept time (Unix us) of the hold's first record:
                                         -- a withdrawal removes only the hold it ended
    buckets    int8[],                   -- per bucket of partitions (the drain's 64), the
                                         -- accept time (Unix us) of its oldest record there;
                                         -- NULL: oldest_at for every bucket
    updated_at timestamptz NOT NULL DEFAULT now()
);
