-- pop.sql: the pop path (api.md 2.2, 2.6; life-of-a-step.md "Pop").
--
-- Functions:
--   queen.log_cursor_before_v1(int8, timestamptz) -> int8
--       the cursor value whose next delivery is the first message created at or after a time
--       (NULL time = the log start): first starts, seeks and subscriptions share it.
--   queen.log_pending_at_v1(int8, int8) -> timestamptz
--       created_at of the segment holding an offset (the ready index's and the claim's time).
--   queen.log_ready_at_v1(int8, int8, int8, timestamptz) -> timestamptz
--       the ready index's flag of a cursor at a committed offset; every writer that moves a
--       cursor sets it (the protocol that keeps it true is written at the function).
--   queen.pop_scope_ids_v2(uuid, text, text) -> int8[]: the queues a discovery pop may claim.
--   queen.pop_scope_v5(int8[], text) -> table: those queues' options and the group's start.
--   queen.log_pop_v3(uuid, text, text, text, text, text, int4, int4, boolean, text,
--                    timestamptz, uuid, int4) -> SETOF rows (below)
--       claim partitions for a group, lease (or auto-ack) them and return the covering
--       segments, all in the caller's one statement / transaction.
--   queen.log_renew_lease_v1(uuid, uuid, int4) -> (renewed, expires_at)
--       lease extend: every live lease of one lease id, never shortened.
--
-- Tables touched:
--   queen.queues                read (tenant, name / namespace / task, options)
--   queen.system_settings       read (pop_maintenance_mode)
--   queen.log_partitions        read (never waited for: pops must not queue behind pushes)
--   queen.consumer_groups_meta  INSERT ... ON CONFLICT DO NOTHING (the group's first start)
--   queen.queues                FOR UPDATE of the queues where this pop records a first start
--                               (group_start_v1, groups.sql), nothing otherwise
--   queen.log_consumers         INSERT the cursor rows of a first start (group_start_v1);
--                               read by the ready index; SELECT ... FOR UPDATE SKIP LOCKED;
--                               UPDATE lease / cursor columns, and ready_at where the cursor
--                               moves (log_ready_at_v1)
--   queen.log_segments          read (covering segments of each claim; delay cut-off)
--
-- Lock order (design.md invariant 4): no log_partitions row lock, except the FOR SHARE ...
--   SKIP LOCKED (never waits) that log_pop_v3 takes when an autoAck claim takes a partition's
--   last message, and log_ready_at_v1 when a settled flag finds the cursor caught up. A first start locks its queue rows, then
--   inserts the cursor rows in ascending partition id order (a speculative insertion may wait
--   for another transaction inserting the same key; the ascending order keeps those waits
--   acyclic). Existing cursor rows are then locked with SKIP LOCKED, which never waits, so a
--   pop can neither block another pop nor deadlock with an ack, a seek or a transaction.
--
-- SQLSTATEs raised:
--   22023  invalid_parameter_value: batch < 1, max_partitions < 1, unknown subscription mode,
--          neither queue nor namespace/task given
--   P0002  no_data_found: a claim's cursor row, locked by the pop, was not found by its ctid
--          (its UPDATE ... INTO STRICT)
--
-- Isolation: READ COMMITTED. log_partitions.last_offset is read without a lock: a push's offsets
--   become visible only at its commit, and one partition's pushes commit in offset order (one
--   allocator row lock), so every offset <= a visible last_offset is committed.
--
-- log_pop_v3 result rows. One row per covering segment of each claim, claims in claim order,
-- segments ascending; a claim whose segments were all retained away has one row with NULL
-- segment columns. When nothing was claimed, exactly ONE hint row with partition_id NULL:
-- wake_in_ms = milliseconds until a currently blocked partition becomes claimable (a live
-- lease expiring, a delayed message maturing, a window buffer closing), NULL if none is known.
--   queue_name, partition_id, partition_name, start_off, end_off (inclusive), attempt
--   (deliveryAttempt), lease_expires_at (NULL under autoAck), encrypted (queue option),
--   base_offset, created_at, payload (the stored chunks, as stored), wake_in_ms

-- ---------------------------------------------------------------------------------------------
-- log_cursor_before_v1: segments are created_at-monotone per partition in offset order, so the
-- first segment at or after p_from is one forward walk of the primary key.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_cursor_before_v1(p_partition_id int8, p_from timestamptz)
RETURNS int8
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_last  int8;
    v_start int8;
    v_base  int8;
BEGIN
    SELECT lp.last_offset, lp.log_start_offset INTO v_last, v_start
    FROM queen.log_partitions lp WHERE lp.id = p_partition_id;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    IF p_from IS NULL THEN
        RETURN v_start - 1;
    END IF;
    SELECT s.base_offset INTO v_base
    FROM queen.log_segments s
    WHERE s.partition_id = p_partition_id AND s.created_at >= p_from
    ORDER BY s.base_offset
    LIMIT 1;
    IF v_base IS NULL THEN
        RETURN v_last;
    END IF;
    RETURN GREATEST(v_base - 1, v_start - 1);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- log_pending_at_v1: created_at of the segment holding p_offset (NULL if none is stored), one
-- backward probe of the primary key. plpgsql, so the probe's plan is cached per session (an
-- SQL function with a subquery is not inlined, and was planned anew at every call: 30 us a
-- row). log_ready_at_v1 and the pop's next-message time share it; set-based statements
-- (group_start_v1, the repair) write the same probe as a LATERAL subquery.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_pending_at_v1(p_partition_id int8, p_offset int8)
RETURNS timestamptz
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $$
BEGIN
    RETURN (SELECT s.created_at FROM queen.log_segments s
            WHERE s.partition_id = p_partition_id AND s.base_offset <= p_offset
            ORDER BY s.base_offset DESC LIMIT 1);
END
$$;

