"""Disk spool: the durable fallback behind a ``buffered`` push verdict.

When a push cannot be committed to PostgreSQL (maintenance mode, or its bundle failed), every
affected item is appended here and fsynced before the client hears ``buffered`` (docs/api.md §1.8,
§2.1). A drain replays the records through the normal push path later; PostgreSQL dedup on the
preserved transactionId makes a replay idempotent, so a crash between a replay and its
``mark_done`` costs a duplicate attempt, never a duplicate message.

KNOWN ISSUE: that holds only while the queue deduplicates. With ``dedupWindow`` 0 the push
procedures do not probe, so a record whose original bundle did commit after all (a statement
timeout or a connection lost after COMMIT: the client heard ``buffered``, the bundle committed
anyway), or a replay that committed just before a crash cut off its ``mark_done``, is stored
twice, both times under the same messageId. The drain (``queen_mp/front/spooldrain.py``) cannot
tell; the SQL push procedures are deliberately left unchanged.

Directory layout (one spool directory per broker instance, on local disk)::

    spool-<writer-id>-<file-seq>.log          records of one writer process, appended only by it
    spool-<writer-id>-<file-seq>.done         drain progress in that log, written by the drain
    spool-<writer-id>-<file-seq>.log.corrupt  a log whose file header is unreadable, set aside
    .tmp-*                                    creations and renames in flight
    drain.lock                                flock of the one SpoolReader allowed at a time

Log format, integers little-endian like docs/api.md §3::

    file header, 48 bytes
       0  4s   magic b"QSPF"
       4  u8   version (1)
       5  3x   zero
       8  u64  salt            random per file, seeds every checksum of the file
      16  u64  first_seq       sequence number of the file's first record
      24  u64  committed_end   commit hint: records below this offset are fsynced
      32  u64  next_seq        commit hint: sequence number of the next record
      40  u64  header_check    xxh3_64(bytes 0..40, seed=salt); bytes 24..48 are rewritten
                               in place after every append
    then records back to back, each
       0  4s   magic b"QSPR"
       4  u8   version (1)
       5  u32  payload length
       9  u64  sequence        per writer: +1 a record, continued across its files
      17  u64  checksum        xxh3_64(record bytes 0..17 + payload, seed=salt)
      25  ...  payload

    .done file, 24 bytes: u64 done_end, u64 next_seq, u64 xxh3_64(the first 16 bytes)

Concurrency, which is why the format looks like this:

- Each writer process appends only to its own file family, so appends need no cross-process
  locking. A writer holds an exclusive flock on its current file from before the file gets its
  public name until it rotates away or exits; the kernel drops the lock when the process dies.
  A log nobody locks is therefore sealed for good, and only sealed logs are ever deleted.
- A record that is complete on disk is not yet promised to anyone: its append may still fail to
  fsync and be rolled back, and then the client hears ``failed``. So a writer rewrites the commit
  hint after each fsync, and a drain reads a live writer's file only up to ``committed_end``.
  A sealed file is read to its end and the hint is ignored: the hint itself is fsynced only with
  the next append, and after a crash its records are still worth replaying.
- The salt makes a checksum unforgeable by payload bytes, so resynchronising after a corrupt
  record cannot pick up a fake record smuggled inside a payload (say, a transactionId).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import heapq
import logging
import os
import re
import struct
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import BinaryIO, Self

import xxhash

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "MAX_RECORD_BYTES",
    "SpoolBusyError",
    "SpoolDecodeError",
    "SpoolError",
    "SpoolItem",
    "SpoolPosition",
    "SpoolReader",
    "SpoolStats",
    "SpoolWriteError",
    "SpoolWriter",
    "spool_stats",
]

log = logging.getLogger("queen_mp.spool")

DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024
# NOTE(spool): far above any push body (64 MiB); a larger length field can only be corruption,
# and the reader must not allocate what a flipped bit asks for.
MAX_RECORD_BYTES = 1 << 30

_VERSION = 1
_FILE_MAGIC = b"QSPF"
_RECORD_MAGIC = b"QSPR"
_FILE_HEAD = struct.Struct("<4sB3xQQQQ")  # magic, version, salt, first_seq, committed_end, next_seq
_HINT_OFFSET = 24  # committed_end, next_seq and the check: what each append rewrites
_FILE_HEADER_SIZE = _FILE_HEAD.size + 8
_REC_PREFIX = struct.Struct("<4sBIQ")  # magic, version, length, sequence
_REC_CHECK = struct.Struct("<Q")
_REC_HEADER_SIZE = _REC_PREFIX.size + _REC_CHECK.size
_DONE = struct.Struct("<QQQ")  # done_end, next_seq, check

_NAME_RE = re.compile(
    r"spool-(?P<writer>[A-Za-z0-9_.-]+)-(?P<seq>[0-9]+)\.(?P<ext>log|done|log\.corrupt)"
)
_WRITER_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TMP_PREFIX = ".tmp-"
_LOCK_NAME = "drain.lock"
# NOTE(spool): a writer's creation temp lives for microseconds; one this old lost its process.
_STALE_TMP_SECONDS = 60.0
_READ_BUFFER = 1 << 20
_RESYNC_CHUNK = 1 << 20
_HINT_READ_TRIES = 3


class SpoolError(Exception):
    """Base of every spool error.

    Exception tree::

        SpoolError
         ├── SpoolWriteError   an append is not durable: answer its items `failed`
         ├── SpoolBusyError    another drain holds the directory
         └── SpoolDecodeError  SpoolItem bytes that do not decode (also a ValueError)
    """


class SpoolWriteError(SpoolError):
    """An append did not become durable and none of its records will ever be read back.

    The push path answers ``failed`` (``spool_write_failed``) for the items of that append.
    ``errno`` is the OS error number when there was one (ENOSPC, EACCES...).
    """

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno


class SpoolBusyError(SpoolError):
    """Another SpoolReader holds the directory; two drains would replay the same records."""


class SpoolDecodeError(SpoolError, ValueError):
    """Bytes that are not a SpoolItem; ``data`` keeps them for the log line or a dead letter."""

    def __init__(self, message: str, data: bytes) -> None:
        super().__init__(message)
        self.data = data


# ---------------------------------------------------------------------------------------------
# SpoolItem: the record payload both the push path and the drain agree on
# ---------------------------------------------------------------------------------------------

_ITEM_HEAD = struct.Struct("<BB16s16s")  # version, flags, tenant, message_id
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_ITEM_TRACE = 1
_ITEM_SUB = 2
_ITEM_ACCEPTED = 4
_U64 = struct.Struct("<Q")
_U16_MAX = 0xFFFF


@dataclass(frozen=True, slots=True)
class SpoolItem:
    """One pushed item as the drain needs it to replay the push.

    ``payload`` is the whole stored message frame of docs/api.md §3.1. The frame already carries the
    message id, trace id, transactionId and producerSub; they are repeated here so the drain can
    route, deduplicate and log without parsing frames, which only ``queen_mp.wire`` does.

    Encoding, little-endian::

        u8 version (1) | u8 flags (1 = trace id, 2 = producer_sub, 4 = accept time)
        | 16B tenant | 16B message id | [u64 accepted_us] | [16B trace id] | u16+str queue
        | u16+str partition | u16+str transaction id | [u16+str producer_sub] | u32 len + frame

    ``accepted_us`` (Unix us, 0: unknown, a record of an older build) is when the push was
    accepted into the spool: the drain replays the records of every file, and of every
    instance, in that order (``SpoolReader.iter_pending``, front/spooldrain.py).
    """

    tenant: bytes
    queue: str
    partition: str
    message_id: bytes
    transaction_id: str
    trace_id: bytes | None
    payload: bytes
    producer_sub: str | None = None
    accepted_us: int = 0

    def __post_init__(self) -> None:
        # NOTE(spool): fail at construction, in the request that made the item, rather than at
        # encode time in the middle of a spool write.
        if len(self.tenant) != 16 or len(self.message_id) != 16:
            raise ValueError("tenant and message_id must be 16 bytes")
        if self.trace_id is not None and len(self.trace_id) != 16:
            raise ValueError("trace_id must be 16 bytes or None")
        if len(self.payload) > MAX_RECORD_BYTES:
            raise ValueError("payload too large for a spool record")

    def encode(self) -> bytes:
        """Pack the item for ``SpoolWriter.append``; ``decode`` gives it back equal."""
        flags = (_ITEM_TRACE if self.trace_id is not None else 0) | (
            _ITEM_SUB if self.producer_sub is not None else 0
        ) | (_ITEM_ACCEPTED if self.accepted_us else 0)
        parts = [_ITEM_HEAD.pack(_VERSION, flags, self.tenant, self.message_id)]
        if self.accepted_us:
            parts.append(_U64.pack(self.accepted_us))
        if self.trace_id is not None:
            parts.append(self.trace_id)
        texts = [self.queue, self.partition, self.transaction_id]
        if self.producer_sub is not None:
            texts.append(self.producer_sub)
        for text in texts:
            raw = text.encode()
            if len(raw) > _U16_MAX:
                raise ValueError("string field longer than 65535 bytes")
            parts += (_U16.pack(len(raw)), raw)
        parts += (_U32.pack(len(self.payload)), self.payload)
        return b"".join(parts)

    @classmethod
    def decode(cls, data: bytes) -> SpoolItem:
        """Unpack what ``encode`` made; anything else, trailing bytes included, is an error."""
        try:
            version, flags, tenant, message_id = _ITEM_HEAD.unpack_from(data, 0)
            if version != _VERSION:
                raise SpoolDecodeError(f"unknown spool item version {version}", data)
            if flags & ~(_ITEM_TRACE | _ITEM_SUB | _ITEM_ACCEPTED):
                raise SpoolDecodeError(f"unknown spool item flags {flags:#x}", data)
            pos = _ITEM_HEAD.size
            accepted_us = 0
            if flags & _ITEM_ACCEPTED:
                (accepted_us,) = _U64.unpack_from(data, pos)
                pos += 8
            trace_id = None
            if flags & _ITEM_TRACE:
                trace_id = data[pos : pos + 16]
                if len(trace_id) != 16:
                    raise SpoolDecodeError("spool item truncated in trace id", data)
                pos += 16
            texts = []
            for _ in range(4 if flags & _ITEM_SUB else 3):
                (n,) = _U16.unpack_from(data, pos)
                raw = data[pos + 2 : pos + 2 + n]
                if len(raw) != n:
                    raise SpoolDecodeError("spool item truncated in a string", data)
                texts.append(raw.decode())
                pos += 2 + n
            (n,) = _U32.unpack_from(data, pos)
            pos += 4
            if pos + n != len(data):
                raise SpoolDecodeError("spool item frame length does not match", data)
            payload = data[pos:]
            return cls(
                tenant=tenant,
                queue=texts[0],
                partition=texts[1],
                message_id=message_id,
                transaction_id=texts[2],
                trace_id=trace_id,
                payload=payload,
                producer_sub=texts[3] if len(texts) == 4 else None,
                accepted_us=accepted_us,
            )
        except SpoolDecodeError:
            raise
        except (struct.error, UnicodeDecodeError) as ex:
            raise SpoolDecodeError(f"malformed spool item: {ex}", data) from ex

    @staticmethod
    def accepted_us_of(data: bytes) -> int:
        """The accept time of an encoded item without decoding it; 0 if it has none (or is
        not an item: the drain rejects it when it decodes it)."""
        if len(data) < _ITEM_HEAD.size + 8 or data[0] != _VERSION or not data[1] & _ITEM_ACCEPTED:
            return 0
        return int(_U64.unpack_from(data, _ITEM_HEAD.size)[0])


# ---------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------


def _record_checksum(prefix: bytes, payload: bytes, salt: int) -> int:
    hasher = xxhash.xxh3_64(prefix, seed=salt)
    hasher.update(payload)
    return hasher.intdigest()


def _pack_file_header(salt: int, first_seq: int, committed_end: int, next_seq: int) -> bytes:
    body = _FILE_HEAD.pack(_FILE_MAGIC, _VERSION, salt, first_seq, committed_end, next_seq)
    return body + _REC_CHECK.pack(xxhash.xxh3_64_intdigest(body, seed=salt))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(errno.EIO, "write made no progress")
        view = view[written:]


def _unlink_missing_ok(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_locked(fd: int) -> bool:
    """True while a live writer holds the file; flock conflicts even inside one process."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    fcntl.flock(fd, fcntl.LOCK_UN)
    return False


