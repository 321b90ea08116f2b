"""``GET /api/v1/pop/queue/{queue}[/partition/{partition}]`` and ``GET /api/v1/pop``.

Parameters are checked strictly (docs/api.md 1.1, 2.2) before anything is claimed; the answer is
JSON, or ``QPF1`` with ``frames=true`` (docs/api.md 3.7) unless a claimed queue is encrypted (the
client rejects encrypted frames, so those answer JSON with decrypted ``data``).
"""

from __future__ import annotations

from typing import Any

import falcon
import falcon.asgi
import orjson

from queen_mp.db.errors import DatabaseError
from queen_mp.front.delivery import (
    Claim,
    Undeliverable,
    encode_qpf1,
    json_messages,
    unpack_messages,
)
from queen_mp.front.popper import Popped, PopRequest, TooManyParked
from queen_mp.front.worker import FrontWorker
from queen_mp.http.answer import Answer
from queen_mp.http.authz import tenant_of
from queen_mp.http.dbcall import api_error
from queen_mp.http.errors import (
    JSON_UTF8,
    InvalidRequest,
    Overloaded,
    Timeout,
    Unavailable,
    Unsupported,
)
from queen_mp.http.query import Query
from queen_mp.models.items import parse_group
from queen_mp.wire.binary_push import check_name, check_partition_name, check_queue_name
from queen_mp.wire.times import iso_ms

__all__ = ["PopResource"]

POP_CONTENT_TYPE = "application/x-queen-pop"
MAX_BATCH = 10_000
MAX_TIMEOUT_MS = 300_000
MAX_PARTITIONS = 10_000
AUTOPILOT_BATCH = 200
AUTOPILOT_WAIT_MS = 100
#: every subscriptionMode spelling upstream servers accept (case and surrounding blanks
#: ignored, as there), with its meaning: start from the log start, or after the current end.
#: ``timestamp`` is how a group's record names a start set by time; without subscriptionFrom
#: it starts from the log start, as upstream reads any mode it does not call "new".
SUB_MODES = {"": "all", "all": "all", "from_beginning": "all", "from-beginning": "all",
             "frombeginning": "all", "beginning": "all", "timestamp": "all",
             "new": "new", "new-only": "new-only", "new_only": "new-only", "newonly": "new-only"}


def _subscription(q: Query) -> tuple[str, Any]:
    given = q.text("subscriptionMode") or ""
    mode = SUB_MODES.get(given.strip().lower())
    if mode is None:
        raise InvalidRequest(f"subscriptionMode {given!r} is not one of "
                             f"{', '.join(m for m in SUB_MODES if m)}", field="subscriptionMode")
    start = q.text("subscriptionFrom")
    if start is None or start == "":
        return mode, None
    if start == "now":
        return "new", None
    if start == "beginning":
        return "all", None
    return "timestamp", q.time("subscriptionFrom")