-- ---------------------------------------------------------------------------------------------
-- log_ready_at_v1: the ready_at a cursor of partition p_pid must carry once its committed_offset
-- is p_committed (schema/002_ready_index.sql): the created_at of its oldest pending message,
-- NULL when it has consumed everything. Every writer that moves committed_offset (or clears
-- the flag) sets ready_at to this in the same UPDATE, after it locked the cursor row: pop.sql
-- (autoAck claim, settle), ack.sql (every ack procedure, the lease-less first touch),
-- groups.sql (subscription, seek, start), admin.sql (purge). next_offset/next_created_at are
-- the cursor's claim record (below): when the claim that recorded them is what was consumed,
-- the answer is that time without a partition read; pass NULLs to have it looked up.
--
-- The protocol that makes NULL safe (the pop would never find a NULL cursor with data):
--   1. NULL is returned only while this transaction holds the partition row FOR SHARE (taken
--      with SKIP LOCKED: never waits), having read last_offset from the row it locked (READ
--      COMMITTED locks and returns the newest committed version).
--   2. An allocator holds the partition row FOR UPDATE / FOR NO KEY UPDATE (both conflict
--      with FOR SHARE) from before it writes offsets until it commits, and then, in a
--      statement whose snapshot was taken after it got the lock, sets ready_at on every
--      cursor of the partition that is NULL and behind the new last_offset (push.sql: the
--      allocator UPDATE's own statement in log_push_multi_v3, which locked the rows in an
--      earlier one; the statement after the UPDATE in log_push_one_v1). The allocators are
--      the only writers of last_offset.
--   So a NULL committed before the allocator took the row is seen by its later statement and
--   set; a NULL cannot be committed while the allocator holds the row (1 skips, and answers a
--   time instead); a cursor writer the allocator's UPDATE finds holding a NULL row is waited
--   for and re-checked. A time while nothing is pending is allowed (a pop that finds so
--   settles it through here). A missing partition (being deleted) answers a time too.
-- The claim record: next_created_at is the created_at of the segment holding next_offset
--   (a stored segment never changes, an offset is never reused), so next_offset =
--   p_committed + 1 with a time means that message was pending; if retention removed it
--   since, the time is older than the real head (never younger: the pop's maxWait test
--   relies on that) and non-NULL, which is safe.
-- Lock order: the allocators wait for consumer rows while holding partition rows (the global
--   order); this holds a consumer row and never waits for a partition.
-- Why not a trigger (issue 26, cons8): log_consumers_ready, a BEFORE row trigger, did this
--   for every writer; its plpgsql call and partition read cost ~89k instructions an ack
--   (bench/popsql.py), where the claim record answers from the locked row.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_ready_at_v1(p_pid int8, p_committed int8,
                                                 p_next_offset int8, p_next_at timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    v_last int8;
    v_from int8;
    v_off  int8;
BEGIN
    IF p_next_at IS NOT NULL AND p_next_offset = p_committed + 1 THEN
        RETURN p_next_at;
    END IF;
    SELECT lp.last_offset, lp.log_start_offset INTO v_last, v_from
    FROM queen.log_partitions lp WHERE lp.id = p_pid;
    IF NOT FOUND THEN
        RETURN clock_timestamp();
    END IF;
    v_off := GREATEST(p_committed + 1, v_from);
    IF v_off > v_last THEN
        -- Caught up as far as this snapshot sees: NULL only under the partition's FOR SHARE.
        SELECT lp.last_offset, lp.log_start_offset INTO v_last, v_from
        FROM queen.log_partitions lp WHERE lp.id = p_pid
        FOR SHARE SKIP LOCKED;
        IF NOT FOUND THEN
            RETURN clock_timestamp();  -- an allocator holds it: data may be arriving
        END IF;
        v_off := GREATEST(p_committed + 1, v_from);
        IF v_off > v_last THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN COALESCE(queen.log_pending_at_v1(p_pid, v_off), clock_timestamp());
END
$$;

-- ---------------------------------------------------------------------------------------------
-- pop_scope_ids_v2: the ids of the queues a discovery pop (namespace and/or task) may claim
-- from, ascending. One statement per kind of scope, each a key lookup in its generic plan:
-- log_pop_v3 runs cached generic plans (below), and a generic plan of one statement with every
-- filter optional ("p_namespace IS NULL OR q.namespace = p_namespace") reads every queue of the
-- tenant. (v1 took the queue name too: a queue pop reads its one queue in its own scope
-- statement now.)
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.pop_scope_ids_v2(p_tenant uuid, p_namespace text, p_task text)
RETURNS int8[]
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v_ids int8[];
BEGIN
    IF p_namespace IS NOT NULL THEN  -- queues_tenant_namespace_task_idx
        SELECT array_agg(q.id ORDER BY q.id) INTO v_ids
        FROM queen.queues q
        WHERE q.tenant = p_tenant AND q.namespace = p_namespace
          AND (p_task IS NULL OR q.task = p_task);
    ELSE  -- queues_tenant_task_idx
        SELECT array_agg(q.id ORDER BY q.id) INTO v_ids
        FROM queen.queues q
        WHERE q.tenant = p_tenant AND q.task = p_task;
    END IF;
    RETURN COALESCE(v_ids, '{}');
END
$$;

-- ---------------------------------------------------------------------------------------------
-- pop_scope_v5: the options of the queues of a discovery pop's scope, and the group's recorded
-- start on each (sub_mode NULL = not recorded yet; started: its cursor rows exist, schema/002).
-- Plain SQL, so the planner inlines it into each caller. (v2 took the scope's filters and
-- applied them here; v3 had no retry delay and no max wait: issue 27, both read from the queue
-- row the pop reads anyway; v4 computed the options itself, now schema/016's view, which a
-- queue pop reads directly.) The record is a LATERAL primary key probe per queue: as a plain
-- join, the pop's generic plans read every record of the group name (on every queue, its
-- group index) into a Materialize and filtered them by queue.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.pop_scope_v5(p_ids int8[], p_group text)
RETURNS TABLE (id int8, name text, priority int4, lease_time int4, delayed int4, window_s int4,
               encrypted boolean, sub_mode text, sub_from timestamptz, started boolean,
               retry_delay interval, max_wait interval)
LANGUAGE sql STABLE
AS $$
    SELECT q.id, q.name, q.priority, q.lease_time, q.delayed, q.window_s, q.encrypted,
           m.subscription_mode, m.subscription_from, m.started, q.retry_delay, q.max_wait
    FROM queen.pop_queue_options q
    LEFT JOIN LATERAL (SELECT m.subscription_mode, m.subscription_from, m.started
                       FROM queen.consumer_groups_meta m
                       WHERE m.queue_id = q.id AND m.consumer_group = p_group
                       OFFSET 0) m ON true
    WHERE q.id = ANY (p_ids)
$$;

-- ---------------------------------------------------------------------------------------------
-- log_pop_v3 (the claim and its segments: see "log_pop_v3 result rows" above)
--   p_tenant          tenant of the caller
--   p_queue           queue name; NULL for a namespace/task pop
--   p_partition       partition name (the partition route); NULL = any partition
--   p_namespace       namespace filter of a discovery pop (NULL = any)
--   p_task            task filter of a discovery pop (NULL = any)
--   p_group           consumer group ('__QUEUE_MODE__' for queue mode)
--   p_batch           max messages in total across claims (>= 1)
--   p_max_partitions  max partitions claimed (>= 1)
--   p_auto_ack        advance the cursor at delivery, no lease
--   p_sub_mode        'all' | 'new' | 'new-only' | 'timestamp': the group's first start,
--                     recorded once per (queue, group); later values are ignored
--   p_sub_from        the start time for 'timestamp' (and 'new': NULL = now())
--   p_lease_id        the lease id minted by the broker for this pop (NULL under autoAck)
--   p_claim_ms        no claim starts later than this many ms after the call began (the
--                     caller's deadline minus its margin, as a duration: clocks may differ)
-- ---------------------------------------------------------------------------------------------

-- Revision (old migration 120_pop_by_queue.sql): a pop reads the cursors of its own queue's partitions only.
--
-- Functions: queen.log_pop_v1(...) replaced (same signature, result, locks, lock order and
-- SQLSTATEs as in pop.sql; only two statements are written differently).
--
-- Why: 030 joined log_consumers on (partition, group) in the candidate query and in the
-- "nothing claimable: when does a lease expire" query, and the planner drove both from
-- log_consumers_group_idx: every cursor of the group on EVERY queue, joined back to the
-- queue's partitions. A group name shared by several queues (a common deployment: one
-- "workers" group everywhere) made each pop pay for all of them: a pop of a 100-partition
-- queue took 1.4-1.7 ms of PostgreSQL alone and 2.6-3.3 ms once another queue had 1,000
-- cursors of the same group. Here each partition's cursor is a LATERAL primary-key lookup
-- (OFFSET 0 keeps the planner from flattening it back into a join), so the cost follows the
-- queue's own partitions: the candidate query went from 1.4-1.8 to 0.4-0.7 ms in that case
-- (3.2 -> 3.4 ms for the 1,000-partition queue itself, which owns nearly all of the group's
-- cursors).

