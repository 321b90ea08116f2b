

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
-- Cascade log_partitions -> log_segments, log_txns by trigger instead of a FOREIGN KEY.
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
    TRUNCATE queen.log_segments, queen.log_txns;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER log_partitions_cascade_truncate
    AFTER TRUNCATE ON queen.log_partitions
    FOR EACH STATEMENT EXECUTE FUNCTION queen.log_partitions_cascade_truncate();
