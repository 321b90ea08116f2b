"""Settings: defaults, env and override precedence, validation naming the variable."""

import subprocess
import sys
from pathlib import Path

import pytest

from queen_mp.config import SETTINGS, Config, ConfigError, settings_table_markdown


def test_defaults_match_declarations():
    cfg = Config.load(env={})
    for s in SETTINGS:
        assert getattr(cfg, s.attr) == s.default


def test_env_then_overrides_take_precedence():
    cfg = Config.load(env={"QUEEN_PORT": "7000", "QUEEN_WORKERS": "3"},
                      overrides={"workers": "5"})
    assert cfg.port == 7000
    assert cfg.workers == 5


@pytest.mark.parametrize(("env", "needle"), [
    ({"QUEEN_PORT": "abc"}, "QUEEN_PORT"),
    ({"QUEEN_PORT": "70000"}, "QUEEN_PORT"),
    ({"QUEEN_ACK_FUSION": "maybe"}, "QUEEN_ACK_FUSION"),
    ({"QUEEN_LOG_LEVEL": "loud"}, "QUEEN_LOG_LEVEL"),
    ({"QUEEN_ENCRYPTION_KEY": "abcd"}, "QUEEN_ENCRYPTION_KEY"),
    ({"QUEEN_JWT_ENABLED": "1"}, "QUEEN_JWT_ENABLED"),
    ({"QUEEN_ADMIT_MAX_MB": "1"}, "QUEEN_ADMIT_MAX_MB"),
])
def test_invalid_values_name_the_variable(env, needle):
    with pytest.raises(ConfigError, match=needle):
        Config.load(env=env)


def test_booleans_accept_the_usual_spellings():
    assert Config.load(env={"QUEEN_ACK_REGISTRY": "off"}).ack_registry is False
    assert Config.load(env={"QUEEN_ACK_REGISTRY": "TRUE"}).ack_registry is True


def test_to_env_round_trips():
    cfg = Config.load(env={"QUEEN_PORT": "7001", "QUEEN_HOTLIST": "0"})
    assert Config.load(env=cfg.to_env()) == cfg


def test_secrets_are_masked_in_the_boot_block():
    cfg = Config.load(env={"QUEEN_PG_DSN": "host=x password=secret"})
    shown = dict(cfg.describe())
    assert shown["QUEEN_PG_DSN"] == "***"


def test_readme_lists_every_setting():
    table = settings_table_markdown()
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for s in SETTINGS:
        assert f"`{s.env}`" in table
    assert table in readme, "README's table is stale: paste `make readme-config` into it"


def test_serve_refuses_an_invalid_setting_before_starting_anything():
    proc = subprocess.run([sys.executable, "-m", "queen_mp.processes.cli", "serve"],
                          env={"QUEEN_PORT": "not-a-port", "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert "QUEEN_PORT" in proc.stderr


class _Replaced(Exception):
    """Raised by the stand-in of ``os.execv``: the process would be replaced here."""


@pytest.mark.parametrize(("optimize", "replaced"), [("1", True), ("0", False)])
def test_serve_reexecutes_itself_at_optimization_level_2(monkeypatch, optimize, replaced):
    from click.testing import CliRunner

    import queen_mp.processes.supervisor as supervisor
    from queen_mp.processes import cli

    execs: list[list[str]] = []

    def execv(path: str, argv: list[str]) -> None:
        execs.append([path, *argv])
        raise _Replaced

    class Supervisor:
        def __init__(self, config: Config) -> None:
            pass

        def run(self) -> int:
            return 0

    monkeypatch.setattr(cli.os, "execv", execv)
    monkeypatch.setattr(cli, "configure_logging", lambda level: None)
    monkeypatch.setattr(supervisor, "Supervisor", Supervisor)
    monkeypatch.setenv("QUEEN_OPTIMIZE", optimize)
    result = CliRunner().invoke(cli.main, ["serve"])
    if replaced:
        assert isinstance(result.exception, _Replaced)
        assert execs == [[sys.executable, sys.executable, "-OO", *sys.orig_argv[1:]]]
    else:
        assert result.exit_code == 0, result.output
        assert execs == []