def _done_path(log_path: str) -> str:
    return log_path[: -len(".log")] + ".done"


@dataclass(frozen=True, slots=True)
class _FileHeader:
    """A log's header; ``verified`` is false when its check failed, and then only the salt
    (needed to verify records at all) is worth anything."""

    salt: int
    first_seq: int
    committed_end: int
    next_seq: int
    verified: bool


def _read_file_header(fd: int) -> _FileHeader | None:
    """The header of a log, or None if the file does not start with one.

    A failed check is retried: a reader can catch the in-place rewrite half done.
    """
    for _ in range(_HINT_READ_TRIES):
        data = os.pread(fd, _FILE_HEADER_SIZE, 0)
        if len(data) < _FILE_HEADER_SIZE:
            return None
        magic, version, salt, first_seq, committed_end, next_seq = _FILE_HEAD.unpack_from(data)
        if magic != _FILE_MAGIC or version != _VERSION:
            return None
        (check,) = _REC_CHECK.unpack_from(data, _FILE_HEAD.size)
        if xxhash.xxh3_64_intdigest(data[: _FILE_HEAD.size], seed=salt) == check:
            return _FileHeader(salt, first_seq, committed_end, next_seq, True)
    return _FileHeader(salt, first_seq, committed_end, next_seq, False)


