-- The ready index's row trigger as the tree had it until cons8 (functions/triggers.sql at
-- 4f60f65), verbatim: tests/integration/test_sql_tree.py installs it to stand for a database
-- that a broker of that build migrated, then upgrades it.

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

