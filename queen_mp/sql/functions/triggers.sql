

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

-- A partition created after a group's start gets that group's cursor at its log start
-- (api.md 2.2: the recorded start is "used for partitions created later too"; every message
-- of a new partition comes after it). The queue rows are taken FOR KEY SHARE first, which
-- group_start_v1's FOR UPDATE excludes: either the group start sees this partition or this
-- statement sees the group.
-- ready_at stays NULL (caught up) without the partition lock of pop.sql's log_ready_at_v1: a
-- partition is created empty (push.sql, timers.sql), and until this transaction commits no
-- other one can allocate in it (its allocator UPDATE does not see the row, or waits for the
-- insert it conflicts with); an allocator of this transaction or a later one marks the new
-- cursors in its statement after the allocation, as it marks every caught-up cursor.
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
