"""``queenctl``: operate a running broker over its HTTP API.

Only ``health`` exists so far; maintenance, spool, queues, DLQ and groups come with the
operations issue. Exit codes: 0 healthy, 1 unhealthy answer, 2 usage, 3 broker unreachable.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request

import click

__all__ = ["main"]

EXIT_UNHEALTHY = 1
EXIT_UNREACHABLE = 3


@click.group()
@click.option("--url", envvar="QUEEN_URL", default="http://127.0.0.1:6632", show_default=True,
              help="Broker base URL [env QUEEN_URL].")
@click.option("--json", "as_json", is_flag=True, help="Print the raw JSON answer.")
@click.pass_context
def main(ctx: click.Context, url: str, as_json: bool) -> None:
    """Operate a queen-mp broker."""
    ctx.obj = {"url": url.rstrip("/"), "json": as_json}


@main.command()
@click.pass_obj
def health(obj: dict[str, object]) -> None:
    """Is the broker healthy (PostgreSQL reachable, every shard alive)?"""
    try:
        with urllib.request.urlopen(f"{obj['url']}/health", timeout=10) as resp:
            status, body = resp.status, json.load(resp)
    except urllib.error.HTTPError as ex:
        status, body = ex.code, json.load(ex)
    except (urllib.error.URLError, OSError) as ex:
        click.echo(f"broker unreachable at {obj['url']}: {ex}", err=True)
        sys.exit(EXIT_UNREACHABLE)
    if obj["json"]:
        click.echo(json.dumps(body, indent=2))
    else:
        shards = body.get("shards", {})
        click.echo(f"status     {body.get('status')}")
        click.echo(f"database   {body.get('database')} {body.get('databaseHost', '')}".rstrip())
        click.echo(f"shards     {shards.get('alive')}/{shards.get('total')}")
        click.echo(f"version    {body.get('version')}")
        if body.get("error"):
            click.echo(f"error      {body['error']}")
    if status != 200:
        sys.exit(EXIT_UNHEALTHY)


if __name__ == "__main__":
    main()
