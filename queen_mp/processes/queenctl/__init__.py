"""``queenctl``: operate a running queen-mp broker over its HTTP API (docs/api.md 2.1, 2.8-2.10,
2.12, 2.15, 5).

Commands::

    queenctl health [--wait SECONDS]
    queenctl maintenance on|off|status [--pop]
    queenctl spool status | drain [--retry-failed]
    queenctl queues list [--namespace N] [--task T] | show QUEUE
                    | configure QUEUE --set key=value ... | delete QUEUE [--yes]
                    | purge QUEUE [--yes]
    queenctl messages browse QUEUE [--partition P] [--group G] [--status S] [--from ISO] ...
                    | peek QUEUE [--partition P] [--offset N | --from ISO] [--limit N]
    queenctl push QUEUE [PAYLOAD] [--file PATH] [--lines] [--partition P] [--transaction-id T]
    queenctl top [--interval S] [--once | --iterations N] [--queues N]
    queenctl dlq list [--queue Q] [--group G] [--partition P] [--from ISO] [--to ISO] ...
                | retry PARTITION_ID TRANSACTION_ID [--group G]
                | retry (--queue Q | --group G | --partition P | --from ISO | --to ISO ...
                         | --all) [--batch N] [--once] [--yes]
                | delete PARTITION_ID TRANSACTION_ID [--group G]
                | delete (<the same filters> | --all) [--batch N] [--once] [--yes]
    queenctl groups list | show GROUP | lag [--min-seconds N]
                   | seek GROUP QUEUE (--beginning | --end | --timestamp ISO)
    queenctl keys list | add [--standby] [--key-stdin] | use KEY_ID    [--file PATH]

One module per command group (``base`` holds the HTTP client, output and exit codes every group
shares); importing this package registers them all on ``main``. ``keys`` edits the broker's
encryption key file on this machine (queen_mp/keyring.py), not through the API; a broker uses a
change from its next start.

Global options come before the command: ``--url`` (env ``QUEEN_URL``, default
``http://127.0.0.1:6632``), ``--token`` (env ``QUEEN_TOKEN``, sent as ``Authorization: Bearer``),
``--json`` (print the broker's raw JSON answer, for scripts; every command also takes ``--json``
after its name), ``--timeout`` (seconds per request). Output is an aligned table by default. An
error answer ``{"error", "code"}`` is printed to stderr as ``error: <code>: <text>`` (with
``--json`` its body also goes to stdout).

Exit codes:

- 0: success (``health``: the broker is healthy)
- 1: the broker answered an error (4xx other than 404, 403 for a token's role included, 5xx),
  or is unhealthy; a push with an item not stored; an aborted confirmation
- 2: usage error (bad options or arguments; a payload or file that is not JSON: nothing sent)
- 3: the broker is unreachable (connection refused, DNS, timeout)
- 4: not found (the broker answered 404: unknown queue, group, DLQ row or route)
"""

from __future__ import annotations

from queen_mp.processes.queenctl import (  # noqa: F401  (each registers its commands on main)
    dlq,
    groups,
    keys,
    messages,
    ops,
    queues,
    top,
)
from queen_mp.processes.queenctl.base import (
    EXIT_ERROR,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_UNHEALTHY,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    main,
    parse_value,
    table,
)

__all__ = ["EXIT_ERROR", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_UNHEALTHY", "EXIT_UNREACHABLE",
           "EXIT_USAGE", "main", "parse_value", "table"]
