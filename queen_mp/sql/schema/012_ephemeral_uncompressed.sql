-- 012_ephemeral_uncompressed.sql: ephemeral chunks' payloads stored without compression (issue
-- 27 item 4).
--
-- Tables: queen.eph_chunks (its payloads column's storage EXTERNAL instead of EXTENDED).
--
-- Why: a chunk's payloads (up to 256 messages) are one array of some 25-50 kB for the usual
-- 100-256 messages of 200 bytes, so PostgreSQL moved it out of line (TOAST) and compressed it
-- (pglz) at every push, then decompressed all of it at every pop that read the chunk and at
-- every redelivery. An ephemeral message lives for seconds in an UNLOGGED table: the CPU of
-- compressing it is not worth the bytes saved. EXTERNAL keeps it out of line, uncompressed.
-- Measured from one connection (bench/ephemeral_sql.py's pattern, 40,000 messages in pushes of
-- 100, then pops of 100 each acknowledged in one call), two runs each, alternated: PostgreSQL
-- CPU per message push 6.8 / 6.1 -> 6.2 / 5.7 us, pop+ack 13.3 / 12.1 -> 11.5 / 10.4 us.
-- Chunks written before this migration stay compressed until they are deleted (reads
-- decompress them as before).

ALTER TABLE queen.eph_chunks ALTER COLUMN payloads SET STORAGE EXTERNAL;