def _read_done(log_path: str) -> tuple[int, int] | None:
    """(done_end, next_seq) recorded for a log, or None to start from its first record."""
    path = _done_path(log_path)
    try:
        with open(path, "rb") as f:
            data = f.read(_DONE.size + 1)
    except FileNotFoundError:
        return None
    if len(data) == _DONE.size:
        done_end, next_seq, check = _DONE.unpack(data)
        if xxhash.xxh3_64_intdigest(data[:16]) == check:
            return done_end, next_seq
    # NOTE(spool): replaying the whole file is safe (PostgreSQL dedups on transactionId);
    # trusting a damaged offset could skip records.
    log.warning("spool: unreadable progress file %s; replaying %s from its start", path, log_path)
    return None


def _list_logs(directory: str) -> list[str]:
    """Log paths in replay order: by writer id, then file sequence (numerically)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    keyed = []
    for name in names:
        m = _NAME_RE.fullmatch(name)
        if m and m["ext"] == "log":
            keyed.append(((m["writer"], int(m["seq"])), os.path.join(directory, name)))
    keyed.sort()
    return [path for _, path in keyed]


# ---------------------------------------------------------------------------------------------
# Writer
# ---------------------------------------------------------------------------------------------


class SpoolWriter:
    """Appends records durably to this process's own file family in a spool directory.

    One writer per process (``writer_id`` such as ``w3-<pid>``): processes never share a file,
    so appends take no cross-process lock. ``append`` blocks on fsync; call it from a thread
    executor, not the event loop. Thread-safe: appends are serialised.

    The first file is created by the first append, so a worker that never spools leaves nothing
    behind, and an unusable directory surfaces as a ``SpoolWriteError`` the push path turns into
    ``failed`` rather than a worker that cannot boot.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        writer_id: str,
        *,
        fsync: bool = True,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    ) -> None:
        if not _WRITER_ID_RE.fullmatch(writer_id):
            raise ValueError(f"writer_id must match {_WRITER_ID_RE.pattern}: {writer_id!r}")
        if max_file_bytes <= _FILE_HEADER_SIZE:
            raise ValueError(f"max_file_bytes must exceed {_FILE_HEADER_SIZE}")
        self._directory = os.fspath(directory)
        self._writer_id = writer_id
        self._fsync = fsync
        self._max_file_bytes = max_file_bytes
        self._mutex = threading.Lock()
        self._fd: int | None = None
        self._pid = os.getpid()
        self._path: str | None = None
        self._salt = 0
        self._first_seq = 0
        self._size = 0
        self._next_file_seq: int | None = None
        self._seq = 0
        self._closed = False

    @property
    def path(self) -> str | None:
        """The file the next append goes to, if one is open."""
        return self._path

    def append(self, records: Sequence[bytes]) -> None:
        """Write every record, then fsync once: one request's items share one disk flush.

        On return all records are durable. On ``SpoolWriteError`` none of them will ever be
        read back: the file is cut back to its last good length, or, if even that fails,
        abandoned for a new one. ``ValueError`` if a record exceeds MAX_RECORD_BYTES.
        """
        if not records:
            return
        total = 0
        for record in records:
            if len(record) > MAX_RECORD_BYTES:
                raise ValueError(f"spool record of {len(record)} bytes over MAX_RECORD_BYTES")
            total += _REC_HEADER_SIZE + len(record)
        with self._mutex:
            if self._closed:
                raise SpoolWriteError("spool writer is closed")
            try:
                self._ensure_file(total)
            except OSError as ex:
                raise SpoolWriteError(
                    f"cannot create a spool file in {self._directory}: {ex}", errno=ex.errno
                ) from ex
            assert self._fd is not None
            data, next_seq = self._encode(records)
            path, start = self._path, self._size
            end = start + len(data)
            try:
                _write_all(self._fd, data)
                if self._fsync:
                    os.fsync(self._fd)
                header = _pack_file_header(self._salt, self._first_seq, end, next_seq)
                hint = header[_HINT_OFFSET:]
                if os.pwrite(self._fd, hint, _HINT_OFFSET) != len(hint):
                    raise OSError(errno.EIO, "short write of the commit hint")
            except OSError as ex:
                self._rollback(start)
                raise SpoolWriteError(
                    f"spool append to {path} failed: {ex}", errno=ex.errno
                ) from ex
            self._size = end
            self._seq = next_seq

    def close(self) -> None:
        """Release the current file; from now on it is sealed and the drain may delete it."""
        with self._mutex:
            self._closed = True
            self._seal()

    def release_if_drained(self) -> bool:
        """Seal the current file once the drain has replayed every record of it, so that the
        drain's next pass deletes it; True if it did. Without this a drained file keeps its
        disk space until it rotates at ``max_file_bytes``, and a spool that filled its disk
        stays full: pushes answer 507 before they can append (issue 29, fault 6). The next
        append opens a new file."""
        with self._mutex:
            if self._fd is None or self._path is None or self._size <= _FILE_HEADER_SIZE:
                return False
            done = _read_done(self._path)
            if done is None or done[0] < self._size:
                return False
            self._seal()
            return True

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _encode(self, records: Sequence[bytes]) -> tuple[bytes, int]:
        seq = self._seq
        parts: list[bytes] = []
        for payload in records:
            prefix = _REC_PREFIX.pack(_RECORD_MAGIC, _VERSION, len(payload), seq)
            check = _record_checksum(prefix, payload, self._salt)
            parts += (prefix, _REC_CHECK.pack(check), payload)
            seq += 1
        # PERF(spool): one buffer, so an append is usually one write(2) and one fsync(2).
        return b"".join(parts), seq

    def _ensure_file(self, incoming: int) -> None:
        if self._fd is not None and self._pid != os.getpid():
            # NOTE(spool): a descriptor inherited across fork shares its offset and its lock
            # with the parent; appending through it would interleave two processes' records.
            os.close(self._fd)
            self._fd = self._path = None
        if (
            self._fd is not None
            and self._size > _FILE_HEADER_SIZE
            and self._size + incoming > self._max_file_bytes
        ):
            self._seal()
        if self._fd is None:
            self._open_file()

    def _open_file(self) -> None:
        """Create, lock and only then publish a new file, so no reader ever sees it unlocked.

        A published file nobody locks is sealed for good and deletable once drained; were the
        lock taken after the name appeared, a drain could delete the file in between.
        """
        os.makedirs(self._directory, exist_ok=True)
        if self._next_file_seq is None:
            self._next_file_seq = self._last_file_seq() + 1
        while True:
            name = f"spool-{self._writer_id}-{self._next_file_seq:010d}.log"
            self._next_file_seq += 1
            path = os.path.join(self._directory, name)
            tmp = os.path.join(self._directory, _TMP_PREFIX + name)
            if os.path.lexists(path):
                continue
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o640)
            except FileExistsError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                salt = int.from_bytes(os.urandom(8), "little")
                _write_all(fd, _pack_file_header(salt, self._seq, _FILE_HEADER_SIZE, self._seq))
                if self._fsync:
                    os.fsync(fd)
                # NOTE(spool): link, unlike rename, never replaces a file of the same name.
                os.link(tmp, path)
            except FileExistsError:
                _discard(fd, tmp)
                continue
            except BaseException:
                _discard(fd, tmp)
                raise
            try:
                os.unlink(tmp)
                if self._fsync:
                    _fsync_dir(self._directory)
            except BaseException:
                os.close(fd)
                raise
            self._fd, self._path, self._salt, self._size = fd, path, salt, _FILE_HEADER_SIZE
            self._first_seq = self._seq
            self._pid = os.getpid()
            return

    def _last_file_seq(self) -> int:
        """Highest file sequence this writer id ever used, progress and quarantined files too.

        A new log must never take the name of a log whose stale ``.done`` is still around:
        the drain would skip its first records as already replayed.
        """
        last = 0
        for name in os.listdir(self._directory):
            m = _NAME_RE.fullmatch(name.removeprefix(_TMP_PREFIX))
            if m and m["writer"] == self._writer_id:
                last = max(last, int(m["seq"]))
        return last

    def _rollback(self, good_length: int) -> None:
        """Cut a failed append off so the next one does not follow a half record."""
        assert self._fd is not None
        try:
            os.ftruncate(self._fd, good_length)
            os.lseek(self._fd, good_length, os.SEEK_SET)
            if self._fsync:
                os.fsync(self._fd)
        except OSError:
            # NOTE(spool): the tail may keep whole records of the failed append; sealed, the
            # file is read to its end, so they may be replayed although the client heard
            # `failed`. Redelivery is preferred to loss, and a half record is never followed.
            log.exception("spool: cannot roll back %s; abandoning it", self._path)
            self._seal()

    def _seal(self) -> None:
        if self._fd is None:
            return
        fd, self._fd, self._path = self._fd, None, None
        try:
            os.close(fd)
        except OSError:
            log.warning("spool: close failed", exc_info=True)


