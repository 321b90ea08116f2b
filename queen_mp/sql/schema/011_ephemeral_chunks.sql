-- 011_ephemeral_chunks.sql: ephemeral messages stored by the chunk, not by the row (issue 27
-- item 4: "far cheaper than durable queues").
--
-- Tables: queen.eph_chunks (new, UNLOGGED) replaces queen.eph_messages (dropped, its rows
--   moved).
--
-- Why: with a row per message, PostgreSQL spent about twice durable's CPU per message (a
-- push of 100 inserted 100 rows and 100 index entries, their acks deleted as many), where the
-- durable log stores a push as one segment row. A chunk is one row holding up to 256
-- consecutive messages of one partition (a push of n messages writes ceil(n / 256) rows): a
-- pop reads its messages by range under the group's cursor, an ack marks them gone in the
-- chunk's 'gone' set, and the row is deleted when its last message goes. Seqs and message ids
-- are unchanged: a push's messages are still seq value * 16384 + 0, 1, ..., and the chunk of
-- message s is the one whose base is s - s % 256 (16384 is a multiple of 256).

CREATE UNLOGGED TABLE queen.eph_chunks (
    pid        int8             NOT NULL,  -- eph_partitions.id
    base       int8             NOT NULL,  -- the seq of payloads[1], a multiple of 256
    payloads   text[]           NOT NULL,  -- message base + i - 1 is payloads[i] (NULL: none)
    sizes      int4[]           NOT NULL,  -- their payloads' bytes
    gone       int4multirange   NOT NULL DEFAULT '{}',  -- indexes (0-based) no longer stored
    live       int4             NOT NULL,  -- messages stored: cardinality - width of gone
    created_at timestamptz      NOT NULL,  -- the push's (ttlSeconds)
    PRIMARY KEY (pid, base)
);

-- a message of 009 joins the chunk its seq falls in; the seqs of a chunk that have no row
-- (acknowledged, dropped) are gone
INSERT INTO queen.eph_chunks (pid, base, payloads, sizes, gone, live, created_at)
SELECT k.pid, k.base,
       ARRAY(SELECT m.payload FROM generate_series(k.base, k.last) AS s(seq)
               LEFT JOIN queen.eph_messages m ON m.pid = k.pid AND m.seq = s.seq
              ORDER BY s.seq),
       ARRAY(SELECT coalesce(m.bytes, 0) FROM generate_series(k.base, k.last) AS s(seq)
               LEFT JOIN queen.eph_messages m ON m.pid = k.pid AND m.seq = s.seq
              ORDER BY s.seq),
       coalesce((SELECT range_agg(int4range((s.seq - k.base)::int4, (s.seq - k.base)::int4 + 1))
                   FROM generate_series(k.base, k.last) AS s(seq)
                  WHERE NOT EXISTS (SELECT 1 FROM queen.eph_messages m
                                     WHERE m.pid = k.pid AND m.seq = s.seq)), '{}'),
       k.n, k.created_at
  FROM (SELECT m.pid, m.seq - m.seq % 256 AS base, max(m.seq) AS last, count(*)::int4 AS n,
               min(m.created_at) AS created_at
          FROM queen.eph_messages m GROUP BY 1, 2) AS k;

DROP TABLE queen.eph_messages;
