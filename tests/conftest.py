"""Fixtures are pytest plugins in tests/fixtures; helpers are plain functions in tests/harness.py."""

pytest_plugins = ["fixtures.database", "fixtures.pgbouncer", "fixtures.processes"]