def _discard(fd: int, tmp: str) -> None:
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(tmp)


# ---------------------------------------------------------------------------------------------
# Reader (drain support)
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpoolPosition:
    """Where one record sits; hand it back to ``SpoolReader.mark_done`` once replayed.

    ``final`` is true for the last record of a sealed file (its writer rotated away or is
    gone): marking it done deletes the file instead of recording progress.
    """

    path: str
    offset: int
    end: int
    sequence: int
    final: bool


@dataclass(frozen=True, slots=True)
class _Record:
    offset: int
    end: int
    sequence: int
    payload: bytes


class SpoolReader:
    """The drain's handle on a spool directory: pending records and durable progress.

    Holds an exclusive flock on ``drain.lock`` for its lifetime: a second reader raises
    ``SpoolBusyError`` instead of replaying the same records. Replay is at-least-once at crash
    boundaries (between a replay and its ``mark_done``) and the push path's dedup on
    transactionId turns that into exactly-once storage.
    """

    def __init__(self, directory: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self._directory = os.fspath(directory)
        self._fsync = fsync
        self._done: dict[str, int] = {}
        os.makedirs(self._directory, exist_ok=True)
        lock_path = os.path.join(self._directory, _LOCK_NAME)
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SpoolBusyError(f"another drain holds {lock_path}") from None
        self._lock_fd: int | None = fd

    def iter_pending(self) -> Iterator[tuple[SpoolPosition, bytes]]:
        """Every record not yet marked done, in accept-time order across files (each file in
        its own order; ties and records without an accept time by (writer id, file sequence)).

        A writer appends in accept-time order (front/spoolhold.py stamps under its lock), so
        merging the files keeps every producer's order: an item answered before another was
        sent was stamped before it, whichever front worker's file holds each one.

        Files appearing during the pass wait for the next one. A live writer's file is read up
        to its last fsynced append; a sealed one to its end. A torn tail or a corrupt record is
        logged and never yielded: after a bad record the reader resynchronises on the next
        offset where a whole record verifies (magic, lengths, salted checksum) with a sequence
        number above the last good one, and a file with no such record left ends there.
        A sealed file with nothing left to replay is deleted.
        """
        self._check_open()
        self._sweep()
        streams = [self._iter_file(path) for path in _list_logs(self._directory)]
        # NOTE(spool): a file's records come in its order (its watermark needs that); the
        # merge key only picks which file's next record goes first.
        yield from heapq.merge(*streams, key=_accept_key)

    def mark_done(self, position: SpoolPosition) -> None:
        """Record that everything in ``position``'s file up to and including it is replayed.

        A per-file watermark, not a per-record flag: call it once per replayed batch with the
        batch's last position in each file it touched. Each call costs a file fsync and a
        directory fsync, except for a ``final`` position, which deletes the file instead.
        """
        self._check_open()
        try:
            if position.final:
                self._delete(position.path)
                return
            if self._done.get(position.path, -1) >= position.end:
                return
            body = _DONE.pack(position.end, position.sequence + 1, 0)[:16]
            data = body + _REC_CHECK.pack(xxhash.xxh3_64_intdigest(body))
            self._atomic_write(_done_path(position.path), data)
        except OSError as ex:
            raise SpoolError(f"cannot record spool progress for {position.path}: {ex}") from ex
        self._done[position.path] = position.end

    def close(self) -> None:
        """Let another drain take the directory."""
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._lock_fd is None:
            raise SpoolError("spool reader is closed")

    def _iter_file(self, path: str) -> Iterator[tuple[SpoolPosition, bytes]]:
        try:
            f = open(path, "rb", buffering=_READ_BUFFER)  # noqa: SIM115 (closed below)
        except FileNotFoundError:
            return
        with f:
            fd = f.fileno()
            # NOTE(spool): liveness first, size after: a file found unlocked is never written
            # again, so the size read next is final.
            live = _is_locked(fd)
            header = _read_file_header(fd)
            if header is None:
                if live:
                    log.warning("spool: %s has no valid file header; skipped", path)
                else:
                    self._quarantine(path)
                return
            done = _read_done(path)
            start: int = _FILE_HEADER_SIZE
            next_seq = header.first_seq if header.verified else None
            if done is not None:
                start, next_seq = done
            self._done[path] = start
            if not live:
                limit = os.fstat(fd).st_size
            elif not header.verified:
                log.warning("spool: header of %s does not verify; waiting for it", path)
                return
            else:
                limit = header.committed_end
            records = _scan(f, path, header.salt, start, next_seq, limit, live)
            prev = next(records, None)
            if prev is None:
                if not live:
                    self._delete(path)
                return
            for record in records:
                yield SpoolPosition(path, prev.offset, prev.end, prev.sequence, False), prev.payload
                prev = record
            yield SpoolPosition(path, prev.offset, prev.end, prev.sequence, not live), prev.payload

    def _delete(self, path: str) -> None:
        _unlink_missing_ok(path)
        if self._fsync:
            # NOTE(spool): the log must be gone for good before its progress file goes, or a
            # crash in between could bring the log back without it and replay it whole.
            _fsync_dir(self._directory)
        _unlink_missing_ok(_done_path(path))
        self._done.pop(path, None)

    def _quarantine(self, path: str) -> None:
        log.error("spool: %s has no valid file header; set aside as .corrupt", path)
        try:
            os.rename(path, path + ".corrupt")
        except FileNotFoundError:
            return
        _unlink_missing_ok(_done_path(path))
        self._done.pop(path, None)

    def _atomic_write(self, path: str, data: bytes) -> None:
        tmp = os.path.join(self._directory, _TMP_PREFIX + os.path.basename(path))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o640)
        try:
            _write_all(fd, data)
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        if self._fsync:
            _fsync_dir(self._directory)

    def _sweep(self) -> None:
        """Remove leftovers of crashes: progress files without a log, abandoned temp files."""
        try:
            names = os.listdir(self._directory)
        except FileNotFoundError:
            return
        present = set(names)
        now = time.time()
        for name in names:
            path = os.path.join(self._directory, name)
            match = _NAME_RE.fullmatch(name)
            try:
                if name.startswith(_TMP_PREFIX) and name.endswith(".done"):
                    os.unlink(path)  # NOTE(spool): only the lock holder writes these
                elif name.startswith(_TMP_PREFIX):
                    stale = now - os.stat(path).st_mtime > _STALE_TMP_SECONDS
                    if stale and not _path_locked(path):
                        os.unlink(path)
                elif match and match["ext"] == "done" and f"{name[:-5]}.log" not in present:
                    os.unlink(path)
            except FileNotFoundError:
                continue


