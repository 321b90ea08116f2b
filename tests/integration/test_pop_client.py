"""Issue 4: the published 2.6 client (``queen-mq``) consumes unchanged: its consume loop in JSON
and framed-pop modes, its pop/ack/renew calls, and lease renewal during a slow handler."""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
from queen import Queen

from tests.integration.test_push_json import uq


class CountingTransport(httpx.AsyncHTTPTransport):
    """The real transport, counting requests by path prefix and keeping pop content types."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: Counter[str] = Counter()
        self.pop_types: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle_async_request(request)
        path = request.url.path
        if path.startswith("/api/v1/pop"):
            self.pop_types.append(response.headers.get("content-type", ""))
        self.paths["/".join(path.split("/")[:4])] += 1
        if path.endswith("/extend"):
            self.paths["extend"] += 1
        return response


def _push(broker, queue: str, partitions: int, per: int) -> dict[str, list[str]]:
    sent: dict[str, list[str]] = {}
    for p in range(partitions):
        name = f"p{p}"
        items = [{"queue": queue, "partition": name, "transactionId": f"{name}-{i}",
                  "payload": {"p": name, "i": i}} for i in range(per)]
        r = broker.client.post("/api/v1/push", json={"items": items})
        assert r.status_code == 201
        sent[name] = [it["transactionId"] for it in items]
    return sent


def _committed(db, queue: str, group: str) -> dict[str, int]:
    rows = db.execute(
        "SELECT lp.name, c.committed_offset FROM queen.log_consumers c"
        " JOIN queen.log_partitions lp ON lp.id = c.partition_id"
        " JOIN queen.queues q ON q.id = lp.queue_id WHERE q.name = %s AND c.consumer_group = %s",
        (queue, group)).fetchall()
    return dict(rows)


async def _consume(broker, queue: str, group: str, limit: int, *, framed: bool,
                   transport: CountingTransport) -> list[dict]:
    seen: list[dict] = []

    async def handler(messages):
        batch = messages if isinstance(messages, list) else [messages]
        seen.extend(batch)

    async with Queen(broker.url, transport=transport, framed_pop=framed) as client:
        await asyncio.wait_for(
            client.queue(queue).group(group).batch(5).limit(limit).idle_millis(3000)
            .consume(handler), 60)
    return seen


def _check_consumed(seen: list[dict], sent: dict[str, list[str]]) -> None:
    by_partition: dict[str, list[str]] = {}
    for m in seen:
        by_partition.setdefault(m["partition"], []).append(m["transactionId"])
    assert by_partition == sent  # every message once, in partition order


def test_consume_loop_json(broker, db):
    q, g = uq("cc"), "workers"
    sent = _push(broker, q, 3, 7)
    transport = CountingTransport()
    seen = asyncio.run(_consume(broker, q, g, 21, framed=False, transport=transport))
    _check_consumed(seen, sent)
    assert all(m["data"]["p"] == m["partition"] for m in seen)
    assert _committed(db, q, g) == {"p0": 7, "p1": 7, "p2": 7}
    assert transport.paths["/api/v1/ack"] >= 1
    assert all(t.startswith("application/json") for t in transport.pop_types if t)


def test_consume_loop_framed_pop(broker, db):
    q, g = uq("cf"), "framed"
    sent = _push(broker, q, 2, 9)
    transport = CountingTransport()
    seen = asyncio.run(_consume(broker, q, g, 18, framed=True, transport=transport))
    _check_consumed(seen, sent)
    assert all(m["data"]["i"] == int(m["transactionId"].split("-")[1]) for m in seen)
    assert _committed(db, q, g) == {"p0": 9, "p1": 9}
    assert any(t == "application/x-queen-pop" for t in transport.pop_types)


def test_consume_renews_lease_during_slow_handler(broker, db):
    q, g = uq("cr"), "slow"
    _push(broker, q, 1, 3)
    db.execute("UPDATE queen.queues SET lease_time = 2 WHERE name = %s", (q,))
    transport = CountingTransport()
    attempts: list[int] = []

    async def handler(messages):
        batch = messages if isinstance(messages, list) else [messages]
        attempts.extend(m["deliveryAttempt"] for m in batch)
        await asyncio.sleep(3.5)  # longer than the 2 s lease: only renewal keeps it

    async def go():
        async with Queen(broker.url, transport=transport) as client:
            await asyncio.wait_for(
                client.queue(q).group(g).batch(3).limit(3).renew_lease(True, 500)
                .consume(handler), 60)

    asyncio.run(go())
    assert attempts == [1, 1, 1]  # delivered once, never redelivered
    assert transport.paths["extend"] >= 3
    assert _committed(db, q, g) == {"p0": 3}


def test_client_pop_ack_nack_and_commit_on_delivery(broker, db):
    q = uq("cp")
    _push(broker, q, 1, 4)

    async def go():
        async with Queen(broker.url) as client:
            first = await client.queue(q).group("g").batch(2).pop()
            nack = await client.ack(first[0], False, {"group": "g"})
            again = await client.queue(q).group("g").batch(2).pop()
            ok = await client.ack(again, True, {"group": "g"})
            renewed = await client.renew(again)
            auto = await client.queue(q).group("h").batch(4).commit_on_delivery().pop()
            return first, nack, again, ok, renewed, auto

    first, nack, again, ok, renewed, auto = asyncio.run(go())
    assert [m["offset"] for m in first] == [1, 2]
    assert nack["success"] is True
    # the failed ack released the lease: the same batch comes again, second attempt
    assert [m["offset"] for m in again] == [1, 2]
    assert [m["deliveryAttempt"] for m in again] == [2, 2]
    assert ok["success"] is True
    assert [r["success"] for r in renewed] == [False]  # the ack released the lease
    assert [m["offset"] for m in auto] == [1, 2, 3, 4]
    assert all(m["leaseId"] is None for m in auto)
    assert _committed(db, q, "g") == {"p0": 2}
    assert _committed(db, q, "h") == {"p0": 4}
