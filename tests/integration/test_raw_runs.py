"""Runs of frames under ``RAW_RUN_BYTES`` are stored as raw chunks (codec 0, api.md 3.2;
queen_mp/wire/frames.py says why), larger ones as one zstd frame. Every reader of stored
segments must read both alike: the JSON pop, the QPF1 pop (records carry the codec byte), the
message browser, fetch, and the shard's duplicate answer (the original's message id, read
back from its stored segment).
"""

from __future__ import annotations

import orjson

from queen_mp.wire.frames import CODEC_RAW, CODEC_ZSTD
from tests.integration.test_fetch import FETCH
from tests.integration.test_messages import one
from tests.integration.test_pop import parse_qpf1, pop, pop_ok
from tests.integration.test_push_json import decode_blob, push, segment_rows, uq


def test_every_reader_reads_raw_and_zstd_runs_alike(broker, db):
    q = uq("raw")
    data = {"s": [{"n": 1}], "b": [{"n": k, "pad": "ab" * 40} for k in range(8)]}
    answers = {part: push(broker.client, [
        {"queue": q, "partition": part, "payload": v, "transactionId": f"{part}-{k}"}
        for k, v in enumerate(values)]) for part, values in data.items()}
    codecs: dict[str, set[int]] = {}
    for name, _, _, _, _, blob in segment_rows(db, q):
        codecs.setdefault(name, set()).update(codec for _, codec, _, _ in decode_blob(blob))
    assert codecs == {"s": {CODEC_RAW}, "b": {CODEC_ZSTD}}

    for part, values in data.items():
        ids = [a["messageId"] for a in answers[part]]
        js = pop_ok(broker.client, q, part, consumerGroup="gj", batch=10)
        assert [m["data"] for m in js["messages"]] == values
        r = pop(broker.client, q, part, consumerGroup="gf", frames=True, batch=10)
        assert r.status_code == 200, r.text
        [claim] = parse_qpf1(r.content)["claims"]
        assert [orjson.loads(m.payload) for m in claim["messages"]] == values
        assert [m.message_id for m in claim["messages"]] == ids
        pid = answers[part][-1]["partitionId"]
        got = one(broker.client, pid, f"{part}-{len(values) - 1}")
        assert got["data"] == values[-1] and got["id"] == ids[-1]
        r = broker.client.post(FETCH, json={"entries": [
            {"queue": q, "partition": part, "offset": 1}]})
        assert r.status_code == 200, r.text
        [entry] = r.json()["entries"]
        assert [rec["payload"] for rec in entry["records"]] == values
        again = push(broker.client, [{"queue": q, "partition": part, "payload": values[0],
                                      "transactionId": f"{part}-0"}])
        assert again[0]["status"] == "duplicate" and again[0]["messageId"] == ids[0]