def _accept_key(entry: tuple[SpoolPosition, bytes]) -> int:
    return SpoolItem.accepted_us_of(entry[1])


def _path_locked(path: str) -> bool:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _is_locked(fd)
    finally:
        os.close(fd)


def _scan(
    f: BinaryIO, path: str, salt: int, start: int, next_seq: int | None, limit: int, live: bool
) -> Iterator[_Record]:
    """Valid records in [start, limit), resynchronising past corrupt ones.

    ``next_seq`` is the sequence number expected at ``start`` (None: unknown, take any).
    """
    offset = start
    expected = -1 if next_seq is None else next_seq
    while offset < limit:
        record = _parse_at(f, offset, limit, salt)
        if record is None or record.sequence < expected:
            record = _resync(f, offset + 1, limit, salt, expected)
            if record is None:
                what = "unreadable committed bytes" if live else "torn or corrupt tail"
                log.warning("spool: %s: %s at %d..%d skipped", path, what, offset, limit)
                return
            lost = f"records {expected}..{record.sequence - 1}" if expected >= 0 else "records"
            lost += " lost"
            log.warning(
                "spool: %s: corrupt bytes at %d..%d skipped (%s)", path, offset, record.offset, lost
            )
        elif record.sequence > expected >= 0:
            lost = f"records {expected}..{record.sequence - 1}"
            log.warning("spool: %s: %s missing before offset %d", path, lost, offset)
        yield record
        offset, expected = record.end, record.sequence + 1


