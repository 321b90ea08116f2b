"""The package as a user installs it: ``python -m build``, ``pip install`` of the wheel into a
fresh virtual environment outside the checkout, then ``queen-mp serve`` on its embedded
PostgreSQL, a push, a pop and an ack, and a clean stop.

Slow by nature (a build and an install: about half a minute with a warm pip cache, which
``make`` leaves behind), so it is one test doing the whole path once.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from queen_mp import __version__
from queen_mp.db.migrations import load_sql_tree
from tests.brokerharness import REPO, start_broker
from tests.pgharness import SQL_DIR, make_temp_dir


def run(*args: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=600, check=False)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """The sdist and the wheel built from this checkout (isolated build, as pip would)."""
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "build", "--outdir", out, REPO, cwd=REPO)
    (wheel,) = out.glob("queen_mp-*.whl")
    (sdist,) = out.glob("queen_mp-*.tar.gz")
    return sdist, wheel


def shipped_data() -> set[str]:
    """The files besides modules that the broker reads at run time (the console's included)."""
    package = SQL_DIR.parent
    sql = {p for p in SQL_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    console = {p for p in (package / "console").rglob("*") if p.is_file()}
    return {str(p.relative_to(package.parent))
            for p in sql | console | {package / "http/openapi.json"}}


def test_the_wheel_and_the_sdist_carry_the_sql_and_the_api_document(built):
    sdist, wheel = built
    assert len(shipped_data()) == 52  # 38 SQL files, openapi.json, 13 console files
    with zipfile.ZipFile(wheel) as whl:
        assert shipped_data() <= set(whl.namelist())
    with tarfile.open(sdist) as tar:
        root = sdist.name.removesuffix(".tar.gz")
        assert {f"{root}/{name}" for name in shipped_data()} <= set(tar.getnames())


def test_a_pip_installed_wheel_serves_on_its_embedded_postgres(built):
    _, wheel = built
    # world-searchable: the embedded cluster's server user must reach the data dir under root
    home = make_temp_dir("queen-wheel-")
    try:
        venv = home / "venv"
        run(sys.executable, "-m", "venv", venv, cwd=home)
        run(venv / "bin" / "pip", "install", "--quiet", wheel, cwd=home)
        where = run(venv / "bin" / "python", "-c", "import queen_mp; print(queen_mp.__file__)",
                    cwd=home)
        assert Path(where.strip()).is_relative_to(venv), where  # not the checkout
        assert run(venv / "bin" / "queen-mp", "--version", cwd=home).strip() == (
            f"queen-mp, version {__version__}")
        assert run(venv / "bin" / "queenctl", "--version", cwd=home).strip() == (
            f"queenctl, version {__version__}")

        broker = start_broker(home, None, command=[str(venv / "bin" / "queen-mp"), "serve"],
                              cwd=home)
        try:
            schema = ", ".join(m.filename for m in load_sql_tree(SQL_DIR).migrations)
            assert f"migrations: {schema}, functions/" in broker.log()
            document = broker.client.get("/api/v1/openapi.json")
            assert document.status_code == 200 and document.json()["openapi"].startswith("3.1")
            page = broker.client.get("/console")
            assert page.status_code == 200 and b'src="/console/app.js"' in page.content
            for name in ("app.js", "pages/queue.js", "console.css"):
                assert broker.client.get(f"/console/{name}").status_code == 200, name
            pushed = broker.client.post("/api/v1/push", json={"items": [
                {"queue": "wheel.q", "partition": "p1", "payload": {"n": 1},
                 "transactionId": "wheel-1"}]})
            assert pushed.status_code == 201, pushed.text
            assert pushed.json()[0]["status"] == "queued"
            popped = broker.client.get("/api/v1/pop/queue/wheel.q", params={"wait": "false"})
            assert popped.status_code == 200, popped.text
            (message,) = popped.json()["messages"]
            assert message["data"] == {"n": 1}
            acked = broker.client.post("/api/v1/ack", json={
                "transactionId": "wheel-1", "partitionId": message["partitionId"],
                "leaseId": message["leaseId"], "status": "completed"})
            assert acked.status_code == 200, acked.text
            assert acked.json()[0]["success"] is True
        finally:
            assert broker.stop() == 0, broker.log()[-4000:]
    finally:
        shutil.rmtree(home, ignore_errors=True)
