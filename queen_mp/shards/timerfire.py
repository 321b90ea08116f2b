"""The timer firer of a shard: due timers become messages (docs/api.md 2.5 "Timer ops").

Every ~100 ms (at once again when the previous round was full) an autocommit probe
(``timer_due_v2``: is anything due?) and, only when it says so, one transaction:

1. ``timer_claim_due_v1`` locks the partitions of the earliest due timers, then claims up to
   ``batch`` of those timers ``FOR UPDATE SKIP LOCKED`` (lock order: sql/functions/timers.sql);
2. one segment per (tenant, queue, partition): each timer becomes a §3.1 frame with the message
   id minted at scheduling, transactionId = its ``txn`` and its JSON bytes as payload
   (decompressed first when stored as zstd; encrypted when the queue is), packed as one zstd
   chunk with the xxh3_128 hash blob; repeats of one transactionId in a segment keep the first;
3. ``log_push_multi_v3`` in the same transaction. A segment answered ``duplicate`` stored
   nothing: its duplicate frames were delivered by an earlier firing (or an earlier push of
   that transactionId) and are dropped, the rest is pushed again;
4. ``timer_mark_fired_v1`` (fired_at, attempts + 1), COMMIT, then ``wake`` for the queues that
   got messages.

Any failure rolls the round back; the timers stay pending and the next round retries them
(at-least-once; the transactionId dedup makes a repeat invisible within the queue's window).
Several shards (and broker instances) run a firer each: SKIP LOCKED keeps their claims disjoint.
At most once a minute the firer also forgets fired / cancelled timers older than the retention
(``timer_purge_v1``), which is what late calls answer ``too_late`` from.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from queen_mp.crypto import PayloadCipher
from queen_mp.db import timer_procs
from queen_mp.db.connect import Conn, Dedicated
from queen_mp.db.timer_procs import DueTimer
from queen_mp.models.timers import payload_json
from queen_mp.wire import frames as wf
from queen_mp.wire.hashing import txn_hash
from queen_mp.wire.ids import uuid_text

__all__ = ["TimerFirer"]

log = logging.getLogger("queen_mp.timers")

Wake = Callable[[set[tuple[bytes, str]]], None]
SegmentKey = tuple[bytes, str, str]  # tenant, queue, partition

BATCH = 200
INTERVAL_S = 0.1
PURGE_EVERY_S = 60.0
MAX_CLAIM_BYTES = 16 << 20  # stored payload bytes claimed per round
MAX_ROUND_BYTES = 64 << 20  # frame bytes built per round (after decompression)
_ERROR_BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
_MAX_PUSH_ROUNDS = 8


class TimerFirer:
    """One per shard; ``run`` loops until cancelled."""

    def __init__(self, dsn: str, wake: Wake, *, name: str, batch: int = BATCH,
                 interval_s: float = INTERVAL_S, retention_s: int = 3600,
                 cipher: PayloadCipher | None = None, max_decompressed: int = 256 << 20,
                 statement_timeout_ms: int = 30_000, purge_every_s: float = PURGE_EVERY_S,
                 max_claim_bytes: int = MAX_CLAIM_BYTES,
                 max_round_bytes: int = MAX_ROUND_BYTES) -> None:
        self.dsn = dsn
        self.wake = wake
        self.name = name
        self.batch = batch
        self.interval_s = interval_s
        self.retention_s = retention_s
        self.cipher = cipher
        self.max_decompressed = max_decompressed
        self.statement_timeout_ms = statement_timeout_ms
        self.purge_every_s = purge_every_s
        self.max_claim_bytes = max_claim_bytes
        self.max_round_bytes = max_round_bytes
        self.fired_total = 0
        # NOTE(timers): a round (probe, claim, push, mark, commit) runs under one deadline of
        # statement_timeout_ms; past it the round is cancelled server-side and rolled back.
        self.db = Dedicated(dsn, application_name=name,
                            statement_timeout_ms=statement_timeout_ms)
        self._purged_at = float("-inf")

    # ------------------------------------------------------------------ loop
    async def run(self) -> None:
        errors = 0
        try:
            while True:
                try:
                    await self._maybe_purge()
                    more = await self.fire_once()
                    errors = 0
                except asyncio.CancelledError:
                    raise
                except Exception as ex:
                    delay = _ERROR_BACKOFF_S[min(errors, len(_ERROR_BACKOFF_S) - 1)]
                    errors += 1
                    log.warning("%s: timer round failed (retried in %.1fs): %r", self.name,
                                delay, ex)
                    await self.db.drop()
                    await asyncio.sleep(delay)
                    continue
                await asyncio.sleep(0 if more else self.interval_s)
        finally:
            await self.db.drop()

    async def fire_once(self) -> bool:
        """One round; whether it was full (more timers may be due right now)."""
        fired = await self.db.run(self._round, commit_sent=True)
        if fired is None:
            return False
        due, woken, done = fired
        self.fired_total += done
        if woken:
            self.wake(woken)
        return (done < len(due) or len(due) >= self.batch
                or sum(len(t.payload) for t in due) >= self.max_claim_bytes)

    async def _round(self, conn: Conn
                     ) -> tuple[list[DueTimer], set[tuple[bytes, str]], int] | None:
        """The claimed timers, the (tenant, queue) pairs that got messages and how many of
        the timers were handled, committed; None when nothing was due."""
        if not await timer_procs.any_due(conn):
            return None
        async with conn.transaction():
            due = await timer_procs.claim_due(conn, self.batch, self.max_claim_bytes,
                                              self.cipher is not None)
            if not due:
                return None
            woken, done = await self._push(conn, due)
            await timer_procs.mark_fired(conn, [t.queue_id for t in due[:done]],
                                         [t.timer_key for t in due[:done]])
        return due, woken, done

    # ------------------------------------------------------------------ push
    def _frame(self, t: DueTimer) -> bytes | None:
        try:
            payload = payload_json(t.payload, t.payload_zstd, self.max_decompressed)
        except Exception as ex:
            # NOTE(timers): validated at scheduling, so only a damaged row gets here; it is
            # marked fired without a message rather than retried forever.
            log.error("%s: timer %r of queue %r has an unreadable payload, dropped: %r",
                      self.name, t.timer_key, t.queue, ex)
            return None
        encrypted = False
        if t.encrypted:
            if self.cipher is None:  # not claimed without a key; the queue changed since
                raise RuntimeError(f"queue {t.queue!r} is encrypted and this broker has no key")
            payload, encrypted = self.cipher.encrypt(payload), True
        return wf.pack_frame(t.message_id, t.transaction_id.encode("utf-8"), payload,
                             producer_sub=t.producer_sub, encrypted=encrypted)

    async def _push(self, conn: Conn, due: list[DueTimer]
                    ) -> tuple[set[tuple[bytes, str]], int]:
        """Push the messages of the first claimed timers, up to ``max_round_bytes`` of frames
        (decompressed payloads can be far larger than the stored bytes the claim counted).

        Returns the (tenant, queue) pairs that got a message and how many timers of ``due``
        (a prefix) were handled; the rest stay pending for the next round.
        """
        segments: dict[SegmentKey, list[tuple[bytes, bytes]]] = {}  # -> [(hash, frame)]
        seen: set[tuple[SegmentKey, bytes]] = set()
        size = 0
        done = 0
        for t in due:
            if size >= self.max_round_bytes:
                break
            done += 1
            key = (t.tenant, t.queue, t.partition)
            h = txn_hash(t.transaction_id)
            if (key, h) in seen:
                continue  # the same transactionId twice in a partition: one message
            frame = self._frame(t)
            if frame is None:
                continue
            seen.add((key, h))
            size += len(frame)
            segments.setdefault(key, []).append((h, frame))
        woken: set[tuple[bytes, str]] = set()
        for _ in range(_MAX_PUSH_ROUNDS):
            if not segments:
                return woken, done
            keys = list(segments)
            results = await timer_procs.push_multi(
                conn, [k[1] for k in keys], [k[2] for k in keys],
                [len(segments[k]) for k in keys],
                [b"".join(h for h, _ in segments[k]) for k in keys],
                [wf.pack_chunk_zstd(b"".join(f for _, f in segments[k]), len(segments[k]))
                 for k in keys],
                [k[0] for k in keys])
            retry: dict[SegmentKey, list[tuple[bytes, bytes]]] = {}
            for key, res in zip(keys, results, strict=True):
                if res.queued:
                    woken.add((key[0], key[1]))
                    continue
                dups = {i for i, _ in res.duplicates}
                rest = [x for i, x in enumerate(segments[key]) if i not in dups]
                if log.isEnabledFor(logging.DEBUG):
                    for i in sorted(dups):
                        log.debug("%s: timer message %s already stored in %r/%r", self.name,
                                  uuid_text(segments[key][i][1][5:21]), key[1], key[2])
                if rest:
                    retry[key] = rest
            segments = retry
        raise RuntimeError(f"timer segments still duplicate after {_MAX_PUSH_ROUNDS} rounds")

    # ------------------------------------------------------------------ housekeeping
    async def close(self) -> None:
        await self.db.drop()

    _drop_connection = close  # the name tests/integration/test_timers.py ends a firer with

    async def _maybe_purge(self) -> None:
        now = time.monotonic()
        if now - self._purged_at < self.purge_every_s:
            return
        self._purged_at = now
        total = 0
        for _ in range(10):
            n = await self.db.run(lambda conn: timer_procs.purge(conn, self.retention_s),
                                  commit_sent=True)
            total += n
            if n < 10_000:
                break
        if total:
            log.info("%s: forgot %d fired/cancelled timers older than %ds", self.name, total,
                     self.retention_s)
