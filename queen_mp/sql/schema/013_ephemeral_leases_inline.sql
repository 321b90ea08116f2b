-- 013_ephemeral_leases_inline.sql: ephemeral deliveries' arrays kept in their row, never
-- compressed (issue 27 item 4).
--
-- Tables: queen.eph_leases (seqs and atts: storage EXTERNAL instead of EXTENDED; the table's
--   toast_tuple_target 8160 instead of the default 2032).
--
-- Why: a delivery's row holds its messages' seqs (int8) and delivery counts (int4), 12 bytes a
-- message, so a pop of more than about 150 messages wrote a row over the default 2 kB target,
-- and PostgreSQL compressed its arrays (pglz) at the insert, then decompressed them at the ack
-- that compared them and at every redelivery. Under callgrind (bench/ephemeral_sql.py's
-- pattern, a pop of 200 new messages of one chunk, PostgreSQL 15) pglz_compress was 2.07M of
-- the pop's 5.35M instructions. A delivery lives for seconds in an UNLOGGED table: its bytes
-- are not worth that CPU. Rows up to 8160 bytes (about 670 messages) now stay in the page as
-- they are; a larger one goes out of line, uncompressed. Rows written before this migration
-- stay as they are until they are deleted.

ALTER TABLE queen.eph_leases ALTER COLUMN seqs SET STORAGE EXTERNAL,
                             ALTER COLUMN atts SET STORAGE EXTERNAL;
ALTER TABLE queen.eph_leases SET (toast_tuple_target = 8160);
