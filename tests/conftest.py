"""Fixtures are pytest plugins in tests/fixtures; helpers are plain functions in tests/harness.py."""

import pytest

# The plugin an application's suite opts into (tests/driver/test_testing.py does): its asserts
# get pytest's messages, however early another test module imports it.
pytest.register_assert_rewrite("pgtick.testing")

pytest_plugins = ["fixtures.database", "fixtures.pgbouncer", "fixtures.processes"]
