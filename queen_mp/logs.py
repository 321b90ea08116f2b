"""Logging setup shared by every process (supervisor, shards, the migration child)."""

from __future__ import annotations

import logging
import sys

__all__ = ["configure_logging"]


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s")