-- Revision (old migration 125_pop_partitions_by_queue.sql): a pop reads its own queue's partition rows by index, whatever
-- the planner's statistics say.
--
-- Functions: queen.log_pop_v1(...) replaced (same signature, result, locks, lock order and
-- SQLSTATEs as in pop.sql; three statements are written differently, and the
-- function runs with enable_seqscan = off).
--
-- Why: 120 joined queen.log_partitions on queue_id in the cursor insert, the candidate query and
-- the "nothing claimable: when does a lease expire" query. The planner cannot know which queue
-- the scope's name resolves to, so once ANALYZE or VACUUM has seen queues of very different
-- sizes (autovacuum does that in production; in the benchmark suite, after its push section
-- left 1,000 partitions in one queue) it joins a scan of EVERY queue's partitions: a sequential
-- scan after ANALYZE, a full index scan once the sequential one is disabled. Each queue's
-- partitions are now a LATERAL subquery on (queue_id = the queue) that OFFSET 0 keeps the
-- planner from flattening back into a join, and enable_seqscan = off leaves the
-- (queue_id, name) index as its only sensible path: the cost follows the queue's own
-- partitions again, as 120 did for the cursors; the cursor insert's "no cursor yet" test is a
-- LATERAL primary-key probe too (an anti-join over the index scan of the group's cursors on
-- every queue read them all once sequential scans were off). No statement of the pop needs a sequential
-- scan: every table it reads is reached by a key (queues, consumer_groups_meta,
-- log_partitions, log_consumers, log_segments, system_settings).

-- Revision (old migration 130_pop_candidate_order.sql): a pop orders its candidates without reading a segment per
-- partition, and creates missing cursor rows in the statement that finds its candidates.
--
-- Tables: queen.log_consumers gains next_offset and next_created_at (both NULL until a claim).
-- Functions: queen.log_pop_v1(...) replaced (same signature, result, locks, lock order and
-- SQLSTATEs as in pop.sql).
--
-- Why: every pop of a queue ran two passes over all of the queue's partitions: the cursor
-- insert probed each partition's cursor to find the missing ones, and the candidate query
-- probed it again, then read one log_segments row per candidate for the created_at of its
-- oldest pending message (the order api.md 2.2 promises). On a 100-partition queue drained
-- by 8 consumers (pg_stat_statements, private cluster) that was 0.44 ms of insert and 1.68 ms
-- of candidate query in a 3.8 ms pop; EXPLAIN ANALYZE put 1.0 ms of the candidate query in
-- the segment reads.
--
-- The oldest pending message of a cursor is the one at committed_offset + 1, unless retention
-- removed it (then log_start_offset). A claim of [start, end] now records the created_at of
-- the segment holding end + 1 (next_created_at at next_offset): a partition's offsets are
-- never reused and a stored segment never changes, so that pair stays true for as long as it
-- exists. Once the claim is acked, committed_offset + 1 = next_offset and the candidate query
-- takes the time from the cursor row it reads anyway; any other move of the cursor (a partial
-- ack, a lease expiry, a seek, a DLQ hand-off, retention) leaves them unequal and the segment
-- is read as before, as it is when the claim reached the partition's end (nothing to record).
-- No writer of committed_offset has to know about the two columns.
--
-- The missing cursor rows come from the candidate scan's own LEFT JOIN: a data-modifying
-- WITH inserts them (ascending partition id, before any cursor is locked or updated, as
-- before), and a plpgsql FOR loop runs such a statement to completion before its first row.
-- A candidate whose row another pop created meanwhile is locked by the loop as usual.

-- Revision (issue 26, schema/002_ready_index.sql): a pop walks the ready index instead of every
-- partition of its queue.
--
-- Why: every statement above read every partition of the queue and its cursor to find the
-- candidates, about 3.6 us a partition: 18 ms a pop at 5,000 partitions, 275 ms at 50,000
-- (bench/partitions.py). Now a queue pop opens a cursor on log_consumers_ready_idx (queue,
-- group, ready_at, partition): the candidates come in api.md 2.2's order (oldest pending
-- message first) straight from the index, and the walk stops at its last claim, so a pop
-- reads a few index entries whatever the queue's size. A discovery pop (namespace/task)
-- orders the ready cursors of its queues (one sort over the pending partitions of the scope,
-- not over every partition). The cursor rows exist from the group's first start on
-- (group_start_v1, and the log_partitions insert trigger for partitions created later), so
-- the pop no longer creates them as it finds data. The wake-up time of an answer with no
-- claim comes from the same walk (it visits every ready cursor when it claims nothing).
-- A listed cursor found caught up is settled (ready_at := NULL through log_ready_at_v1).

-- Revision (issue 26, bench/popsql.py): a queue pop reads its one queue's scope row once.
--
-- Why: the group's first start asked pop_scope_v4 which queues of the scope had not started
-- (an aggregate over the scope), and a queue pop then read the same row again for its options:
-- two statements, each with its executor start, for what one row answers. A queue pop now reads
-- the row once (options and started) before the start; a discovery pop keeps the aggregate.
-- The answer of a pop with one claim (every partitions=1 pop) reads that claim's partition
-- and segments by key, without the unnest of the claim arrays and the sort by claim that
-- several claims need: 1,047,691 -> 992,541 instructions a pop of 100.

