"""What every queenctl command shares: the HTTP client, exit codes, table output, the root
``main`` group and the ``command``/``subgroup`` decorators the command modules register with.

Only the standard library speaks HTTP here (``urllib``): the tool has no dependency beyond
``click``, which the broker needs anyway.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import click

__all__ = [
    "CONTEXT_SETTINGS",
    "DEFAULT_URL",
    "EXIT_ERROR",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_UNHEALTHY",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "Answer",
    "Client",
    "Unreachable",
    "cell",
    "command",
    "emit",
    "flatten",
    "generic",
    "key_values",
    "main",
    "parse_sets",
    "parse_value",
    "seg",
    "subgroup",
    "table",
]


EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_NOT_FOUND = 4
EXIT_UNHEALTHY = EXIT_ERROR  # kept for callers of the first version

DEFAULT_URL = "http://127.0.0.1:6632"

_EXIT_HELP = """\b
Exit codes:
  0  success (health: the broker is healthy)
  1  the broker answered an error (403: the token's role is too low), or is unhealthy
  2  usage error, or input that is not JSON (nothing was sent)
  3  broker unreachable
  4  not found (404)"""

CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


# -------------------------------------------------------------------------------- HTTP client
class Unreachable(Exception):
    """No HTTP answer at all: refused, unresolvable, reset or timed out."""


@dataclass
class Answer:
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


@dataclass
class Client:
    url: str
    token: str | None
    timeout: float
    as_json: bool

    def call(self, method: str, path: str, *, query: dict[str, Any] | None = None,
             body: Any = None) -> Answer:
        """One request; any HTTP status comes back as an ``Answer``, no answer raises."""
        target = self.url + path
        params = {k: _query_value(v) for k, v in (query or {}).items() if v is not None}
        if params:
            target += "?" + urllib.parse.urlencode(params)
        data = None
        headers = {"Accept": "application/json", "User-Agent": "queenctl"}
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(target, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return Answer(resp.status, _decode(resp.read()))
        except urllib.error.HTTPError as ex:
            with ex:
                return Answer(ex.code, _decode(ex.read()))
        except (urllib.error.URLError, OSError, ValueError) as ex:
            reason = getattr(ex, "reason", ex)
            raise Unreachable(f"broker unreachable at {self.url}: {reason}") from ex

    def require(self, method: str, path: str, **kw: Any) -> Any:
        """``call`` that exits on an error answer (1, or 4 for 404); returns the body."""
        answer = self.call(method, path, **kw)
        if not answer.ok:
            self.fail(answer)
        return answer.body

    def fail(self, answer: Answer) -> NoReturn:
        body = answer.body
        if self.as_json and body is not None:
            click.echo(json.dumps(body, indent=2))
        if isinstance(body, dict):
            code = body.get("code") or body.get("error") or f"http_{answer.status}"
            text = body.get("error") or body.get("message") or ""
            extra = {k: v for k, v in body.items()
                     if k in ("field", "limit", "index", "retryAfter", "reason", "detail")}
        else:
            code, text, extra = f"http_{answer.status}", str(body or ""), {}
        line = f"error: {code}: {text}".rstrip(": ")
        if extra:
            line += " (" + ", ".join(f"{k}={v}" for k, v in extra.items()) + ")"
        click.echo(line, err=True)
        sys.exit(EXIT_NOT_FOUND if answer.status == 404 else EXIT_ERROR)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace").strip()


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def seg(value: str) -> str:
    """A path segment, percent-encoded (the broker decodes each segment)."""
    return urllib.parse.quote(str(value), safe="")


# ------------------------------------------------------------------------------------ output
def cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    if isinstance(value, (list, tuple)):
        return ",".join(cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return json.dumps(value, separators=(",", ":"))
    return str(value).replace("\n", " ")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; numbers right-aligned."""
    cells = [[cell(v) for v in row] for row in rows]
    numeric = [any(_is_number(r[i]) for r in cells)
               and all(_is_number(r[i]) or r[i] == "-" for r in cells)
               for i in range(len(headers))]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def fmt(row: Sequence[str]) -> str:
        parts = [(c.rjust(w) if numeric[i] else c.ljust(w))
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        return "  ".join(parts).rstrip()

    return "\n".join([fmt(list(headers))] + [fmt(r) for r in cells])


def _is_number(text: str) -> bool:
    return bool(re.fullmatch(r"-?\d+(\.\d+)?", text))


def flatten(doc: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``{"a": {"b": 1}}`` as ``[("a.b", 1)]``; lists of scalars stay whole."""
    if isinstance(doc, dict):
        out: list[tuple[str, Any]] = []
        for key, value in doc.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, dict) and value:
                out.extend(flatten(value, name))
            else:
                out.append((name, value))
        return out
    return [(prefix or "value", doc)]


def key_values(pairs: Iterable[tuple[str, Any]]) -> str:
    pairs = list(pairs)
    width = max((len(k) for k, _ in pairs), default=0)
    return "\n".join(f"{k.ljust(width)}  {cell(v)}".rstrip() for k, v in pairs)


def generic(doc: Any) -> str:
    """Best-effort table of an answer whose shape this tool does not know in detail."""
    if isinstance(doc, list):
        if not doc:
            return "(none)"
        if all(isinstance(r, dict) for r in doc):
            keys: list[str] = []
            for r in doc:
                keys.extend(k for k in r if k not in keys and not isinstance(r[k], (dict, list)))
            return table(keys, [[r.get(k) for k in keys] for r in doc])
        return "\n".join(cell(v) for v in doc)
    if isinstance(doc, dict):
        return key_values(flatten(doc))
    return cell(doc)


def emit(obj: Client, body: Any, render: Any) -> None:
    """``--json``: the raw answer; else ``render(body)`` (a string, or None to print nothing)."""
    if obj.as_json:
        click.echo(json.dumps(body, indent=2))
        return
    text = render(body)
    if text:
        click.echo(text)


def parse_value(raw: str) -> Any:
    """``--set`` values: ints, floats, true/false/yes/no/on/off, null; JSON for quoted strings,
    lists and objects; anything else is the string as typed."""
    text = raw.strip()
    low = text.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("null", "none"):
        return None
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+)([eE][-+]?\d+)?|[-+]?\d+[eE][-+]?\d+", text):
        return float(text)
    if text[:1] in ('"', "[", "{"):
        try:
            return json.loads(text)
        except ValueError:
            pass
    return raw


def parse_sets(values: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in values:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise click.BadParameter(f"expected key=value, got {item!r}", param_hint="--set")
        out[key] = parse_value(raw)
    return out


# ----------------------------------------------------------------------------------- commands
@click.group(context_settings=CONTEXT_SETTINGS, epilog=_EXIT_HELP)
@click.option("--url", envvar="QUEEN_URL", default=DEFAULT_URL, show_default=True,
              help="Broker base URL [env QUEEN_URL].")
@click.option("--token", envvar="QUEEN_TOKEN", default=None,
              help="JWT sent as 'Authorization: Bearer' [env QUEEN_TOKEN].")
@click.option("--json", "as_json", is_flag=True, help="Print the broker's raw JSON answer.")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=30.0, show_default=True,
              help="Seconds to wait for each answer.")
@click.version_option(package_name="queen-mp", prog_name="queenctl")
@click.pass_context
def main(ctx: click.Context, url: str, token: str | None, as_json: bool, timeout: float) -> None:
    """Operate a queen-mp broker over its HTTP API."""
    ctx.obj = Client(url.rstrip("/"), token or None, timeout, as_json)


def _run(func: Any) -> Any:
    """Turn ``Unreachable`` into exit 3 for every command."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except Unreachable as ex:
            click.echo(f"error: unreachable: {ex}", err=True)
            sys.exit(EXIT_UNREACHABLE)

    return wrapper


_JSON_HELP = "Machine-readable output, JSON (as the global --json)."


def command(group: click.Group, name: str | None = None, **kw: Any) -> Any:
    """A subcommand of ``group`` getting the ``Client``, with exit 3 on ``Unreachable`` and its
    own ``--json`` (so ``queenctl push --json ...`` works as ``queenctl --json push ...``)."""

    def deco(func: Any) -> Any:
        @functools.wraps(func)
        def with_json(obj: Client, *args: Any, json_out: bool = False, **kwargs: Any) -> Any:
            if json_out:
                obj.as_json = True
            return func(obj, *args, **kwargs)

        wrapped = click.option("--json", "json_out", is_flag=True, help=_JSON_HELP)(with_json)
        return group.command(name, context_settings=CONTEXT_SETTINGS, epilog=_EXIT_HELP,
                             **kw)(click.pass_obj(_run(wrapped)))
    return deco


def subgroup(name: str, help: str) -> click.Group:
    grp = click.Group(name, help=help, context_settings=CONTEXT_SETTINGS, epilog=_EXIT_HELP)
    main.add_command(grp)
    return grp
