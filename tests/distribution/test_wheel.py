"""The built distribution: `python -m build` gives a wheel and an sdist; the wheel, installed
into a fresh virtualenv, carries the SQL files and migrates a database on its own."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

import pgtick
from harness import ROOT, Database, Server


@dataclass(frozen=True)
class Built:
    wheel: Path
    sdist: Path
    venv: Path

    def bin(self, name: str) -> str:
        return str(self.venv / "bin" / name)


def _build(outdir: Path) -> None:
    """`python -m build`; `pip wheel` (wheel only) and hatchling's sdist when build is missing."""
    if importlib.util.find_spec("build") is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(outdir), str(ROOT)],
            check=True,
            timeout=600,
        )
        return
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(outdir), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    """Build once per session and install the wheel into a fresh venv (not the dev one)."""
    out = tmp_path_factory.mktemp("dist")
    _build(out)
    wheels = sorted(out.glob("pgtick-*.whl"))
    sdists = sorted(out.glob("pgtick-*.tar.gz"))
    assert wheels, f"no wheel built in {out}: {sorted(p.name for p in out.iterdir())}"
    assert sdists, f"no sdist built in {out}: {sorted(p.name for p in out.iterdir())}"
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(wheels[0])],
        check=True,
        timeout=900,
    )
    yield Built(wheels[0], sdists[0], venv)


def _outside(built: Built, *args: str, dsn: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run from a directory without the checkout, with only the venv on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "DATABASE_URL", "PGTICK_DSN")}
    env["PATH"] = f"{built.venv / 'bin'}:/usr/bin:/bin"
    if dsn is not None:
        env["DATABASE_URL"] = dsn
    return subprocess.run(
        list(args), capture_output=True, text=True, timeout=300, env=env, cwd=built.venv.parent
    )


def test_the_sdist_carries_the_schema_and_the_wheel_ships_it(built: Built) -> None:
    with tarfile.open(built.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    schema = {f"sql/{p.name}" for p in (ROOT / "sql").glob("*.sql")} | {
        f"migrations/{p.name}" for p in (ROOT / "migrations").glob("*.sql")
    }
    assert schema - names == set(), f"missing from the sdist: {sorted(schema - names)}"
    with zipfile.ZipFile(built.wheel) as wheel:
        shipped = {n.removeprefix("pgtick/_schema/") for n in wheel.namelist() if "/_schema/" in n}
    assert schema - shipped == set(), f"missing from the wheel: {sorted(schema - shipped)}"


def test_the_installed_wheel_reports_its_version_both_ways(built: Built) -> None:
    for argv in ([built.bin("pgtick"), "--version"], [built.bin("python"), "-m", "pgtick", "--version"]):
        result = _outside(built, *argv)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"pgtick {pgtick.__version__}", argv


def test_the_installed_wheel_imports_from_the_venv_not_the_checkout(built: Built) -> None:
    result = _outside(built, built.bin("python"), "-c", "import pgtick; print(pgtick.__file__)")
    assert result.returncode == 0, result.stderr
    assert str(built.venv) in result.stdout, result.stdout


def test_the_installed_wheel_migrates_a_database_and_records_its_version(built: Built, pg: Server) -> None:
    empty: Database = pg.create_empty_database()
    try:
        result = _outside(built, built.bin("pgtick"), "migrate", dsn=empty.dsn)
        assert result.returncode == 0, result.stderr
        with psycopg.connect(empty.dsn) as conn:
            row = conn.execute("SELECT schema_version, package_version FROM jobs.version()").fetchone()
            assert conn.execute("SELECT to_regclass('jobs.runs') IS NOT NULL").fetchone() == (True,)
        assert row is not None
        latest = max(p.name[:4] for p in (ROOT / "migrations").glob("[0-9]*.sql"))
        assert row == (latest, pgtick.__version__)
        status = _outside(built, built.bin("pgtick"), "status", "--wide", dsn=empty.dsn)
        assert status.returncode == 0, status.stderr
        assert f"schema  {latest}_" in status.stdout
        assert f"applied by pgtick {pgtick.__version__}" in status.stdout
    finally:
        pg.drop_database(empty)
