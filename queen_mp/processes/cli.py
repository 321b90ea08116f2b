"""``queen-mp`` command line: ``serve`` (the supervisor) and ``settings-table``.

Options of ``serve`` are generated from ``queen_mp.config.SETTINGS``: one flag per setting, so
the precedence default < environment < command line holds for every knob.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import click

from queen_mp.config import SETTINGS, Config, ConfigError, settings_table_markdown
from queen_mp.logs import configure_logging

__all__ = ["main", "serve_main"]


def _setting_options(func: Any) -> Any:
    for s in reversed(SETTINGS):
        facts = [f"env {s.env}", f"default: {s.default_text}"]
        if s.range_text:
            facts.append(f"range: {s.range_text}")
        func = click.option(s.cli_flag, s.attr, default=None, metavar=s.kind.__name__.upper(),
                            help=f"{s.help} [{'; '.join(facts)}]")(func)
    return func


@click.group()
@click.version_option(package_name="queen-mp", prog_name="queen-mp")
def main() -> None:
    """queen-mp: a partitioned message broker on PostgreSQL."""


@main.command()
@_setting_options
def serve(**options: Any) -> None:
    """Run the broker: embedded PostgreSQL when no DSN, migrations, shards, front workers."""
    try:
        config = Config.load(overrides=options)
        # the keys are read (and checked) here too, so a bad one stops the start at once
        # instead of every front worker failing at boot
        from queen_mp.auth import Verifier

        Verifier.from_config(config)
    except ConfigError as ex:
        raise click.UsageError(str(ex)) from ex
    if config.optimize and sys.flags.optimize < 2:
        _reexec_optimized()
    configure_logging(config.log_level)
    from queen_mp.processes.supervisor import Supervisor

    sys.exit(Supervisor(config).run())


def _reexec_optimized() -> None:
    """Replace this process (same pid, arguments and environment) by the same command at
    optimization level 2 (``QUEEN_OPTIMIZE``).

    PERF(memory): the supervisor imports what its children run before it forks them
    (``queen_mp/processes/preload.py``); -OO leaves every docstring out of that image (about
    3 MB: numpy, falcon, psycopg, click and the broker's own), so there is less of it to
    share and fewer pages next to the code objects for each child to copy. ``click`` has
    parsed ``serve``'s help by now, so it keeps its text; the asserts left out are type
    narrowings, no input check. The flag goes on the command line, not in
    ``PYTHONOPTIMIZE``, so the Python processes the broker starts (migrations) do not
    inherit it."""
    argv = [sys.executable, "-OO", *sys.orig_argv[1:]]
    os.execv(sys.executable, argv)


@main.command("settings-table")
def settings_table() -> None:
    """Print the Markdown table of every QUEEN_* setting (README's configuration section)."""
    click.echo(settings_table_markdown(), nl=False)


def serve_main() -> None:
    """Console script ``queen-mp``: ``queen-mp`` alone means ``queen-mp serve``."""
    if len(sys.argv) == 1:
        sys.argv.append("serve")
    main()


if __name__ == "__main__":
    main()