-- Revision (issue 26): a pop runs cached generic plans (plan_cache_mode = force_generic_plan).
--
-- Why: under the default mode PostgreSQL planned several of the pop's statements anew at every
-- call (their generic plans looked dearer: the claims' unnest, the scope's optional filters).
-- A one-message autoAck pop of a 10-partition queue cost its backend 1.26 ms of CPU, 0.70 ms
-- with generic plans (the same pop over psycopg, /proc CPU of the backend, a loaded machine).
-- The scope's queues are now found first by pop_scope_ids_v1, one key lookup per kind of
-- scope, so no generic plan reads every queue of a tenant; pop_scope_v3 (now v4) takes their
-- ids.
-- A generic plan does not know how many claims the final statement unnests, nor how many
-- queues a scope's id array holds; in one full test run a pop read 603 partition rows where
-- 20 are expected (test_pop's "after analyze" case; not reproduced in isolation). Every
-- statement of the pop is a walk of keys, so its joins are nested loops whatever a plan's row
-- guesses (enable_hashjoin and enable_mergejoin off, as enable_seqscan already was).

-- Revision (issue 26, schema/014_lease_table.sql): a leasing pop writes its lease's row in
-- queen.log_leases, and log_consumers.lease_id is no longer indexed.
--
-- Why: the claim's update wrote an indexed column, so it was never HOT: every index of
-- log_consumers got an entry per claim. Renewal and requiredLeases find a lease's cursors by
-- its row now. bench/popsql.py --callgrind: 906,571 -> 826,703 instructions a pop (the row's
-- insert included), 398,737 -> 409,324 an ack (which deletes a one-partition lease's row);
-- then fewer plpgsql expressions a call (each is initialized anew in every transaction):
-- 796,728 a pop.

-- Revision (issue 26, pgcons10; schema/016_pop_queue_options.sql): fewer statements, index
-- scans and plpgsql expressions a queue pop.
--
-- Why: a pop of 100 cost PostgreSQL 797,226 instructions (bench/popsql.py --callgrind), most
-- of it executor start-up (index scans opened, ~13,000 instructions each) and expressions
-- initialized anew in each transaction (~2,500 each). A queue pop now reads the maintenance
-- flag, its queue's options (the view, no second read through pop_scope_v4's "id = ANY") and
-- the group's record in one statement, without pop_scope_ids_v1's call (770,454, then 656,587
-- with the view); the next segment's time is a statement, not log_pending_at_v1's call
-- (763,995); the tests of the good path are one IF each where several were, the claims are one
-- int8[] of four numbers a claim, the deadline and now() are read where used, not kept in
-- variables, and the claim's UPDATE returns its expiry INTO STRICT (its guard) (695,464).
-- Tried and dropped (same command): the partition row joined into the candidate cursor
-- (+9,500 a pop); the next segment's time as a subquery of the locking SELECT (+25,000: SQL
-- expressions under FOR UPDATE cost more than plpgsql assignments, as start, end and attempt
-- computed there did, +6,700) or of the claim's UPDATE (-1,300, a second copy of the probe);
-- the lease's row as an INSERT ... ON CONFLICT CTE of the claim (+12,000 against its own
-- INSERT).

-- Revision (issue 26, pgcons11; schema/019_claim_record_base.sql): log_pop_v2 replaces
-- log_pop_v1 (same arguments; its rows carry a claim's columns once, not on every segment).
--
-- Why: a pop of 100 cost PostgreSQL 658,734 instructions (bench/popsql.py --callgrind). The
-- segments' rows repeated the claim's eight columns, each sent by its type's send function:
-- a first row with them, then the segments without them: 646,985. The result columns are the
-- walk's own variables (the candidate read into queue_name, partition_id, encrypted; the
-- partition into partition_name; start_off, end_off, attempt, lease_expires_at assigned where
-- v_start .. v_expires were), so a lone claim's first row is RETURN NEXT, no statement, and the
-- candidate is plain variables, not a record's fields: 622,745. The answer's subquery for the
-- segment holding start_off (a max() probe: 42,000 instructions, the dearest part of the pop)
-- is read from the claim record when the previous claim ended just before it, a probe of its
-- own otherwise (33,000): 627,584 a pop that finds no record (each of --partitions 100's pops
-- claims a partition for the first time), 760,612 -> 673,008 one that does (--partitions 4).
-- Tried and dropped (same command): the candidate cursor locking its rows (FOR UPDATE SKIP
-- LOCKED, no locking SELECT of its own): +4,000; the first candidate read by a SELECT ... LIMIT 1
-- and no cursor for a lone claim: -5,400 before the tests it needs, not kept; the function's
-- four SET options cost 17,400 a pop (fmgr_security_definer), they are what keeps its plans
-- generic and keyed, and are kept.
-- Revision (issue 26, pgpop12): pgcons11's log_pop_v2 was merged and reverted (e2e p99 6-8 ->
-- 10.5-13.5 ms). Its walk stopped at 4 * p_max_partitions numbers of the claims array, four
-- a claim before, five since: a pop of partitions >= 5 claimed fewer partitions than asked
-- (8 of 10 for the e2e consumer's partitions=10), and the rest waited for the next pop. Now
-- 5 * p_max_partitions (test_pop's test_partitions_claims_as_many_partitions_as_asked); the
-- claim record's column is schema/019 (pgcons11's 017, renumbered). The SET options again
-- (bench/popsql.py --callgrind, same command): 658,694 a pop with them, 649,345 with
-- plan_cache_mode alone, 636,684 without any (a fixed ~12,700 for having SET clauses at all),
-- 671,991 with set_config(..., true) calls instead; without them a generic plan reads a
-- group's 40 cursors on another queue (test_a_pop_reads_the_cursors_of_its_own_queue_only:
-- 42 rows read, < 10 asked). Kept, as pgcons11 concluded.

