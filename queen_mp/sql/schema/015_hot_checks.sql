-- 015_hot_checks.sql: the push path's tables keep their integrity by their writers, not by
-- CHECK constraints (issue 26, pg1).
--
-- Tables: queen.log_partitions, queen.log_segments, queen.log_txns (CHECK constraints dropped).
--
-- Why: PostgreSQL 15 reads every CHECK constraint of a table from the catalog's node text
-- (stringToNode) and plans it (ExecPrepareExpr) once per statement that inserts or updates the
-- table, and on UPDATE it evaluates all of them, whichever columns changed. A push bundle's
-- allocator UPDATE, segment INSERT and sidecar INSERT paid that for nine constraints: under
-- callgrind (bench/pushsql.py, 1x1) ExecConstraints was about 160k instructions a bundle, 13%
-- of a lone 1-item push's PostgreSQL work.
--
-- Who guarantees each condition instead (functions/push.sql, retention.sql, admin.sql,
-- triggers.sql):
--   * log_segments / log_txns rows are written only by the allocators (log_push_one_v1,
--     log_push_multi_v2), which raise 22023 unless msg_count >= 1 and the hash blob is
--     16 x msg_count bytes; base_offset = the previous last_offset + 1 >= 1.
--   * log_partitions.last_offset starts at 0 and only the allocators change it, by
--     msg_count >= 1; txns_start and log_start_offset start at 1 and are only ever raised
--     (retention: GREATEST of the old value; admin's trim: a value above the old one).
--   * log_partitions.name (1..255 bytes): the edge rejects other names (api.md 1.7), and the
--     statement trigger that runs on every partition creation (log_partitions_cursors) raises
--     23514 for one that got through, so no UPDATE pays for it.

ALTER TABLE queen.log_partitions
    DROP CONSTRAINT IF EXISTS log_partitions_name_check,
    DROP CONSTRAINT IF EXISTS log_partitions_last_offset_check,
    DROP CONSTRAINT IF EXISTS log_partitions_txns_start_check,
    DROP CONSTRAINT IF EXISTS log_partitions_log_start_offset_check;
ALTER TABLE queen.log_segments
    DROP CONSTRAINT IF EXISTS log_segments_base_offset_check,
    DROP CONSTRAINT IF EXISTS log_segments_msg_count_check;
ALTER TABLE queen.log_txns
    DROP CONSTRAINT IF EXISTS log_txns_base_offset_check,
    DROP CONSTRAINT IF EXISTS log_txns_msg_count_check,
    DROP CONSTRAINT IF EXISTS log_txns_check;
