"""The gunicorn worker class of the front: uvicorn's, plus a listening socket of its own.

Why: every worker accepts from the one socket the gunicorn master bound, and an idle event loop
takes every connection pending when it wakes. Connections opened in a burst (a consumer service
starting 8 connections, bench/suite.py's consume section) all landed on one worker, which ran
at 100% of a core while the other idled. With ``--reuse-port`` the master's socket joins a
SO_REUSEPORT group; each worker adds a socket of its own on the same address (and gunicorn's
``--backlog``) to that group, and the kernel spreads new connections over the group by their
address hash. A worker still serves the master's socket too, so whatever the kernel puts there
is accepted by whichever worker is free, as before. The options that select this worker are
``supervisor.FRONT_WORKER_ARGS``.
"""

from __future__ import annotations

import socket
from typing import Any

from uvicorn_worker import UvicornWorker

__all__ = ["BalancedUvicornWorker", "own_listeners"]


def own_listeners(inherited: list[Any], backlog: int) -> list[socket.socket]:
    """A SO_REUSEPORT socket on the address of each inherited TCP listener that has the option
    (a Unix socket, or a master started without ``--reuse-port``, gets none)."""
    out: list[socket.socket] = []
    for sock in inherited:
        family = sock.family
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT):
            continue
        own = socket.socket(family, socket.SOCK_STREAM)
        try:
            own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            own.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            own.bind(sock.getsockname())
            own.listen(backlog)
            own.setblocking(False)
        except OSError:
            own.close()
            continue
        out.append(own)
    return out


class BalancedUvicornWorker(UvicornWorker):
    def init_process(self) -> None:
        # NOTE(http): after fork, before the loop: the worker's own sockets join the group
        # only while it lives; its exit closes them (connections still queued on one are
        # reset, as on any listener closing).
        self.sockets = [*self.sockets, *own_listeners(self.sockets, self.cfg.backlog)]
        super().init_process()
