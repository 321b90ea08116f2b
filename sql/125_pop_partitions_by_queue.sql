-- 125_pop_partitions_by_queue.sql: a pop reads its own queue's partition rows by index, whatever
-- the planner's statistics say.
--
-- Functions: queen.log_pop_v1(...) keeps its body (120_pop_by_queue.sql) and gains
-- enable_seqscan = off for its own statements.
--
-- Why: the pop joins queen.log_partitions on queue_id (cursor insert, candidate query, "nothing
-- claimable: when does a lease expire"). The planner cannot know which queue the scope's name
-- resolves to, so it estimates a queue's partitions as all partitions over the distinct queue
-- ids. Once ANALYZE has seen a few queues of very different sizes (autovacuum does that in
-- production; in the benchmark suite, after its push section left 1,000 partitions in one
-- queue), a hash join over a sequential scan of EVERY queue's partitions looks cheaper than the
-- (queue_id, name) index, and two statements of every pop read them all: with 1,200 partitions
-- in the database, a pop of a 10-partition queue spent 0.55 + 0.21 ms in those two statements,
-- 0.10 + 0.07 ms by index. No statement of the pop needs a sequential scan: every table it
-- reads is reached by a key (queues, consumer_groups_meta, log_partitions, log_consumers,
-- log_segments, system_settings), so the switch only takes away the plan that does not scale.

ALTER FUNCTION queen.log_pop_v1(uuid, text, text, text, text, text, int4, int4, boolean, text,
                                timestamptz, uuid, int4)
    SET enable_seqscan = off;
