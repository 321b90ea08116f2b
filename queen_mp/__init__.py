"""queen-mp: a partitioned message broker on PostgreSQL."""

__version__ = "0.1.0"

__all__ = ["__version__"]
