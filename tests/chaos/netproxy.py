"""A TCP proxy of the fault matrix's own between the broker and PostgreSQL, whose network it
breaks (issue 29, fault 7): these machines' kernels have no ``netem`` queueing discipline, so
the faults are made in user space, on the one path the broker's connections take.

Modes: ``pass`` forwards; ``blackhole`` holds every byte in both directions (connections stay
open and new ones are accepted, but nothing arrives: a network dropping every packet, whose
retransmissions get through once it heals); ``delay`` holds each chunk ``delay_s``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time

__all__ = ["NetProxy"]

_CHUNK = 1 << 16
_POLL_S = 0.005


class NetProxy:
    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.mode = "pass"
        self.delay_s = 0.0
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._closed = threading.Event()
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name="netproxy-accept", daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._server.close()
        with self._lock:
            for s in self._open:
                with contextlib.suppress(OSError):
                    s.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(_CHUNK)
                if not data:
                    break
                while self.mode == "blackhole" and not self._closed.is_set():
                    time.sleep(_POLL_S)
                if self.mode == "delay":
                    time.sleep(self.delay_s)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
