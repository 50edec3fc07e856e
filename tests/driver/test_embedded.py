"""The embedded PostgreSQL on a data directory it cannot open."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import PGTICK, ROOT
from pgtick.embedded import _bundled_major


@pytest.fixture
def home() -> Iterator[Path]:
    """A PGTICK_HOME outside pytest's base directory (as root the server runs as its own user,
    which pytest's private directories would lock out)."""
    path = Path(tempfile.mkdtemp(prefix="pgtick-embedded-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_data_directory_of_another_postgresql_major_version_is_refused_in_one_line(home: Path) -> None:
    """Data that the wheel's PostgreSQL cannot open (another major version: an older pgserver
    made it): every command that would start the server says so, in one line, with what to do,
    not in pg_ctl's traceback."""
    (home / "pgdata").mkdir()
    (home / "pgdata" / "PG_VERSION").write_text("9\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
    env["PGTICK_HOME"] = str(home)
    done = subprocess.run([*PGTICK, "dsn"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    assert "is of PostgreSQL 9, and the installed pgserver runs PostgreSQL" in done.stderr, done.stderr
    assert "pg_upgrade" in done.stderr, done.stderr


def test_a_data_directory_the_server_cannot_start_on_is_said_in_one_line(home: Path) -> None:
    """A data directory of the right version that the server still cannot open (here, all but
    its PG_VERSION lost): the command says why from the server's log, not pg_ctl's traceback."""
    (home / "pgdata").mkdir()
    (home / "pgdata" / "PG_VERSION").write_text(f"{_bundled_major()}\n")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
    env["PGTICK_HOME"] = str(home)
    done = subprocess.run([*PGTICK, "dsn"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"pgtick dsn: error: the embedded PostgreSQL did not start on {home}"), last
