"""examples/worker.sh with PGTICK_QUEUE claims from that queue only."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from harness import ROOT, Conn, Database, psql_binary, scalar, wait_for


def test_worker_sh_claims_from_one_queue(db: Database, conn: Conn, tmp_path: Path) -> None:
    conn.execute('SELECT jobs.enqueue_many(\'greet\', \'[{"name": "a"}, {"name": "b"}]\', queue => \'mail\')')
    conn.execute("SELECT jobs.enqueue('greet', '{\"name\": \"c\"}', queue => 'other')")
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
    env.update(PGTICK_DSN=db.dsn, PGTICK_POLL="0.1", PGTICK_QUEUE="mail", PSQL=psql_binary())
    log = tmp_path / "worker.log"
    with log.open("wb") as stderr:
        proc = subprocess.Popen(
            ["bash", str(ROOT / "examples" / "worker.sh")],
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            env=env,
            cwd=ROOT,
            start_new_session=True,
        )
    try:
        wait_for(
            "both mail runs completed",
            lambda: (
                scalar(conn, "SELECT count(*) FROM jobs.runs WHERE queue = 'mail' AND status = 'COMPLETED'")
                == 2
            ),
            60,
        )
        # Still running and polling: the other queue's run stays untouched.
        wait_for("a few more polls", lambda: log.read_text().count("\n") >= 3, 30)
        assert scalar(conn, "SELECT status::text FROM jobs.runs WHERE queue = 'other'") == "QUEUED"
        assert "queue=mail" in log.read_text()
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