def _parse_at(f: BinaryIO, offset: int, limit: int, salt: int) -> _Record | None:
    """The record at ``offset`` if it is whole, inside ``limit`` and verifies; else None."""
    if offset + _REC_HEADER_SIZE > limit:
        return None
    # PERF(spool): seeks inside the read buffer cost no syscall, so small records are cheap.
    f.seek(offset)
    header = f.read(_REC_HEADER_SIZE)
    if len(header) < _REC_HEADER_SIZE:
        return None
    magic, version, length, sequence = _REC_PREFIX.unpack_from(header, 0)
    if magic != _RECORD_MAGIC or version != _VERSION or length > MAX_RECORD_BYTES:
        return None
    end = offset + _REC_HEADER_SIZE + length
    if end > limit:
        return None
    payload = f.read(length)
    if len(payload) < length:
        return None
    (check,) = _REC_CHECK.unpack_from(header, _REC_PREFIX.size)
    if _record_checksum(header[: _REC_PREFIX.size], payload, salt) != check:
        return None
    return _Record(offset, end, sequence, payload)


def _resync(f: BinaryIO, start: int, limit: int, salt: int, expected: int) -> _Record | None:
    """The first verifying record at or after ``start``; rare, so a plain forward search."""
    pos = start
    while pos < limit:
        f.seek(pos)
        chunk = f.read(min(_RESYNC_CHUNK, limit - pos))
        if len(chunk) < len(_RECORD_MAGIC):
            return None
        hit = chunk.find(_RECORD_MAGIC)
        while hit != -1:
            record = _parse_at(f, pos + hit, limit, salt)
            if record is not None and record.sequence >= expected:
                return record
            hit = chunk.find(_RECORD_MAGIC, hit + 1)
        # NOTE(spool): overlap by magic length - 1 so a magic split across chunks is found.
        pos += len(chunk) - (len(_RECORD_MAGIC) - 1)
    return None


# ---------------------------------------------------------------------------------------------
# Stats
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SpoolStats:
    """What /health, the spool endpoints and the ``queen_spool_pending`` gauge report."""

    pending: int
    files: int
    bytes: int


def spool_stats(directory: str | os.PathLike[str]) -> SpoolStats:
    """Pending records, log files and their bytes, without reading any record.

    Cost: per log file one stat, one 48-byte read and one small progress-file read, so a few
    syscalls per 64 MiB of spool. Pending is exact from the sequence numbers (commit hint
    minus progress); records of an append cut short by a crash are not counted although the
    drain will still replay them. A quarantined ``.corrupt`` file is not counted at all.
    """
    pending = files = total = 0
    for path in _list_logs(os.fspath(directory)):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        try:
            size = os.fstat(fd).st_size
            header = _read_file_header(fd)
        finally:
            os.close(fd)
        files += 1
        total += size
        if header is None or not header.verified:
            continue
        done = _read_done(path)
        done_seq = done[1] if done is not None else header.first_seq
        pending += max(0, header.next_seq - done_seq)
    return SpoolStats(pending=pending, files=files, bytes=total)
