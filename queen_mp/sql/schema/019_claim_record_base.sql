-- 019_claim_record_base.sql: a claim records the base offset of the segment holding the offset
-- after it, beside that segment's created_at (issue 26).
--
-- Tables: queen.log_consumers gains next_base_offset (NULL until a claim; not indexed, so a
--   claim's update stays HOT: schema/014_lease_table.sql).
--
-- Why: a pop's answer starts at the segment holding the claim's first offset, which it found
-- by a max(base_offset) probe of log_segments: a subquery of the answer's statement that cost
-- 42,000 instructions of a pop of 100 (bench/popsql.py --callgrind, PostgreSQL 15). The claim
-- before it already probed that segment for its claim record (next_offset, next_created_at:
-- the segment holding next_offset); recording its base too answers the next claim whenever it
-- starts at next_offset (the previous batch acked whole), with no read (functions/pop.sql).
-- Only the pop writes the claim record; a cursor moved otherwise leaves next_offset unequal to
-- its next start, and the pop probes as before.

ALTER TABLE queen.log_consumers ADD COLUMN next_base_offset int8;

COMMENT ON COLUMN queen.log_consumers.next_base_offset IS
    'base_offset of the segment holding next_offset (of the next one when the claim reached '
    'the end: next_offset itself).';
