"""What the supervisor imports before it forks its children, so that they share it.

Every front worker is a fork of the supervisor (gunicorn's arbiter runs in it) and so is every
shard (``queen_mp/processes/forked.py``). A module imported after the fork is imported once per
child, into memory of its own: psycopg, falcon, uvicorn, prometheus_client, numpy and the
broker's own modules were 20-30 MB of private memory in each front worker and shard. Imported
here, once, their pages are shared copy-on-write by every child, and ``gc.freeze`` keeps the
children's collections from writing into them (a collection writes to the header of every
object it walks, which would copy each page it touches).

Nothing that may not cross a fork is made here: importing these modules opens no connection,
starts no thread and no event loop (tests/unit/test_preload.py checks that the process still
has one thread and no new descriptor). Two settings must be in place first:
``PROMETHEUS_MULTIPROC_DIR`` (prometheus_client picks its value mode at import; the supervisor
sets it at boot) and ``OPENBLAS_NUM_THREADS=1``, set here: numpy's OpenBLAS would otherwise
start a thread pool at import, and the supervisor must stay single-threaded to fork (the
broker calls no BLAS routine).

The preload also fills, once, what every front worker would otherwise read and build for
itself while it builds its app (``_warm``): a worker's parse of the OpenAPI document and
``mimetypes``' tables (now the built-in ones) left 1.5-2 MB of private pages in each worker
(the parse's objects are freed, their pages stay dirty), shared when made here. That is idle
memory: a loaded worker reuses such pages, so at the peak of 1,000-item pushes the broker's
sum (with the freeze before each fork, ``ForkedChild.start``) was 1-2 MB lower, against 3-5
MB at light load.

``serve`` runs at optimization level 2 (``QUEEN_OPTIMIZE``, ``queen_mp/processes/cli.py``), so
this image carries no docstrings: 2.9 MB less of it than at level 0.

New front workers (SIGHUP, a worker replaced) are forks of this same process, so they run the
code it loaded: an upgrade is a restart of the service, as it already was for the shards and
the supervisor.
"""

from __future__ import annotations

import importlib
import mimetypes
import os

from queen_mp.heap import bounded_caches, freeze_startup_objects, request_caches

__all__ = ["PRELOADED", "preload"]

#: The entry modules of the children: the front worker's app and worker class, with what
#: uvicorn imports when a worker boots (its lifespan, loop and websocket set-ups: the options
#: ``auto`` and ``on`` of ``uvicorn.config``), and the shard's main loop.
PRELOADED = (
    "queen_mp.http.app",
    "queen_mp.processes.uvworker",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "uvicorn.loops.uvloop",
    "uvicorn.protocols.websockets.auto",
    "queen_mp.shards.process",
)


def preload() -> None:
    """Import ``PRELOADED``, fill the front workers' startup caches, list their request
    caches (``queen_mp.heap.request_caches``) and freeze everything alive; run once, before
    the first fork."""
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    for name in PRELOADED:
        importlib.import_module(name)
    _warm()
    request_caches[:] = bounded_caches("queen_mp.")
    freeze_startup_objects()


def _warm() -> None:
    """What each front worker would read and build for itself while it builds its app: the
    OpenAPI document (read and parsed once, then cached); and ``mimetypes`` marked ready with
    its built-in table, which falcon's response options copy (they call ``mimetypes.init``
    unless it ran).

    PERF(memory): ``mimetypes.init`` reads the system's tables (1,550 types from
    /etc/mime.types, against 149 built in) and falcon copies them into every app for its
    static routes, which the broker has none of: each worker's copy wrote the reference count
    of some 3,000 strings spread over 100+ inherited pages (a private copy of each). No
    module of the broker guesses a type from a file name."""
    from queen_mp.http.openapi import document_bytes  # with the app (PRELOADED), not before

    mimetypes.inited = True
    document_bytes()
