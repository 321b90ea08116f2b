-- 095_tenancy.sql: per-tenant views for what is published outside any tenant (api.md 1.5,
-- design.md invariant 8).
--
-- Functions:
--   queen.dlq_depth_v2() -> (tenant, queue_name, depth)
--       dead letters per (tenant, queue), for the queen_dlq_depth gauge. dlq_depth_v1 grouped
--       by name alone, so two tenants' queues of one name were summed into one label; the
--       broker now labels the default tenant's queues by name and folds every other tenant's
--       rows into one aggregate label, so the public /metrics never names another tenant's
--       queue (queen_mp/shards/housekeeping.py).
--
-- Tables touched: queen.log_dlq, queen.queues (read only).
-- Lock order: takes no row lock.
-- SQLSTATEs raised: none of its own.

CREATE FUNCTION queen.dlq_depth_v2()
RETURNS TABLE (tenant uuid, queue_name text, depth int8)
LANGUAGE sql STABLE
AS $$
    SELECT q.tenant, q.name::text, count(*)
    FROM queen.log_dlq d
    JOIN queen.queues q ON q.id = d.queue_id
    GROUP BY q.tenant, q.name
$$;
