"""The README's first command: `pgtick run examples/app.py` on the embedded PostgreSQL.

A newcomer with no database gets one started for them, the schema installed,
and the example's jobs running; `pgtick status` and `pgtick dsn` work against
the same embedded server; SIGTERM stops everything cleanly.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness import PGTICK, ROOT, Database, env_for, psql_file, scalar, terminate, wait_for


@pytest.fixture
def data_home() -> Iterator[Path]:
    """XDG_DATA_HOME for the embedded server, outside pytest's base directory: as root the
    server runs as its own user, and every pytest session that starts on the machine makes
    /tmp/pytest-of-<user> private again (0700), which would lock that user out mid-test."""
    path = Path(tempfile.mkdtemp(prefix="pgtick-readme-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.timeout(420)
def test_example_app_runs_on_embedded_postgres(tmp_path: Path, data_home: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
    env.update(XDG_DATA_HOME=str(data_home), PGTICK_LOG="INFO")
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pgtick.cli", "run", "examples/app.py", "--tick", "0.5s"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    last: list[str] = []
    try:
        # `status` and `dsn` attach to the server `run` started: asked while `run` is still
        # creating it (initdb, first start: long on a busy machine), they would race its setup.
        wait_for(
            "pgtick run to start the embedded server",
            lambda: (
                proc.poll() is not None or "embedded PostgreSQL, data in" in log.read_text(errors="replace")
            ),
            timeout=150,
            interval=0.5,
        )
        assert proc.poll() is None, f"pgtick run exited early:\n{log.read_text(errors='replace')[-3000:]}"

        def status() -> dict[str, Any] | None:
            result = subprocess.run(
                [sys.executable, "-m", "pgtick.cli", "status", "--json"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
            )
            last[:] = [result.stderr[-2000:], result.stdout[-2000:]]
            if result.returncode != 0:
                return None
            snap: dict[str, Any] = json.loads(result.stdout)
            queues = {q["kind"]: q for q in snap["queues"]}
            done = queues.get("tick", {}).get("completed_1h", 0)
            return snap if snap["leader"] and done >= 2 else None

        try:
            snap = wait_for("the example's tick jobs to complete twice", status, timeout=90, interval=1.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; last status call: {last}") from None
        names = {d["name"] for d in snap["definitions"]}
        assert {"weekday-report", "every-minute", "every-10s", "nightly-import", "hello-once"} <= names
        dsn = subprocess.run(
            [sys.executable, "-m", "pgtick.cli", "dsn"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert dsn.returncode == 0 and str(data_home) in dsn.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    text = log.read_text(errors="replace")
    assert code == 0, text[-3000:]
    assert "embedded PostgreSQL, data in" in text and "Traceback" not in text, text[-3000:]
    # The embedded server was stopped on exit: its pid file is gone.
    deadline = time.monotonic() + 60
    pidfile = data_home / "pgtick" / "pgdata" / "postmaster.pid"
    while pidfile.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not pidfile.exists(), f"{pidfile} still there 60 s after pgtick run exited: {text[-3000:]}"


ALIVE_LONG_IMPORT_WORKERS = (
    "SELECT count(*) FROM jobs.workers WHERE state = 'alive' AND kinds @> '{long-import}'"
)


def _block_after(readme: str, heading: str, lang: str) -> str:
    """The first fenced ``lang`` block of the README after the text ``heading``."""
    found = re.search(rf"^```{lang}\n(.*?)^```", readme[readme.index(heading) :], re.DOTALL | re.MULTILINE)
    assert found, f"no ```{lang} block after {heading!r} in the README"
    return found.group(1)


@pytest.mark.timeout(300)
def test_the_psql_lines_beside_the_running_example_work_as_written(db: Database, tmp_path: Path) -> None:
    """The README's psql lines for watching the example app run as a newcomer types them, in
    order, stopping at the first error; the long-import they enqueue is running when the last
    line cancels it, and it stops at a checkpoint: compensated, then CANCELLED."""
    block = _block_after((ROOT / "README.md").read_text(), "While the example runs", "sql")
    lines = [line for line in block.splitlines() if line.strip()]
    cancels = [line for line in lines if "jobs.cancel(" in line]
    assert cancels and lines[-len(cancels) :] == cancels, "the block ends with its cancel"
    log = tmp_path / "run.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*PGTICK, "run", "examples/app.py", "--dsn", db.dsn, "--tick", "0.5s"],
            cwd=ROOT,
            env=env_for(None),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with db.connect() as conn:
            wait_for(
                "the example's worker to register long-import",
                lambda: proc.poll() is not None or scalar(conn, ALIVE_LONG_IMPORT_WORKERS),
                timeout=120,
                interval=0.2,
            )
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]

            def psql(text: str) -> str:
                script = tmp_path / "lines.sql"
                script.write_text(text + "\n")
                result = psql_file(db.dsn, script)
                assert result.returncode == 0, f"{text}\n{result.stderr}"
                return result.stdout

            psql("\n".join(lines[: -len(cancels)]))
            run_id = wait_for(
                "the enqueued long-import to start",
                lambda: scalar(
                    conn, "SELECT id FROM jobs.runs WHERE kind = 'long-import' AND status = 'RUNNING'"
                ),
                timeout=120,
                interval=0.2,
            )
            psql("\n".join(cancels))
            wait_for(
                "the long-import to stop at a checkpoint",
                lambda: scalar(conn, "SELECT status = 'CANCELLED' FROM jobs.runs WHERE id = %s", (run_id,)),
                timeout=60,
                interval=0.2,
            )
        wait_for(
            "the run's outcome in the example's log",
            lambda: (
                f"run={run_id} kind=long-import definition=- status=CANCELLED"
                in log.read_text(errors="replace")
            ),
            timeout=30,
            interval=0.2,
        )
    finally:
        terminate(proc, grace=60)
    text = log.read_text(errors="replace")
    assert "compensating: rolling back the rows imported so far" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


def test_the_readme_says_where_pgtick_is_before_it_runs_pgtick_bare() -> None:
    """The quickstart installs pgtick into .venv without activating it: a command the README
    shows as plain `pgtick ...` is "command not found" for a newcomer until the README has
    said how to put .venv/bin on the PATH."""
    readme = (ROOT / "README.md").read_text()
    bare, fence, offset = None, None, 0
    for line in readme.splitlines(keepends=True):
        if line.startswith("```"):
            fence = None if fence is not None else line[3:].strip()
        elif fence in ("", "sh") and re.match(r"(\$ )?pgtick ", line):
            bare = offset
            break
        offset += len(line)
    assert bare is not None, "the README runs no plain `pgtick` command any more: drop this test"
    activate = readme.find(". .venv/bin/activate")
    assert 0 <= activate < bare, (
        "the README runs a plain `pgtick` command before saying `. .venv/bin/activate`:"
        f" {readme[bare : readme.index(chr(10), bare)]!r}"
    )


def test_every_test_and_file_the_docs_name_exists() -> None:
    """The docs cite the tests behind each claim and the files that hold each part: a renamed
    test or a moved file leaves a citation a reader cannot follow."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    sources = {p: p.read_text() for p in (ROOT / "tests").rglob("*.py")}
    missing = []
    for doc in docs:
        text = doc.read_text()
        for path in re.findall(r"`((?:tests|driver|sql|migrations|examples|bench|docs)/[\w./-]+)`", text):
            if "NNNN" not in path and not (ROOT / path).exists():
                missing.append(f"{doc.name}: {path}")
        for name in set(re.findall(r"\b(test_\w+)\b", text)):
            if not any(f"def {name}(" in src or f"{name}.py" == p.name for p, src in sources.items()):
                missing.append(f"{doc.name}: {name}")
    assert not missing, "the docs name what does not exist:\n" + "\n".join(missing)


