-- 016_pop_queue_options.sql: a queue's options as a pop reads them, one definition for the
-- queue pop's scope statement and pop_scope_v5 (functions/pop.sql; issue 26).
--
-- Views: queen.pop_queue_options (new): every queue row with its pop options in the units the
--   pop uses (leaseTime 0 = 60 s, retryDelay and maxWaitTimeSeconds as intervals).
--
-- Why: a queue pop read its queue's options through pop_scope_v4(ARRAY[id], group), a plain
-- SQL function inlined into the statement: its "id = ANY (ids)" read the queue row a second
-- time after the (tenant, name) lookup, with a lateral subquery per queue. Read from this
-- view (the rewriter flattens it: no function, no second read) the statement cost
-- 38,000 instructions less a pop (bench/popsql.py --callgrind, PostgreSQL 15).

CREATE VIEW queen.pop_queue_options AS
SELECT q.id, q.tenant, q.name, q.namespace, q.task, q.priority,
       CASE WHEN q.lease_time = 0 THEN 60 ELSE q.lease_time END AS lease_time,
       q.delayed_processing AS delayed,
       q.window_buffer AS window_s,
       q.encryption_enabled AS encrypted,
       make_interval(secs => GREATEST(q.retry_delay, 0) / 1000.0) AS retry_delay,
       CASE WHEN q.max_wait_time_seconds > 0
            THEN make_interval(secs => q.max_wait_time_seconds) END AS max_wait
FROM queen.queues q;
