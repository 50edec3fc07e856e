"""Flow-control benchmark support: the pool filled for a drain under limits, and a schema
installed from an earlier commit (the claim as it was before queues and limits) to compare
the uncapped claim against."""

from __future__ import annotations

import atexit
import shutil
import subprocess
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from bench.harness import connect

ROOT = Path(__file__).resolve().parent.parent
TENANTS = 20


def fill_two_kinds(dsn: str, jobs: int) -> None:
    """``jobs`` runs in queue 'work', half of kind noop-a and half of kind noop-b, each with
    one of TENANTS concurrency keys, in interleaved claim order."""
    with connect(dsn) as conn:
        conn.execute(
            """
            INSERT INTO jobs.runs (kind, origin, queue, concurrency_key)
            SELECT CASE WHEN g %% 2 = 0 THEN 'noop-a' ELSE 'noop-b' END, 'manual', 'work',
                   't' || (g %% %s)
              FROM generate_series(1, %s) AS g
            """,
            (TENANTS, jobs),
        )
        conn.execute("ANALYZE jobs.runs")


def set_three_limits(dsn: str) -> None:
    """A queue limit, a kind limit and a per-key (per tenant) kind limit, all active on the
    pool and high enough never to hold a run back with 10 claimers x batch 10: the figure is
    the cost of enforcing them, not throttling."""
    with connect(dsn) as conn:
        conn.execute("SELECT jobs.set_limit('queue', 'work', max_running => 10000)")
        conn.execute("SELECT jobs.set_limit('kind', 'noop-a', max_running => 10000)")
        conn.execute("SELECT jobs.set_limit('kind', 'noop-b', max_running => 1000, per_key => true)")


def baseline_root(rev: str) -> Path:
    """sql/ and migrations/ of commit ``rev`` in a temporary directory (for migrate.apply)."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "sql", "migrations"],
        capture_output=True,
        check=True,
    ).stdout
    root = Path(tempfile.mkdtemp(prefix="pgtick-baseline-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)  # removed when the run ends
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(root, filter="data")
    return root


def install_from(root: Path, dsn: str) -> None:
    """Install the schema of ``root`` (a ``baseline_root``) by its own sql/install.sql."""
    from pgtick import migrate

    with connect(dsn) as conn:
        migrate.apply(conn, root)
