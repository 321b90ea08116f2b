"""Benchmarks of queen-mp (not part of the package, not part of ``make test``)."""
