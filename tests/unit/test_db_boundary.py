"""The database boundary: connections are made by ``queen_mp/db/connect.py`` only, and psycopg
stays inside ``queen_mp/db``.

Every connection must be pinned to ``synchronous_commit=on`` (design invariant 1), which the
helper does and verifies (tests/integration/test_durable_connections.py shows it on a database
whose default is off); a connection opened anywhere else would not be. So no other module may
call a psycopg connection factory: ``psycopg.connect``, ``(Async)Connection.connect`` or a
psycopg_pool pool constructor, however it was imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from queen_mp.db import connect as db_connect

PACKAGE = Path(__file__).resolve().parents[2] / "queen_mp"
HELPER = "queen_mp/db/connect.py"
_FACTORY_CLASSES = {"Connection", "AsyncConnection"}
_POOLS = {"ConnectionPool", "AsyncConnectionPool", "NullConnectionPool",
          "AsyncNullConnectionPool"}


def _modules() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        out.append((rel, ast.parse(path.read_text(), filename=rel)))
    return out


def _psycopg_names(tree: ast.Module) -> dict[str, str]:
    """Local name -> what it is in psycopg / psycopg_pool (``psycopg``, ``psycopg.connect``,
    ``AsyncConnection``, ``psycopg_pool``, ``AsyncConnectionPool`` ...)."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                top = alias.name.split(".")[0]
                if top in ("psycopg", "psycopg_pool"):
                    names[alias.asname or top] = alias.name if alias.asname else top
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top in ("psycopg", "psycopg_pool"):
                for alias in node.names:
                    names[alias.asname or alias.name] = (
                        "psycopg.connect" if (top, alias.name) == ("psycopg", "connect")
                        else alias.name)
    return names


def _dotted(node: ast.AST) -> list[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return []


def connection_factories(tree: ast.Module) -> list[int]:
    """Lines that call a psycopg connection factory or build a psycopg_pool pool."""
    names = _psycopg_names(tree)
    lines = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        parts = _dotted(node.func)
        if not parts or parts[0] not in names:
            continue
        resolved = [names[parts[0]], *parts[1:]]
        if resolved[0] in ("psycopg", "psycopg_pool"):
            resolved = resolved[1:]  # psycopg.X... -> X...
        else:
            resolved = [resolved[0].split(".")[-1], *resolved[1:]]
        if (resolved == ["connect"] or (len(resolved) == 2 and resolved[1] == "connect"
                                        and resolved[0] in _FACTORY_CLASSES)
                or (len(resolved) == 1 and resolved[0] in _POOLS)):
            lines.append(node.lineno)
    return lines


def test_the_check_sees_every_spelling_of_a_connection_factory() -> None:
    tree = ast.parse("\n".join([
        "import psycopg",
        "import psycopg as pg",
        "import psycopg_pool",
        "from psycopg import AsyncConnection, connect",
        "from psycopg import Connection as C",
        "from psycopg_pool import AsyncConnectionPool",
        "psycopg.connect('')",
        "pg.AsyncConnection.connect('')",
        "AsyncConnection.connect('')",
        "C.connect('')",
        "connect('')",
        "psycopg_pool.ConnectionPool('')",
        "AsyncConnectionPool('')",
        "other.connect('')",  # not psycopg's
        "psycopg.sql.SQL('')",
    ]))
    assert connection_factories(tree) == list(range(7, 14))


def test_only_the_db_connect_helper_opens_connections() -> None:
    found = {rel: lines for rel, tree in _modules()
             if (lines := connection_factories(tree)) and rel != HELPER}
    assert found == {}
    assert connection_factories(dict(_modules())[HELPER]), "the helper opens none?"


def test_psycopg_stays_inside_queen_mp_db() -> None:
    importing = {rel for rel, tree in _modules()
                 if not rel.startswith("queen_mp/db/") and _psycopg_names(tree)}
    assert importing == set(), sorted(importing)


def test_the_session_options_pin_synchronous_commit_last() -> None:
    assert db_connect.session_options("dbname=x") == "-c synchronous_commit=on -c TimeZone=UTC"
    assert db_connect.session_options("dbname=x", 35_000) == (
        "-c synchronous_commit=on -c TimeZone=UTC -c statement_timeout=35000")
    # a DSN's own options are kept, ours come after them (PostgreSQL: the last one wins)
    assert db_connect.session_options(
        "dbname=x options='-c synchronous_commit=off -c work_mem=8MB'") == (
        "-c synchronous_commit=off -c work_mem=8MB -c synchronous_commit=on -c TimeZone=UTC")
    assert db_connect.session_options(
        "postgresql://h/x?options=-c%20search_path%3Dq") == (
        "-c search_path=q -c synchronous_commit=on -c TimeZone=UTC")


@pytest.mark.parametrize(("dsn", "local"), [
    ("host=127.0.0.1 port=5432 dbname=x", True),
    ("host=127.0.0.2", True),
    ("postgresql://[::1]:5432/x", True),
    ("host=localhost", True),
    ("host=/var/run/postgresql", True),
    ("postgresql://%2Fvar%2Frun%2Fpostgresql/x", True),
    ("dbname=x", True),  # no host: libpq's default Unix socket
    ("host=127.0.0.1,/tmp", True),
    ("host=db.example.com", False),
    ("host=10.0.0.5", False),
    ("host=127.0.0.1,db.example.com", False),  # one host may be elsewhere
    ("postgresql://h1,h2/x", False),
    ("hostaddr=127.0.0.1 host=db.example.com", True),  # hostaddr is where it connects
    ("hostaddr=10.0.0.5 host=localhost", False),
    ("host=127.0.0.1 gssencmode=prefer", False),  # the DSN's own choice is kept
    ("postgresql://127.0.0.1/x?gssencmode=require", False),
])
def test_gss_encryption_is_not_tried_on_this_host(dsn: str, local: bool,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("PGHOST", "PGHOSTADDR", "PGGSSENCMODE"):
        monkeypatch.delenv(var, raising=False)
    assert db_connect.local_params(dsn) == ({"gssencmode": "disable"} if local else {})


def test_gss_encryption_follows_libpq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("PGHOST", "PGHOSTADDR", "PGGSSENCMODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PGHOST", "db.example.com")
    assert db_connect.local_params("dbname=x") == {}
    assert db_connect.local_params("host=127.0.0.1") == {"gssencmode": "disable"}
    monkeypatch.setenv("PGHOST", "127.0.0.1")
    monkeypatch.setenv("PGGSSENCMODE", "prefer")  # the user's choice, through the environment
    assert db_connect.local_params("dbname=x") == {}