def _shown_sessions(command: str) -> list[tuple[str, str, str]]:
    """Every `$ pgtick COMMAND ...` line in a fenced block of the docs, with the output shown
    under it (up to the next `$` line or the end of the block)."""
    found = []
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        blocks: list[str] = []
        block: list[str] = []
        fenced = False
        for text in doc.read_text().splitlines(keepends=True):
            if text.startswith("```"):
                if fenced:
                    blocks.append("".join(block))
                block, fenced = [], not fenced
            elif fenced:
                block.append(text)
        for block_text in blocks:
            for session in re.split(r"^(?=\$ )", block_text, flags=re.MULTILINE):
                line, _, shown = session.partition("\n")
                if line.startswith(f"$ pgtick {command} "):
                    found.append((doc.name, line[2:], shown))
    return found


@pytest.mark.parametrize(
    ("doc", "line", "shown"), _shown_sessions("preview"), ids=lambda v: v if v.startswith("pgtick") else ""
)
def test_the_preview_output_the_docs_show_is_what_preview_prints(doc: str, line: str, shown: str) -> None:
    """Schedule text and a fixed --after: what preview prints depends on nothing else."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGTICK_DSN")}
    result = subprocess.run(
        [sys.executable, "-m", "pgtick.cli", *shlex.split(line)[1:]],
        cwd=ROOT,
        env=env | {"COLUMNS": "100", "NO_COLOR": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert result.stdout == shown, f"{doc}: {line}\nprinted:\n{result.stdout}\nshown:\n{shown}"


def test_the_schema_version_the_readme_shows_is_the_latest_migration() -> None:
    """`SELECT * FROM jobs.version()` in the README answers for the schema this checkout
    installs: its last migration."""
    readme = (ROOT / "README.md").read_text()
    shown = re.search(r"^--\s+(\d{4})\s+\|\s+(\w+)\s+\|", readme, flags=re.MULTILINE)
    assert shown, "the README no longer shows a row of jobs.version()"
    latest = max(p.stem for p in (ROOT / "migrations").glob("[0-9][0-9][0-9][0-9]_*.sql"))
    assert f"{shown.group(1)}_{shown.group(2)}" == latest, (
        f"the README shows jobs.version() at {shown.group(1)} {shown.group(2)};"
        f" this checkout installs {latest}"
    )


def test_the_readme_names_every_package_the_test_suite_installs() -> None:
    """CI installs system packages before the README's test command; a newcomer running that
    command reads in the README which ones the suite needs."""
    ci = ROOT / ".ci" / "run"
    if not ci.exists():
        pytest.skip("no .ci/run here (an sdist): the checkout's test holds the README to it")
    needed = sorted(set(re.findall(r"apt-get install -y -qq (\S+)", ci.read_text())))
    assert needed, ".ci/run installs no Debian package any more: update this test"
    readme = (ROOT / "README.md").read_text()
    tests = " ".join(readme[readme.index("Run the tests") : readme.index("While the example runs")].split())
    assert f"apt-get install {' '.join(needed)}" in tests, (
        f"the README's test section does not say to install {needed}, which .ci/run installs"
    )