-- Revision (issue 26, pop15): log_pop_v3 replaces log_pop_v2 (same arguments and rows). An
-- autoAck claim that takes its partition's last message (a drain: the cursor's ready_at goes
-- NULL, a non-HOT update) decided that NULL through log_ready_at_v1: a plpgsql call, an
-- unlocked read of the partition the walk had just read, then its FOR SHARE SKIP LOCKED read.
-- Now the claim takes that locked read itself and answers as log_ready_at_v1 would (NULL only
-- under the lock; an allocator holding the row: a time, the flag stays; a push committed since
-- the walk's read: its time), and a claim to the end runs no claim-record statement (it found
-- nothing there: no segment past the last offset). PostgreSQL instructions a one-message
-- autoAck pop (callgrind, private cluster, autovacuum off; 20 pops subtracted from 220): drain
-- of 1,000 one-message partitions 922,194 -> 856,263, of 3,000 after 2,500 drained 984,342
-- -> 918,147; pops of 10 partitions that keep messages (HOT) 728,000 -> 726,787.
-- What stays of a drain pop's extra over a HOT one (+190k): the non-HOT update's entries in
-- the primary key and log_consumers_group_idx (43k), and the candidate walk over the entries
-- of the cursors drained before (the old versions' entries in log_consumers_ready_idx, dead
-- and marked so by the scans, but left in their leaf pages until VACUUM: +62k a pop after
-- 2,500 drained, 35 buffers for the first candidate 200 pops before the end of a 5,000 drain).
CREATE OR REPLACE FUNCTION queen.log_pop_v3(
    p_tenant         uuid,
    p_queue          text,
    p_partition      text,
    p_namespace      text,
    p_task           text,
    p_group          text,
    p_batch          int4,
    p_max_partitions int4,
    p_auto_ack       boolean,
    p_sub_mode       text,
    p_sub_from       timestamptz,
    p_lease_id       uuid,
    p_claim_ms       int4
) RETURNS TABLE (
    queue_name       text,
    partition_id     int8,
    partition_name   text,
    start_off        int8,
    end_off          int8,
    attempt          int4,
    lease_expires_at timestamptz,
    encrypted        boolean,
    base_offset      int8,
    created_at       timestamptz,
    payload          bytea,
    wake_in_ms       int8
)
LANGUAGE plpgsql VOLATILE PARALLEL UNSAFE
SET enable_seqscan = off
SET enable_hashjoin = off
SET enable_mergejoin = off
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_scope_ids  int8[];        -- the queues of a discovery pop's scope (pop_scope_ids_v2)
    v_left       int4 := p_batch;
    v_queue_id   int8;          -- a discovery pop serves one queue per answer
    v_wake       timestamptz;
    v_started    int8[];        -- queues on which this pop recorded the group's first start
    v_scope      record;        -- the one queue of a queue pop
    v_cands      refcursor;
    -- the candidate (a row of v_cands): its queue's options, partition and ready_at; its
    -- queue's name, encryption flag and partition id go straight to the result columns
    -- queue_name, encrypted and partition_id (PERF(pop): read into variables, not a record's
    -- fields; a lone claim's first row is then RETURN NEXT, below)
    v_qid        int8;
    v_lease_time int4;
    v_delayed    int4;
    v_window     int4;
    v_retry      interval;
    v_max_wait   interval;
    v_pid        int8;
    v_ready      timestamptz;
    v_last       int8;          -- the candidate's partition: last_offset, log_start_offset,
    v_from       int8;          -- last_created_at (its name is partition_name)
    v_last_at    timestamptz;
    v_ctid       tid;           -- the candidate's cursor row, locked
    v_old        int8;          -- its committed_offset
    v_held       timestamptz;   -- its lease (or release) time + retryDelay
    v_bstart     int8;          -- its batch_start (its attempt_count goes to attempt)
    v_cut        int8;
    v_next_off   int8;          -- the candidate's claim record: next_offset and the base
    v_cover      int8;          -- of its segment, then the base of the segment holding start_off
    v_next_at    timestamptz;   -- the new claim record: created_at and base of the segment
    v_next_base  int8;          -- holding end_off + 1
    -- the claims, in claim order, five numbers each: partition id, start, end, attempt, the
    -- base of the segment holding start (NULL until the first: NULL || x is x, and a default
    -- is an expression each call initializes)
    v_claims     int8[];
    v_pids       int8[];        -- the claims' partitions
    v_caught     timestamptz;   -- an autoAck claim to the partition's end: its new ready_at
    v_lock_last  int8;          -- that partition under its FOR SHARE: last_offset and
    v_lock_from  int8;          -- log_start_offset
BEGIN
    -- PERF(pop): one test on the good path (each plpgsql expression a call evaluates is
    -- initialized anew in each transaction: about 2,500 instructions; bench/popsql.py)
    IF p_batch IS NULL OR p_batch < 1 OR p_max_partitions IS NULL OR p_max_partitions < 1
       OR p_sub_mode NOT IN ('all', 'new', 'new-only', 'timestamp')
       OR (p_queue IS NULL AND p_namespace IS NULL AND p_task IS NULL) THEN
        IF p_batch IS NULL OR p_batch < 1 OR p_max_partitions IS NULL
           OR p_max_partitions < 1 THEN
            RAISE EXCEPTION 'log_pop_v3: batch and max_partitions must be >= 1'
                USING ERRCODE = '22023';
        END IF;
        IF p_sub_mode NOT IN ('all', 'new', 'new-only', 'timestamp') THEN
            RAISE EXCEPTION 'log_pop_v3: unknown subscription mode %', p_sub_mode
                USING ERRCODE = '22023';
        END IF;
        RAISE EXCEPTION 'log_pop_v3: a queue, a namespace or a task is required'
            USING ERRCODE = '22023';
    END IF;

    -- The group's first start on every matching queue, recorded once, and its cursor rows on
    -- every partition of those queues (the ready index lists cursor rows only). A record that
    -- a subscription call made, or a delete kept, is started here too, from its own time.
    -- The queue rows first (group_start_v1's lock, taken before any record is written: the
    -- lock order of groups.sql), so concurrent first pops of a group start it once.
    -- Pop maintenance (api.md 5): pops claim nothing, and learn of no wake-up time.
    IF p_queue IS NOT NULL THEN
        -- PERF(pop): a queue pop's scope is its one queue (queues_tenant_name_key): the
        -- maintenance flag, its options (schema/016's view) and whether the group started
        -- there come in one statement (bench/popsql.py: the flag's statement, the call of
        -- pop_scope_ids_v1 and pop_scope_v4's second read of the queue were 0.1 of a pop's
        -- PostgreSQL instructions).
        SELECT q.id, q.name, q.lease_time, q.delayed, q.window_s, q.encrypted,
               q.retry_delay, q.max_wait, m.started,
               EXISTS (SELECT 1 FROM queen.system_settings ss
                       WHERE ss.key = 'pop_maintenance_mode'
                         AND ss.value = 'true'::jsonb) AS paused
        INTO v_scope
        FROM queen.pop_queue_options q
        LEFT JOIN queen.consumer_groups_meta m
          ON m.queue_id = q.id AND m.consumer_group = p_group
        WHERE q.tenant = p_tenant AND q.name = p_queue
          AND (p_namespace IS NULL OR q.namespace = p_namespace)
          AND (p_task IS NULL OR q.task = p_task);
        IF NOT FOUND OR v_scope.paused OR v_scope.started IS NOT TRUE THEN
            IF NOT FOUND OR v_scope.paused THEN
                RETURN QUERY SELECT NULL::text, NULL::int8, NULL::text, NULL::int8, NULL::int8,
                    NULL::int4, NULL::timestamptz, NULL::boolean, NULL::int8,
                    NULL::timestamptz, NULL::bytea, NULL::int8;
                RETURN;
            END IF;
            v_started := ARRAY[v_scope.id];
        END IF;
    ELSE
        IF EXISTS (SELECT 1 FROM queen.system_settings ss
                   WHERE ss.key = 'pop_maintenance_mode' AND ss.value = 'true'::jsonb) THEN
            RETURN QUERY SELECT NULL::text, NULL::int8, NULL::text, NULL::int8, NULL::int8,
                NULL::int4, NULL::timestamptz, NULL::boolean, NULL::int8, NULL::timestamptz,
                NULL::bytea, NULL::int8;
            RETURN;
        END IF;
        v_scope_ids := queen.pop_scope_ids_v2(p_tenant, p_namespace, p_task);
        SELECT array_agg(pq.id ORDER BY pq.id) INTO v_started
        FROM queen.pop_scope_v5(v_scope_ids, p_group) pq
        WHERE pq.started IS NOT TRUE;
    END IF;
    IF v_started IS NOT NULL THEN
        PERFORM 1 FROM queen.queues q WHERE q.id = ANY (v_started) ORDER BY q.id FOR UPDATE;
        INSERT INTO queen.consumer_groups_meta AS m (queue_id, consumer_group,
                                                     subscription_mode, subscription_from)
        SELECT pq.id, p_group, p_sub_mode,
               CASE p_sub_mode WHEN 'all' THEN NULL
                               WHEN 'timestamp' THEN p_sub_from
                               ELSE COALESCE(p_sub_from, now()) END
        FROM queen.pop_scope_v5(v_started, p_group) pq
        WHERE pq.sub_mode IS NULL
        ORDER BY pq.id
        ON CONFLICT (queue_id, consumer_group) DO NOTHING;
        WITH flipped AS (
            UPDATE queen.consumer_groups_meta m SET started = true
            WHERE m.queue_id = ANY (v_started) AND m.consumer_group = p_group
              AND NOT m.started
            RETURNING m.queue_id
        )
        SELECT array_agg(f.queue_id ORDER BY f.queue_id) INTO v_started FROM flipped f;
        IF v_started IS NOT NULL THEN
            PERFORM queen.group_start_v1(v_started, p_group);
        END IF;
    END IF;

    -- Candidates: the group's ready cursors (schema/002_ready_index.sql), oldest pending
    -- message first; a queue pop walks the index in that order and reads no further than its
    -- claims take it. A discovery pop orders the ready cursors of every matching queue
    -- (highest priority first). A cursor held by a lease, or by one that expired or was
    -- released for redelivery (a `failed` ack with budget left: lease_expires_at then holds
    -- the release time, ack.sql) less than the queue's retryDelay ago, is not claimable
    -- before lease_expires_at + retryDelay: the index scan's own filter drops it, so a pop
    -- does not pay a loop turn for every live lease of its queue (bench/partitions.py, live
    -- leases). A completed batch leaves lease_expires_at NULL, so the next one is not held
    -- back. Windowed, delayed and caught-up candidates are skipped below; every skip that
    -- can end by itself lowers the wake-up time.
    IF p_queue IS NOT NULL THEN
        -- v_scope was read above (its options are not what a first start writes)
        IF p_partition IS NOT NULL THEN
            OPEN v_cands FOR
                SELECT v_scope.id AS qid, v_scope.name AS qname, v_scope.lease_time AS lease_time,
                       v_scope.delayed AS delayed, v_scope.window_s AS window_s,
                       v_scope.encrypted AS encrypted, v_scope.retry_delay AS retry_delay,
                       v_scope.max_wait AS max_wait, c.partition_id AS pid,
                       c.partition_id, c.ready_at
                FROM queen.log_partitions lp
                JOIN queen.log_consumers c
                  ON c.partition_id = lp.id AND c.consumer_group = p_group
                WHERE lp.queue_id = v_scope.id AND lp.name = p_partition
                  AND c.ready_at IS NOT NULL
                  AND (c.lease_expires_at IS NULL
                       OR c.lease_expires_at + v_scope.retry_delay <= now());
        ELSE
            OPEN v_cands FOR
                SELECT v_scope.id AS qid, v_scope.name AS qname, v_scope.lease_time AS lease_time,
                       v_scope.delayed AS delayed, v_scope.window_s AS window_s,
                       v_scope.encrypted AS encrypted, v_scope.retry_delay AS retry_delay,
                       v_scope.max_wait AS max_wait, c.partition_id AS pid,
                       c.partition_id, c.ready_at
                FROM queen.log_consumers c
                WHERE c.queue_id = v_scope.id AND c.consumer_group = p_group
                  AND c.ready_at IS NOT NULL
                  AND (c.lease_expires_at IS NULL
                       OR c.lease_expires_at + v_scope.retry_delay <= now())
                ORDER BY c.ready_at, c.partition_id;
        END IF;
    ELSE
        OPEN v_cands FOR
            SELECT pq.id AS qid, pq.name AS qname, pq.lease_time, pq.delayed, pq.window_s,
                   pq.encrypted, pq.retry_delay, pq.max_wait, c.partition_id AS pid,
                   c.partition_id, c.ready_at
            FROM queen.pop_scope_v5(v_scope_ids, p_group) pq
            CROSS JOIN LATERAL (
                SELECT c.partition_id, c.ready_at
                FROM queen.log_consumers c
                WHERE c.queue_id = pq.id AND c.consumer_group = p_group
                  AND c.ready_at IS NOT NULL
                  AND (c.lease_expires_at IS NULL
                       OR c.lease_expires_at + pq.retry_delay <= now())
                  AND (p_partition IS NULL OR c.partition_id IN (
                        SELECT lp.id FROM queen.log_partitions lp
                        WHERE lp.queue_id = pq.id AND lp.name = p_partition))
                OFFSET 0) c
            ORDER BY pq.priority DESC, c.ready_at, c.partition_id;
    END IF;

    LOOP
        EXIT WHEN cardinality(v_claims) >= 5 * p_max_partitions OR v_left <= 0
               OR clock_timestamp() >= statement_timestamp()
                                       + make_interval(secs => p_claim_ms / 1000.0);
        -- the partition id twice: v_pid for the statements below (an unqualified partition_id
        -- there is the column: #variable_conflict use_column), partition_id for the result
        FETCH v_cands INTO v_qid, queue_name, v_lease_time, v_delayed, v_window, encrypted,
                           v_retry, v_max_wait, v_pid, partition_id, v_ready;
        EXIT WHEN NOT FOUND;
        CONTINUE WHEN v_queue_id IS NOT NULL AND v_qid <> v_queue_id;

        SELECT lp.name, lp.last_offset, lp.log_start_offset, lp.last_created_at
        INTO partition_name, v_last, v_from, v_last_at
        FROM queen.log_partitions lp
        WHERE lp.id = v_pid;
        IF NOT FOUND OR (v_window > 0 AND v_last_at
                         > now() - make_interval(secs => v_window)) THEN
            IF FOUND THEN  -- a window buffer still open
                v_wake := LEAST(v_wake, v_last_at
                                        + make_interval(secs => v_window));
            END IF;
            CONTINUE;
        END IF;

        -- PERF(pop): the claim below updates the row by the ctid read here (a TID scan, not
        -- a second index probe), as log_ack_multi_v3 does. The claim's start, end and
        -- attempt are plpgsql assignments: computed by this SELECT ... FOR UPDATE they cost
        -- more (bench/popsql.py). Assignments leave FOUND as this SELECT set it.
        SELECT c.ctid, c.committed_offset, c.lease_expires_at + v_retry,
               c.batch_start, c.attempt_count, c.next_offset, c.next_base_offset
        INTO v_ctid, v_old, v_held, v_bstart, attempt, v_next_off, v_cover
        FROM queen.log_consumers c
        WHERE c.partition_id = v_pid AND c.consumer_group = p_group
        FOR UPDATE SKIP LOCKED;
        start_off := GREATEST(v_old + 1, v_from);
        IF NOT FOUND OR v_held > now() OR start_off > v_last THEN
            IF NOT FOUND THEN
                -- Another pop or an ack holds it right now: it may become claimable (or its
                -- delayed message mature) without a push, so look again soon.
                v_wake := LEAST(v_wake, clock_timestamp() + interval '50 milliseconds');
            ELSIF v_held > now() THEN
                v_wake := LEAST(v_wake, v_held);
            ELSE
                -- Listed but caught up (its flag was set while a push held the partition, or
                -- retention removed what it had): the flag is cleared unless a push holds the
                -- partition right now (no claim record: it may be what retention removed).
                UPDATE queen.log_consumers c
                SET ready_at = queen.log_ready_at_v1(v_pid, v_old, NULL, NULL)
                WHERE c.partition_id = v_pid AND c.consumer_group = p_group;
            END IF;
            CONTINUE;
        END IF;

        end_off := LEAST(v_last, start_off + v_left - 1);
        attempt := CASE WHEN v_bstart = start_off AND attempt > 0
                          THEN attempt + 1 ELSE 1 END;
        IF v_max_wait IS NOT NULL OR v_delayed > 0 THEN
            -- maxWaitTimeSeconds (api.md 4): a message that waited longer is never delivered.
            -- The head is the oldest message of the claim (created_at is monotone in offset
            -- order), so only its age matters. PERF: ready_at (read with the candidate) is
            -- never younger than the head, so a queue without overdue messages pays no
            -- probe; an overdue head leaves the partition to housekeeping's eviction (deleted
            -- and counted, retention.sql), which comes within one QUEEN_HOUSEKEEPING_S round:
            -- look again in a second.
            IF v_max_wait IS NOT NULL AND v_ready < now() - v_max_wait
               AND queen.log_pending_at_v1(v_pid, start_off) < now() - v_max_wait THEN
                v_wake := LEAST(v_wake, clock_timestamp() + interval '1 second');
                CONTINUE;
            END IF;

            IF v_delayed > 0 THEN
                SELECT s.base_offset + s.msg_count - 1 INTO v_cut
                FROM queen.log_segments s
                WHERE s.partition_id = v_pid
                  AND s.created_at <= now() - make_interval(secs => v_delayed)
                ORDER BY s.base_offset DESC
                LIMIT 1;
                IF v_cut IS NULL OR v_cut < start_off THEN
                    v_wake := LEAST(v_wake, (
                        SELECT s.created_at + make_interval(secs => v_delayed)
                        FROM queen.log_segments s
                        WHERE s.partition_id = v_pid AND s.base_offset <= start_off
                        ORDER BY s.base_offset DESC LIMIT 1));
                    CONTINUE;
                END IF;
                end_off := LEAST(end_off, v_cut);
            END IF;
        END IF;

        -- PERF(pop): the segment holding start_off, where the claim's segments begin: the
        -- claim record names it when the previous claim ended at start_off - 1 (every claim
        -- acked whole); a probe otherwise (as a subquery of the answer's statement it cost
        -- 42,000 instructions a pop, bench/popsql.py). NULL: retained away.
        IF v_next_off IS DISTINCT FROM start_off OR v_cover IS NULL THEN
            SELECT s.base_offset INTO v_cover
            FROM queen.log_segments s
            WHERE s.partition_id = v_pid AND s.base_offset <= start_off
            ORDER BY s.base_offset DESC LIMIT 1;
        END IF;
        -- the claim record: created_at and base of the segment holding end_off + 1 (a claim
        -- that reached the partition's end: no time, and the next segment's base is
        -- end_off + 1, offsets being allocated without gaps)
        IF end_off < v_last THEN
            SELECT s.created_at, s.base_offset INTO v_next_at, v_next_base
            FROM queen.log_segments s
            WHERE s.partition_id = v_pid AND s.base_offset <= end_off + 1
            ORDER BY s.base_offset DESC LIMIT 1;
        ELSE
            v_next_at := NULL;
            IF p_auto_ack THEN
                -- PERF(pop): a drain (the claim takes the partition's last message): what
                -- log_ready_at_v1 would answer, without its call and its unlocked read of the
                -- partition: caught up (NULL) only under the partition's FOR SHARE, as there;
                -- an allocator holding it means data may be arriving; a push committed since
                -- the walk read the partition, the time of what it added
                SELECT lp.last_offset, lp.log_start_offset INTO v_lock_last, v_lock_from
                FROM queen.log_partitions lp WHERE lp.id = v_pid
                FOR SHARE SKIP LOCKED;
                IF NOT FOUND THEN
                    v_caught := clock_timestamp();
                ELSIF GREATEST(end_off + 1, v_lock_from) > v_lock_last THEN
                    v_caught := NULL;
                ELSE
                    v_caught := COALESCE(queen.log_pending_at_v1(
                        v_pid, GREATEST(end_off + 1, v_lock_from)), clock_timestamp());
                END IF;
            END IF;
        END IF;
        -- INTO STRICT: the row is locked by this pop, so its version cannot have moved
        -- (P0002 if it did)
        IF p_auto_ack THEN
            UPDATE queen.log_consumers c
            SET committed_offset = end_off,
                total_consumed = c.total_consumed + (end_off - v_old),
                last_consumed_at = now(), last_popped_at = now(),
                attempt_count = 0, batch_retry_count = 0,
                next_offset = end_off + 1, next_created_at = v_next_at,
                next_base_offset = CASE WHEN end_off < v_last THEN v_next_base
                                        ELSE end_off + 1 END,
                ready_at = CASE WHEN end_off < v_last
                                THEN queen.log_ready_at_v1(v_pid, end_off, end_off + 1, v_next_at)
                                ELSE v_caught END
            WHERE c.ctid = v_ctid
              AND c.partition_id = v_pid AND c.consumer_group = p_group
            RETURNING NULL::timestamptz INTO STRICT lease_expires_at;
        ELSE
            UPDATE queen.log_consumers c
            SET lease_id = p_lease_id, worker_id = p_lease_id::text,
                lease_expires_at = now() + make_interval(secs => v_lease_time),
                leased_at = now(), last_popped_at = now(),
                batch_start = start_off, batch_end = end_off, attempt_count = attempt,
                next_offset = end_off + 1, next_created_at = v_next_at,
                next_base_offset = CASE WHEN end_off < v_last THEN v_next_base
                                        ELSE end_off + 1 END
            WHERE c.ctid = v_ctid
              AND c.partition_id = v_pid AND c.consumer_group = p_group
            RETURNING c.lease_expires_at INTO STRICT lease_expires_at;
        END IF;

        v_queue_id := v_qid;
        v_left := v_left - (end_off - start_off + 1)::int4;
        v_claims := v_claims || ARRAY[v_pid, start_off, end_off, attempt,
                                      COALESCE(v_cover, start_off)];
        v_pids := v_pids || v_pid;
    END LOOP;
    CLOSE v_cands;

    IF v_claims IS NULL THEN  -- no claim
        -- Nothing claimable. The walk above went through every ready cursor of the scope
        -- that no lease held (it stops early only on a claim or the deadline), so v_wake
        -- already holds the earliest window close and delayed maturity among them; the
        -- held ones free up at their earliest lease expiry (plus retryDelay).
        -- (one query for every kind of scope: a queue pop's scope is its one queue)
        IF p_queue IS NOT NULL THEN
            v_scope_ids := ARRAY[v_scope.id];
        END IF;
        v_wake := LEAST(v_wake, (
            SELECT min(c.lease_expires_at + pq.retry_delay)
            FROM queen.pop_scope_v5(v_scope_ids, p_group) pq
            JOIN queen.log_consumers c
              ON c.queue_id = pq.id AND c.consumer_group = p_group
            WHERE c.ready_at IS NOT NULL
              AND c.lease_expires_at + pq.retry_delay > now()
              AND (p_partition IS NULL OR c.partition_id IN (
                    SELECT lp.id FROM queen.log_partitions lp
                    WHERE lp.queue_id = pq.id AND lp.name = p_partition))));
        RETURN QUERY SELECT NULL::text, NULL::int8, NULL::text, NULL::int8, NULL::int8,
            NULL::int4, NULL::timestamptz, NULL::boolean, NULL::int8, NULL::timestamptz,
            NULL::bytea,
            CASE WHEN v_wake IS NOT NULL THEN GREATEST(0, ceil(extract(epoch FROM v_wake - clock_timestamp()) * 1000))::int8 END;
        RETURN;
    END IF;

    -- The lease's row: renewal and requiredLeases find its cursors by it (a cursor's lease_id
    -- is not indexed, so that a claim's update stays HOT: schema/014_lease_table.sql).
    INSERT INTO queen.log_leases (lease_id, tenant, consumer_group, partition_ids)
    SELECT p_lease_id, p_tenant, p_group, v_pids
    WHERE p_lease_id IS NOT NULL AND NOT p_auto_ack;

    IF cardinality(v_claims) = 5 AND v_pid = v_claims[1] THEN
        -- PERF(pop): one claim that was the walk's last candidate (every pop of partitions=1
        -- that claims): the result columns queue_name .. lease_expires_at hold its values, as
        -- the walk read them into them (no later candidate replaced them), so RETURN NEXT is
        -- its first row (no statement), and its segments are one statement in primary key
        -- order without the claim's columns: no join, no sort (bench/popsql.py).
        RETURN NEXT;
        RETURN QUERY
        SELECT NULL::text, NULL::int8, NULL::text, NULL::int8, NULL::int8, NULL::int4,
               NULL::timestamptz, NULL::boolean, s.base_offset, s.created_at, s.payload,
               NULL::int8
        FROM queen.log_segments s
        WHERE s.partition_id = v_pid
          AND s.base_offset <= end_off
          AND s.base_offset >= COALESCE(v_cover, start_off)
        ORDER BY s.base_offset;
        RETURN;
    END IF;
    -- The claims' partitions and queue by primary key (a join with the scope would read
    -- every partition of the queue).
    RETURN QUERY
    SELECT q.name::text, cl.pid, lp.name::text, cl.s, cl.e, cl.a, log_pop_v3.lease_expires_at,
           q.encryption_enabled, seg.base_offset, seg.created_at, seg.payload, NULL::int8
    FROM generate_series(1, cardinality(v_claims), 5) AS g(n)
    CROSS JOIN LATERAL (SELECT v_claims[g.n] AS pid, v_claims[g.n + 1] AS s,
                               v_claims[g.n + 2] AS e, v_claims[g.n + 3]::int4 AS a,
                               v_claims[g.n + 4] AS b) cl
    JOIN queen.log_partitions lp ON lp.id = cl.pid
    JOIN queen.queues q ON q.id = lp.queue_id
    LEFT JOIN LATERAL (
        SELECT s.base_offset, s.created_at, s.payload
        FROM queen.log_segments s
        WHERE s.partition_id = cl.pid AND s.base_offset <= cl.e AND s.base_offset >= cl.b
    ) seg ON true
    ORDER BY g.n, seg.base_offset;
END
$$;

-- ---------------------------------------------------------------------------------------------
-- log_renew_lease_v1: renews every live lease of one lease id (a multi-partition pop shares
-- it); GREATEST, so renewal never shortens; reports the EARLIEST renewed expiry, which is what
-- the caller schedules its next renewal by. p_seconds NULL = each queue's leaseTime.
-- The lease's cursors are the ones its log_leases row lists (schema/014_lease_table.sql), and
-- the row's tenant is the gate: a foreign lease renews nothing. Each cursor is a key probe
-- (OFFSET 0: no plan may scan the group's cursors), locked in key order (the partitions
-- sorted; the group is one). A lease a pop wrote no row for (an older build's, issued after
-- the upgrade) renews nothing, as an expired one.
-- Result: one row (renewed int4, expires_at timestamptz, NULL when nothing was renewed).
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_renew_lease_v1(p_tenant uuid, p_lease_id uuid, p_seconds int4)
RETURNS TABLE (renewed int4, expires_at timestamptz)
LANGUAGE sql VOLATILE
AS $$
    WITH live AS (
        SELECT c.partition_id, c.consumer_group
        FROM queen.log_leases l
        CROSS JOIN LATERAL (SELECT u.pid FROM unnest(l.partition_ids) AS u(pid)
                            ORDER BY u.pid) lc
        CROSS JOIN LATERAL (
            SELECT c.partition_id, c.consumer_group
            FROM queen.log_consumers c
            WHERE c.partition_id = lc.pid AND c.consumer_group = l.consumer_group
              AND c.lease_id = p_lease_id AND c.lease_expires_at > now()
            OFFSET 0
            FOR UPDATE) c
        WHERE l.lease_id = p_lease_id AND l.tenant = p_tenant
    ), renewed AS (
        UPDATE queen.log_consumers c
        SET lease_expires_at = GREATEST(c.lease_expires_at,
                                        now() + make_interval(secs => s.secs))
        FROM live
        CROSS JOIN LATERAL (
            SELECT CASE WHEN p_seconds IS NOT NULL THEN p_seconds
                        WHEN q.lease_time = 0 THEN 60 ELSE q.lease_time END AS secs
            FROM queen.log_partitions lp
            JOIN queen.queues q ON q.id = lp.queue_id
            WHERE lp.id = live.partition_id) s
        WHERE c.partition_id = live.partition_id AND c.consumer_group = live.consumer_group
        RETURNING c.lease_expires_at
    )
    SELECT count(*)::int4, min(renewed.lease_expires_at) FROM renewed;
$$;
