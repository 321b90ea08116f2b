"""``POST /api/v1/transaction`` (docs/api.md 2.5): JSON or ``QTB1``, dispatched on the first four
bytes. Always 200 once it ran (``success: false`` for a rollback, nothing applied); never 204,
never spooled."""

from __future__ import annotations

import falcon
import falcon.asgi
import orjson

from queen_mp.db.errors import DatabaseError
from queen_mp.front.ingest import EncryptionUnavailable
from queen_mp.front.queueflags import FlagsUnavailable
from queen_mp.front.worker import FrontWorker
from queen_mp.http.admission import rewindow
from queen_mp.http.authz import sub_of, tenant_of
from queen_mp.http.body import read_body
from queen_mp.http.dbcall import api_error
from queen_mp.http.errors import JSON_UTF8, BadFrame, Maintenance, Unavailable
from queen_mp.models.transactions import QTB1_MAGIC, parse_json, parse_qtb1, qtb1_decoded_size

__all__ = ["TransactionResource"]

_OTHER_MAGIC = (b"QPB1",)


class TransactionResource:
    def __init__(self, worker: FrontWorker) -> None:
        self.worker = worker

    async def on_post(self, req: falcon.asgi.Request, resp: falcon.asgi.Response) -> None:
        w = self.worker
        body = await read_body(req, w.config.max_body_mb << 20)
        magic = body[:4]
        sub = sub_of(req)
        if magic == QTB1_MAGIC:
            await rewindow(req, qtb1_decoded_size(body))
            plan = parse_qtb1(body, w.config.max_decompressed_mb << 20, sub)
        elif magic in _OTHER_MAGIC:
            raise BadFrame("QPB1 is the push body; a transaction takes JSON or QTB1",
                           field="magic")
        else:
            plan = parse_json(body, sub)
        # NOTE(memory): not kept while the transaction runs (a JSON plan holds copies; a QTB1
        # plan's client chunks still refer to the body they are slices of)
        del body, magic
        if w.push_maintenance():
            # NOTE(queen): the flags board, before PostgreSQL; SQL still refuses (QM001) a
            # transaction that races the switch.
            raise Maintenance("push maintenance is on: writes are refused (retry later)")
        tenant = tenant_of(req)
        try:
            answer, woken = await w.transactions.run(tenant, plan)
        except (EncryptionUnavailable, FlagsUnavailable) as ex:
            raise Unavailable(str(ex)) from None
        except DatabaseError as ex:
            raise api_error(ex) from None
        if answer["success"]:
            w.after_transaction(tenant, woken, sum(1 for k in plan.kinds if k == "push"))
        resp.data = orjson.dumps(answer)
        resp.content_type = JSON_UTF8
        resp.status = falcon.HTTP_200
