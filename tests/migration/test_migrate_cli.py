"""`pgtick migrate` on the command line: a failure is an exit code and one readable line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import Database, env_for
from pgtick import migrate


def _one_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("sql", [False, True], ids=["apply", "--sql"])
def test_a_driver_without_its_schema_files_says_so_in_one_line(
    db: Database, tmp_path: Path, sql: bool
) -> None:
    """A pgtick installed without the sql/ and migrations/ it ships (a broken package, a copy
    of the module alone) cannot migrate nor print the install script: it says which files it
    lacks, exits 1 and changes nothing, rather than ending in a traceback."""
    package = tmp_path / "site" / "packages"
    shutil.copytree(Path(migrate.__file__).parent, package / "pgtick")
    assert not (package.parent.parent / "sql").exists()
    args = ["--sql"] if sql else ["--dsn", db.dsn]
    env = env_for(None)
    env["PYTHONPATH"] = str(package)
    result = subprocess.run(
        [sys.executable, "-m", "pgtick", "migrate", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    line = _one_line(result.stderr)
    assert result.returncode == 1, result
    assert "cannot find sql/ and migrations/" in line, line
    assert result.stdout == ""
