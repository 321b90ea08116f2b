"""``queenctl health``, ``maintenance`` and ``spool`` (docs/api.md 2.12, 5.3)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

from queen_mp.processes.queenctl.base import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    Client,
    Unreachable,
    command,
    emit,
    flatten,
    generic,
    key_values,
    main,
    subgroup,
)


# --- health
def _render_health(body: Any) -> str:
    if not isinstance(body, dict):
        return generic(body)
    shards = body.get("shards") or {}
    rows = [("status", body.get("status")),
            ("database", f"{body.get('database')} {body.get('databaseHost') or ''}".rstrip()),
            ("shards", f"{shards.get('alive')}/{shards.get('total')}"),
            ("maintenance", body.get("maintenanceMode")),
            ("pop maintenance", body.get("popMaintenanceMode")),
            ("version", body.get("version")),
            ("uptime", f"{body.get('uptimeSeconds')}s"),
            ("instance", body.get("instance"))]
    if body.get("error"):
        rows.append(("error", f"{body.get('code', '')}: {body['error']}".lstrip(": ")))
    return key_values((k, v) for k, v in rows if v is not None)


@command(main)
@click.option("--wait", "wait_s", type=click.FloatRange(min=0), default=0, show_default=True,
              metavar="SECONDS",
              help="Retry until healthy for up to this long (readiness checks); 0 = ask once.")
def health(obj: Client, wait_s: float) -> None:
    """Is the broker healthy (PostgreSQL reachable, every shard alive)?

    Exit 0 healthy, 1 unhealthy (503), 3 unreachable.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            answer = obj.call("GET", "/health")
        except Unreachable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
            continue
        if answer.ok or time.monotonic() >= deadline:
            break
        time.sleep(0.5)
    emit(obj, answer.body, _render_health)
    if not answer.ok:
        if not isinstance(answer.body, dict) or "status" not in answer.body:
            obj.fail(answer)
        sys.exit(EXIT_NOT_FOUND if answer.status == 404 else EXIT_ERROR)


# --- maintenance
maintenance = subgroup("maintenance", "Push maintenance (pushes spool, transactions 503) and "
                                      "pop maintenance (pops claim nothing).")
_POP = click.option("--pop", is_flag=True, help="Pop maintenance instead of push maintenance.")


def _render_maintenance(body: Any) -> str:
    if not isinstance(body, dict):
        return generic(body)
    msg = body.get("message")
    rest = {k: v for k, v in body.items() if k != "message"}
    text = key_values(flatten(rest))
    return f"{text}\n{msg}" if msg else text


def _set_maintenance(obj: Client, enabled: bool, pop: bool) -> None:
    path = "/api/v1/system/maintenance" + ("/pop" if pop else "")
    body = obj.require("POST", path, body={"enabled": enabled})
    emit(obj, body, _render_maintenance)


@command(maintenance, "on")
@_POP
def maintenance_on(obj: Client, pop: bool) -> None:
    """Turn (push or --pop) maintenance on, on every instance."""
    _set_maintenance(obj, True, pop)


@command(maintenance, "off")
@_POP
def maintenance_off(obj: Client, pop: bool) -> None:
    """Turn (push or --pop) maintenance off; the spool then drains."""
    _set_maintenance(obj, False, pop)


@command(maintenance, "status")
@_POP
def maintenance_status(obj: Client, pop: bool) -> None:
    """Show the maintenance flags and the spool."""
    path = "/api/v1/system/maintenance" + ("/pop" if pop else "")
    emit(obj, obj.require("GET", path), _render_maintenance)


# --- spool
spool = subgroup("spool", "The disk spool of pushes answered 'buffered'.")


@command(spool, "status")
def spool_status(obj: Client) -> None:
    """Pending and failed spool records, files, bytes, drain state."""
    emit(obj, obj.require("GET", "/api/v1/system/spool"), generic)


@command(spool, "drain")
@click.option("--retry-failed", is_flag=True,
              help="Re-queue permanently rejected records first.")
def spool_drain(obj: Client, retry_failed: bool) -> None:
    """Replay the spool now (refused with 409 during maintenance: exit 1)."""
    body = obj.require("POST", "/api/v1/system/spool/drain",
                       body={"retryFailed": retry_failed})
    emit(obj, body, generic)
