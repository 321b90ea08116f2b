"""The spool's disk fills (issue 29, fault 6): pushes answer 507 once the filesystem is above
the high-water mark, nothing answered ``buffered`` is lost, and pushes are taken again once the
drain has given the space back.

The spool lives on a tmpfs of 8 MiB that the test mounts (root only; skipped otherwise). Push
maintenance sends every push to the spool, so the disk fills without PostgreSQL in the way.
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_maintenance import (
    set_maintenance,
    spool_status,
    wait_drained,
    wait_for,
)
from tests.integration.test_push_json import PUSH, uq
from tests.integration.test_spool_drain import stored_messages_now


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            subprocess.run(["umount", "-l", str(mount)], check=True)


def test_a_full_spool_disk_answers_507_loses_nothing_and_recovers(make_broker, fresh_db_dsn,
                                                                   small_disk):
    b = make_broker(fresh_db_dsn, QUEEN_SPOOL_DIR=str(small_disk / "spool"),
                    QUEEN_DISK_HIGH_PCT="50")
    q = uq("full")
    set_maintenance(b, True)
    pad = "x" * 60_000
    buffered: dict[str, str] = {}  # transactionId -> messageId
    answers: collections.Counter[str] = collections.Counter()
    for i in range(400):  # 24 MB of payloads at most: three times the disk
        items = [{"queue": q, "partition": f"p{i % 4}", "transactionId": f"t{i}-{k}",
                  "payload": {"i": i, "k": k, "pad": pad}} for k in range(2)]
        r = b.client.post(PUSH, json={"items": items})
        if r.status_code == 507:
            answers["507"] += 1
            assert r.json()["code"] == "storage_full", r.text
            if answers["507"] >= 5:
                break
            continue
        assert r.status_code == 201, r.text
        for item, res in zip(items, r.json(), strict=True):
            answers[res["status"]] += 1
            if res["status"] == "buffered":
                buffered[item["transactionId"]] = res["messageId"]
            else:  # the one other answer a spool that cannot write gives
                assert res["status"] == "failed", res
        if answers["failed"]:
            # disk use is sampled at most once a second (http/admission.py): a fast loop can
            # fill the disk between two samples; a request after the next sample sees it full
            time.sleep(1.1)
    assert answers["507"] >= 5, answers
    assert buffered, answers

    set_maintenance(b, False)
    wait_drained(b, timeout=90)
    stored = stored_messages_now(fresh_db_dsn, q)
    by_txn = collections.Counter(m.transaction_id for m in stored)
    assert {t for t, n in by_txn.items() if n > 1} == set()
    assert {m.transaction_id: m.message_id for m in stored} == buffered
    assert spool_status(b)["failed"] == 0

    # the drain gave the space back: pushes are taken again (the usage is sampled each second)
    def queued() -> bool:
        r = b.client.post(PUSH, json={"items": [{"queue": q, "transactionId": "after"}]})
        return r.status_code == 201 and r.json()[0]["status"] in ("queued", "duplicate")
    try:
        wait_for("a push taken after the drain", queued, timeout=10)
    except AssertionError:
        files = sorted((p.name, p.stat().st_size) for p in small_disk.rglob("*") if p.is_file())
        st = os.statvfs(small_disk)
        raise AssertionError(f"{spool_status(b)} files {files} free {st.f_bavail * st.f_frsize}"
                             f" of {st.f_blocks * st.f_frsize}") from None
