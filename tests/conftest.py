"""Root fixtures: the PostgreSQL harness (tests.pgharness) and the broker harness."""

pytest_plugins = ["tests.pgharness", "tests.brokerharness"]