class PopResource:
    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_get(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        (await self.answer(req.query_string, tenant_of(req), None, None)).apply(resp)

    async def on_get_queue(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                           queue: str) -> None:
        (await self.answer(req.query_string, tenant_of(req), queue, None)).apply(resp)

    async def on_get_partition(self, req: falcon.asgi.Request, resp: falcon.asgi.Response,
                               queue: str, partition: str) -> None:
        (await self.answer(req.query_string, tenant_of(req), queue, partition)).apply(resp)

    async def answer(self, query_string: str, tenant: bytes, queue: str | None,
                     partition: str | None) -> Answer:
        """The answer to a pop by ``tenant`` from ``queue`` (None: namespace or task
        discovery) and ``partition`` (None: any) with these query parameters."""
        request, frames, autopilot = _request(query_string, tenant, queue, partition)
        try:
            popped = await self.worker.popper.pop(request)
        except TooManyParked as ex:
            raise Overloaded(str(ex), headers={"Retry-After": "1"}) from None
        except TimeoutError:
            raise Timeout("pop timeout: the database did not answer in time") from None
        except DatabaseError as ex:
            raise api_error(ex) from None
        if popped is None:
            return Answer(204)
        return self._render(popped, request, frames, autopilot)

    def _render(self, popped: Popped, request: PopRequest, frames: bool, autopilot: bool
                ) -> Answer:
        """The answer with what ``popped`` claimed (its leases granted, its count counted).

        PERF(memory): not in ``answer``, whose frame a parked pop holds (its locals were 27
        slots of it)."""
        extra: dict[str, Any] = {}
        if autopilot:
            extra["autopilot"] = {"partitions": request.partitions, "batch": request.batch,
                                  "waitMs": AUTOPILOT_WAIT_MS}
        worker = self.worker
        limit = worker.config.max_decompressed_mb << 20
        hashes: dict[int, list[bytes]] = {}
        ids: dict[int, list[bytes]] = {}  # the JSON answer's transactionIds (Acker.granted)
        try:
            if frames and not any(c.encrypted for c in popped.claims):
                meta = {"success": True, "leaseExpiresAt": _expiry(popped.claims), **extra}
                body = encode_qpf1(popped.claims, queue=popped.claims[0].queue,
                                   lease_id=popped.lease_id, group=request.group, meta=meta)
                content_type = POP_CONTENT_TYPE
                if popped.lease_id is not None:
                    for claim in popped.claims:
                        hashes[claim.partition_id] = [
                            m.hash for m in unpack_messages(claim, None, limit, decrypt=False)]
            else:
                # PERF(pop): the answer's head dumped without its messages, which are
                # spliced in by the one join that copies them (a Fragment cost two more)
                head = orjson.dumps(_answer(popped, request.group, extra))
                body_parts = [head[:-1], b',"messages":[']
                for claim in popped.claims:
                    delivered = hashes[claim.partition_id] = []
                    texts = ids[claim.partition_id] = []
                    rendered = json_messages(claim, popped.lease_id, request.group,
                                             worker.cipher, limit, delivered, texts)
                    if rendered:
                        body_parts += (rendered, b",")
                if len(body_parts) > 2:
                    body_parts.pop()
                body_parts.append(b"]}")
                body = b"".join(body_parts)
                content_type = JSON_UTF8
        except Undeliverable as ex:
            raise Unavailable(f"cannot deliver: {ex}") from None
        if popped.lease_id is not None:
            granted = worker.grant_leases(request.tenant, popped.lease_id, request.group,
                                          popped.claims, hashes)
            for pid, distinct in granted.items():
                if pid in ids:
                    worker.acker.granted(popped.lease_id, pid, ids[pid], distinct)
        worker.count_popped(sum(c.count for c in popped.claims))
        return Answer(200, body, content_type)

#: ``_request``'s answers by its arguments, at most ``_REQUESTS_KEPT`` (the first ones go
#: first): a consumer asks the same pop, query string and all, again and again
_REQUESTS: dict[tuple[str, bytes, str | None, str | None], tuple[PopRequest, bool, bool]] = {}
_REQUESTS_KEPT = 1024


def _request(query_string: str, tenant: bytes, queue: str | None, partition: str | None
             ) -> tuple[PopRequest, bool, bool]:
    """``_parse``'s answer, kept (a frozen record, shared by the pops that ask alike).

    PERF(pop): the query parsed and checked, parameter by parameter, was 50k instructions of
    every pop (callgrind); a refused query is never kept, so it is refused every time."""
    key = (query_string, tenant, queue, partition)
    found = _REQUESTS.get(key)
    if found is None:
        found = _parse(query_string, tenant, queue, partition)
        if len(_REQUESTS) >= _REQUESTS_KEPT:
            del _REQUESTS[next(iter(_REQUESTS))]
        _REQUESTS[key] = found
    return found


def _parse(query_string: str, tenant: bytes, queue: str | None, partition: str | None
           ) -> tuple[PopRequest, bool, bool]:
    """The pop asked by these query parameters, and whether it asks for frames and autopilot;
    the parsed query stays here (NOTE(memory): a parked pop holds its caller's frame)."""
    if queue is not None:
        check_queue_name(queue)
    if partition is not None:
        check_partition_name(partition)
    q = Query(query_string)
    namespace = task = None
    if queue is None:
        namespace, task = q.text("namespace") or None, q.text("task") or None
        if namespace is None and task is None:
            raise InvalidRequest("a pop without a queue needs namespace or task",
                                 field="namespace")
        for name, value in (("namespace", namespace), ("task", task)):
            if value is not None:
                check_name(value, name)
    if q.flag("conflation", False):
        raise Unsupported("conflation=true is not implemented", field="conflation")
    autopilot = q.flag("autopilot", False)
    batch = q.integer("batch", AUTOPILOT_BATCH if autopilot else 1, minimum=1,
                      maximum=MAX_BATCH)
    partitions = 1 if partition is not None else q.integer(
        "partitions", 1, minimum=1, maximum=MAX_PARTITIONS)
    mode, start = _subscription(q)
    request = PopRequest(
        tenant=tenant, queue=queue, partition=partition, namespace=namespace, task=task,
        group=parse_group(q.text("consumerGroup")), batch=batch, partitions=partitions,
        wait=q.flag("wait", False),
        timeout_ms=q.integer("timeout", 30_000, minimum=0, maximum=MAX_TIMEOUT_MS),
        auto_ack=q.flag("autoAck", False), sub_mode=mode, sub_from=start)
    frames = q.flag("frames", False)
    return request, frames, autopilot


def _answer(popped: Popped, group: str, extra: dict[str, Any]) -> dict[str, Any]:
    """The answer without its messages, which come last (``answer`` splices them in)."""
    first = popped.claims[0]
    return {
        "success": True,
        "queue": first.queue,
        "partition": first.partition,
        "partitionId": str(first.partition_id),
        "leaseId": popped.lease_id,
        "leaseExpiresAt": _expiry(popped.claims),
        "consumerGroup": group,
        "partitionsClaimed": len(popped.claims),
        "claims": [{"partitionId": str(c.partition_id), "partition": c.partition,
                    "start": c.start, "end": c.end, "deliveryAttempt": c.attempt}
                   for c in popped.claims],
        **extra,
    }


def _expiry(claims: list[Claim]) -> str | None:
    expiries = [c.lease_expires_at for c in claims if c.lease_expires_at is not None]
    return iso_ms(min(expiries)) if expiries else None
