

-- ---------------------------------------------------------------------------------------------
-- Name derivation (api.md 1.9): namespace = name up to the first '.', the whole name if none;
-- task = the part between the first and second '.', NULL if there is none (or it is empty).
-- Plain functions + an insert trigger rather than generated columns, because configure
-- (api.md 2.7) may replace the derived values with explicit ones.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.derive_namespace(p_name text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN split_part(p_name, '.', 1);

CREATE OR REPLACE FUNCTION queen.derive_task(p_name text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN CASE WHEN strpos(p_name, '.') = 0 THEN NULL
            ELSE nullif(split_part(p_name, '.', 2), '') END;

CREATE OR REPLACE FUNCTION queen.queues_fill_derived() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.namespace IS NULL THEN
        NEW.namespace := queen.derive_namespace(NEW.name);
    END IF;
    IF NEW.task IS NULL THEN
        NEW.task := queen.derive_task(NEW.name);
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER queues_fill_derived
    BEFORE INSERT ON queen.queues
    FOR EACH ROW EXECUTE FUNCTION queen.queues_fill_derived();

-- ---------------------------------------------------------------------------------------------
-- Cascade log_partitions -> log_segments, log_txns, log_consumers by trigger instead of a
-- FOREIGN KEY (cursor rows: schema/007_cursors_cascade.sql says why and who guarantees it).
-- Why: a foreign key costs the hot path two RI checks per pushed segment (an SPI query each,
-- plus a FOR KEY SHARE lock on the freshly updated allocator row, i.e. an extra WAL record):
-- measured ~25% of the per-segment cost of log_push_one_v1. The referential guarantee holds by
-- construction instead: the only writer is log_push_one_v1 (the single allocator), which first
-- UPDATEs the partition row (raising P0002 if it is missing) and keeps it locked until commit,
-- so the row cannot be deleted under an insert, and a delete that commits first makes the
-- allocator UPDATE find nothing. Deletes (direct, or cascaded from queues by their FK) and
-- TRUNCATE (including TRUNCATE ... CASCADE from queues) of log_partitions clean up here.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_partitions_cascade_delete() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM queen.log_segments s USING gone g WHERE s.partition_id = g.id;
    DELETE FROM queen.log_txns t USING gone g WHERE t.partition_id = g.id;
    DELETE FROM queen.log_consumers c USING gone g WHERE c.partition_id = g.id;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER log_partitions_cascade_delete
    AFTER DELETE ON queen.log_partitions
    REFERENCING OLD TABLE AS gone
    FOR EACH STATEMENT EXECUTE FUNCTION queen.log_partitions_cascade_delete();

CREATE OR REPLACE FUNCTION queen.log_partitions_cascade_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE queen.log_segments, queen.log_txns, queen.log_consumers;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER log_partitions_cascade_truncate
    AFTER TRUNCATE ON queen.log_partitions
    FOR EACH STATEMENT EXECUTE FUNCTION queen.log_partitions_cascade_truncate();

-- ---------------------------------------------------------------------------------------------
-- The ready index (schema/002_ready_index.sql): log_consumers.ready_at is the created_at of the
-- oldest message a cursor has not consumed, NULL when it has consumed everything. It may be
-- set while nothing is pending (a pop that finds so settles it); it must never be NULL while
-- something is, or the pop would not find the partition.
--
-- The protocol that makes NULL safe:
--   1. NULL is written only by log_consumers_ready below, and only while it holds the
--      partition row FOR SHARE (taken with SKIP LOCKED: never waits), having read last_offset
--      from the row it locked (READ COMMITTED locks and returns the newest committed version).
--   2. An allocator holds the partition row FOR UPDATE / FOR NO KEY UPDATE (both conflict
--      with FOR SHARE) from before it writes offsets until it commits, and then, in a
--      statement whose snapshot was taken after it got the lock, sets ready_at on every
--      cursor of the partition that is NULL and behind the new last_offset (push.sql: the
--      allocator UPDATE's own statement in log_push_multi_v2, which locked the rows in an
--      earlier one; the statement after the UPDATE in log_push_one_v1). The allocators are
--      the only writers of last_offset; a statement trigger did this until issue 26 (pg1)
--      measured its transition tables and plpgsql call at ~160k instructions a bundle.
--   So a NULL committed before the allocator took the row is seen by its later statement and
--   set; a NULL cannot be committed while the allocator holds the row (1 skips, and writes a
--   time instead); a cursor writer the allocator's UPDATE finds holding a NULL row is waited
--   for and re-checked. Writers that do not move committed_offset leave the column alone.
-- Lock order: the allocators wait for consumer rows while holding partition rows (the global
--   order); log_consumers_ready holds a consumer row and never waits for a partition.
-- ---------------------------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION queen.log_consumers_ready() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    v_last int8;
    v_from int8;
    v_off  int8;
BEGIN
    IF NEW.queue_id IS NULL THEN
        SELECT lp.queue_id INTO NEW.queue_id
        FROM queen.log_partitions lp WHERE lp.id = NEW.partition_id;
    END IF;
    IF NEW.ready_at IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.ready_at IS DISTINCT FROM OLD.ready_at) THEN
        RETURN NEW;  -- the writer computed it
    END IF;

    SELECT lp.last_offset, lp.log_start_offset INTO v_last, v_from
    FROM queen.log_partitions lp WHERE lp.id = NEW.partition_id;
    IF NOT FOUND THEN
        RETURN NEW;  -- the partition is being deleted (its cursors go with it)
    END IF;
    v_off := GREATEST(NEW.committed_offset + 1, v_from);
    IF v_off > v_last THEN
        -- Caught up as far as this snapshot sees: NULL only under the partition's FOR SHARE.
        SELECT lp.last_offset, lp.log_start_offset INTO v_last, v_from
        FROM queen.log_partitions lp WHERE lp.id = NEW.partition_id
        FOR SHARE SKIP LOCKED;
        IF NOT FOUND THEN
            -- An allocator holds it: data may be arriving. A pop settles the flag later.
            NEW.ready_at := clock_timestamp();
            RETURN NEW;
        END IF;
        v_off := GREATEST(NEW.committed_offset + 1, v_from);
        IF v_off > v_last THEN
            NEW.ready_at := NULL;
            RETURN NEW;
        END IF;
    END IF;
    IF NEW.next_offset = v_off AND NEW.next_created_at IS NOT NULL THEN
        NEW.ready_at := NEW.next_created_at;  -- a claim recorded it (pop.sql, sql/130)
    ELSE
        NEW.ready_at := COALESCE(queen.log_pending_at_v1(NEW.partition_id, v_off),
                                 clock_timestamp());
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE TRIGGER log_consumers_ready_insert
    BEFORE INSERT ON queen.log_consumers
    FOR EACH ROW WHEN (NEW.ready_at IS NULL OR NEW.queue_id IS NULL)
    EXECUTE FUNCTION queen.log_consumers_ready();

CREATE OR REPLACE TRIGGER log_consumers_ready_update
    BEFORE UPDATE ON queen.log_consumers
    FOR EACH ROW WHEN (NEW.committed_offset IS DISTINCT FROM OLD.committed_offset
                       OR (NEW.ready_at IS NULL AND OLD.ready_at IS NOT NULL))
    EXECUTE FUNCTION queen.log_consumers_ready();

-- A partition created after a group's start gets that group's cursor at its log start
-- (api.md 2.2: the recorded start is "used for partitions created later too"; every message
-- of a new partition comes after it). The queue rows are taken FOR KEY SHARE first, which
-- group_start_v1's FOR UPDATE excludes: either the group start sees this partition or this
-- statement sees the group.
CREATE OR REPLACE FUNCTION queen.log_partitions_cursors() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM queen.queues q
    WHERE q.id IN (SELECT n.queue_id FROM created_parts n)
    ORDER BY q.id
    FOR KEY SHARE;
    INSERT INTO queen.log_consumers AS c (partition_id, consumer_group, committed_offset,
                                          queue_id)
    SELECT n.id, m.consumer_group, n.log_start_offset - 1, n.queue_id
    FROM created_parts n
    JOIN queen.consumer_groups_meta m ON m.queue_id = n.queue_id AND m.started
    ORDER BY n.id, m.consumer_group
    ON CONFLICT (partition_id, consumer_group) DO NOTHING;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER log_partitions_cursors
    AFTER INSERT ON queen.log_partitions
    REFERENCING NEW TABLE AS created_parts
    FOR EACH STATEMENT EXECUTE FUNCTION queen.log_partitions_cursors();

-- Whatever a broker of an older build left (cursor rows its pops would have created, flags it
-- did not set), repaired in the transaction that installs the triggers above.
SELECT queen.log_ready_repair_v1();
