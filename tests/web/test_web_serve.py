"""`pgtick web` in the foreground stops on a Ctrl-C or a SIGTERM at any moment of its start.

A stop signal that arrives while the dashboard is still starting (building the app, starting
the event loop, running its startup) must stop it as surely as one that arrives while it
serves: a Ctrl-C raised as KeyboardInterrupt inside whatever code was running then could be
swallowed there, and the dashboard went on serving for ever.
"""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from harness import PGTICK, Database, free_port

#: Seconds between the dashboard's announcement and the signal: from its first steps to serving.
DELAYS = [0.0, 0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0]


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)], ids=["ctrl-c", "sigterm"]
)
def test_a_stop_signal_at_any_moment_of_the_start_stops_the_dashboard(
    db: Database, sig: signal.Signals, code: int
) -> None:
    """Exit 130 for a Ctrl-C (as everywhere in the CLI), 0 for a SIGTERM, never a traceback,
    whenever the signal comes; a dashboard still running a minute after it is a failure."""
    outcomes = []
    for delay in DELAYS:
        web = subprocess.Popen(
            [*PGTICK, "web", "--dsn", db.dsn, "--bind", f"127.0.0.1:{free_port()}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert web.stderr is not None
        first = web.stderr.readline()
        assert "dashboard on" in first, first + web.stderr.read()
        time.sleep(delay)
        web.send_signal(sig)
        try:
            exited: int | str = web.wait(60)
        except subprocess.TimeoutExpired:
            web.kill()
            web.wait()
            exited = "still serving a minute after the signal"
        rest = web.stderr.read()
        outcomes.append((delay, exited, rest.strip()[-300:]))
    wrong = [(d, e, r) for d, e, r in outcomes if e != code or "Traceback" in r]
    assert not wrong, f"expected exit {code} after {sig.name} at each delay; (delay, exit, stderr): {wrong}"
