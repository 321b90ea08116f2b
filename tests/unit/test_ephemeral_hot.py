"""The ephemeral push, pop and ack routes on the lean path (queen_mp/http/hot.py ``extra``,
queen_mp/http/ephemeral.py): answered byte for byte as falcon answers them, on fake backends
(a fused push stored, refused full or failed; a pop with messages, parked too long; an ack
with nothing to do), and the middleware's refusals. The database side runs in
tests/integration/test_ephemeral*.py through the real front."""

from __future__ import annotations

import json
from typing import Any

import pytest

from queen_mp.db import ephemeral_procs
from queen_mp.db.errors import OutcomeUnknown
from queen_mp.front.ephemeral import Popped, TooManyParked
from queen_mp.models.ephemeral import PopRequest, Push
from tests.unit.test_hot_routes import _app, _both


class FakeFusion:
    async def push(self, tenant: bytes, push: Push) -> int:
        if push.queue == "full":
            raise ephemeral_procs.QueueFull("the queue holds 5 messages")
        if push.queue == "lost":
            raise OutcomeUnknown("connection lost")
        return len(push.payloads)


class FakePopper:
    async def pop(self, tenant: bytes, r: PopRequest) -> Popped:
        if r.queue == "crowded":
            raise TooManyParked("1000 pops already parked in this worker")
        return Popped(b'[{"id":"0123456789abcdef-1-2","partition":"p","attempts":1,'
                      b'"payload":{"o":1}}]', 1)


def _ephemeral_app(tmp_path: Any, **env: str) -> Any:
    app = _app(tmp_path, **env)
    push = app.hot.extra[("POST", "/api/v1/ephemeral/push")].__self__
    pop = app.hot.extra[("GET", "/api/v1/ephemeral/pop")].__self__
    push.fusion = FakeFusion
    pop.service = FakePopper
    push.worker.waker = None  # no wake board in the fakes
    return app


def _push(queue: str, n: int = 2) -> bytes:
    return json.dumps({"queue": queue, "partition": "p",
                       "messages": [{"payload": {"i": i}} for i in range(n)]}).encode()


ANSWERS = [
    ("POST", "/api/v1/ephemeral/push", _push("q"), 201),
    ("POST", "/api/v1/ephemeral/push", _push("full"), 429),
    ("POST", "/api/v1/ephemeral/push", _push("lost"), 503),
    ("POST", "/api/v1/ephemeral/push", b"{not json", 400),
    ("POST", "/api/v1/ephemeral/push", b'{"queue": "q", "messages": [{"x": 1}]}', 400),
    ("GET", "/api/v1/ephemeral/pop?queue=q&batch=10", b"", 200),
    ("GET", "/api/v1/ephemeral/pop?queue=crowded&wait=true", b"", 429),
    ("GET", "/api/v1/ephemeral/pop?batch=10", b"", 400),
    ("POST", "/api/v1/ephemeral/ack", b'{"queue": "q", "acks": []}', 200),
    ("POST", "/api/v1/ephemeral/ack", b'{"queue": "q", "acks": [{"id": ""}]}', 400),
]


@pytest.mark.parametrize(("method", "target", "body", "status"), ANSWERS)
def test_an_ephemeral_route_answers_on_the_lean_path_what_falcon_answers(
        tmp_path: Any, method: str, target: str, body: bytes, status: int) -> None:
    sent = _both(_ephemeral_app(tmp_path), method, target, body)
    assert sent[0]["status"] == status
    if status == 201:
        assert json.loads(sent[1]["body"]) == {"pushed": 2}


def test_the_middleware_refuses_ephemeral_routes_on_the_lean_path_as_in_falcon(
        tmp_path: Any) -> None:
    app = _ephemeral_app(tmp_path, QUEEN_JWT_ENABLED="1", QUEEN_JWT_SECRET="s" * 32)
    assert _both(app, "POST", "/api/v1/ephemeral/push", _push("q"))[0]["status"] == 401
    assert _both(app, "GET", "/api/v1/ephemeral/pop?queue=q", b"",
                 [(b"authorization", b"Bearer not-a-token")])[0]["status"] == 401
    app = _ephemeral_app(tmp_path, QUEEN_MAX_BODY_MB="1")
    assert _both(app, "POST", "/api/v1/ephemeral/push",
                 b" " * ((1 << 20) + 1))[0]["status"] == 413


def test_only_push_pop_and_ack_of_the_ephemeral_routes_take_the_lean_path(
        tmp_path: Any) -> None:
    hot = _app(tmp_path).hot

    def match(method: str, path: str) -> bool:
        return hot.match({"method": method, "path": path, "query_string": b"",
                          "headers": [(b"content-length", b"2")]}) is not None

    assert match("POST", "/api/v1/ephemeral/push") and match("GET", "/api/v1/ephemeral/pop")
    assert match("POST", "/api/v1/ephemeral/ack")
    assert not match("GET", "/api/v1/ephemeral/push")
    assert not match("POST", "/api/v1/ephemeral/configure")
    assert not match("GET", "/api/v1/ephemeral/queues")
