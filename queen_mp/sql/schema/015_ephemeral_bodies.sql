-- 015_ephemeral_bodies.sql: an ephemeral chunk's payloads stored as one byte string, as a pop
-- answers them (issue 27 item 4).
--
-- Tables: queen.eph_chunks (payloads text[] and sizes int4[] replaced by body bytea, storage
--   EXTERNAL, and offs int4[]).
--
-- Why: a pop answers a run of a chunk's messages as their UTF-8 bytes joined by 0x1e
-- (eph_pop_v4's payloads). From a text[] that took a slice of the array (its elements walked
-- and copied), array_to_string (an output function call and two copies a message), copies of
-- the text in plpgsql and convert_to at the end: some 240k of the 1.59M instructions of a pop
-- of 100 (callgrind, bench/ephemeral_sql.py's pattern, PostgreSQL 15). Stored as that byte
-- string, a run is one substring of it, and substring() of an uncompressed out-of-line value
-- reads only the TOAST chunks the run covers. body is payloads[1] || 0x1e || payloads[2] ...;
-- message i (1-based) is bytes offs[i] - offs[1] .. offs[i + 1] - offs[1] - 2 of it (0-based;
-- offs[1] is 0 here, and a push of over 256 messages stores each chunk's slice of its offsets
-- as they are): offs has one more element, one past a virtual separator after the last
-- message, so the run of messages lo .. hi is one substring, its size offs[hi + 1] - offs[lo]
-- - (hi - lo + 1) bytes, with no row per message (sizes summed a slice: a subquery in every
-- ack). The push sends the body and offsets (eph_push_v3, eph_push_v4): building them here cost
-- more than the pop saved. A NULL element of payloads (a seq that had no message in 011's
-- conversion) is an empty payload, as gone as before.

ALTER TABLE queen.eph_chunks ADD COLUMN body bytea, ADD COLUMN offs int4[];

UPDATE queen.eph_chunks k
   SET body = convert_to(array_to_string(k.payloads, E'\x1e', ''), 'UTF8'),
       offs = ARRAY(SELECT coalesce(sum(coalesce(octet_length(u.p), 0) + 1)
                                        OVER (ORDER BY u.o ROWS BETWEEN UNBOUNDED PRECEDING
                                                                AND 1 PRECEDING), 0)::int4
                      FROM unnest(k.payloads || NULL::text) WITH ORDINALITY AS u(p, o)
                     ORDER BY u.o);

ALTER TABLE queen.eph_chunks ALTER COLUMN body SET NOT NULL,
                             ALTER COLUMN offs SET NOT NULL,
                             ALTER COLUMN body SET STORAGE EXTERNAL,
                             DROP COLUMN payloads, DROP COLUMN sizes;
