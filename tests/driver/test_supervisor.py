"""The supervisor of `pgtick run --processes N` (``pgtick.supervisor.Supervisor``), with
plain child processes: each reads its stdin until the supervisor closes it, then exits 0."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import pytest

from harness import wait_for
from pgtick.supervisor import Child, Supervisor

#: A child as the supervisor sees a worker: it stops (exit 0) when its stdin closes.
CHILD = [sys.executable, "-c", "import sys; sys.stdin.buffer.read()"]


def _kill_child_0(supervisor: Supervisor, pause: float) -> None:
    """Wait for child 0 to be a live child started after a pause shorter than ``pause``, kill
    it (-9), and wait for the supervisor to see it dead and set its restart ``pause`` away."""

    def live() -> Child | None:
        child = supervisor.children[0] if supervisor.children else None
        return child if child is not None and child.pause < pause and child.popen.poll() is None else None

    child = wait_for("child 0 to be (re)started", live, timeout=60)
    os.kill(child.popen.pid, signal.SIGKILL)
    wait_for(f"a restart of child 0 in {pause:g} s", lambda: child.pause >= pause or None, timeout=60)


def test_a_stop_while_a_killed_child_waits_for_its_restart_exits_0(caplog: pytest.LogCaptureFixture) -> None:
    """A child killed (-9) and killed again right after each restart waits longer each time for
    the next one; a stop in that wait stops the live child cleanly, and the supervisor's code is
    0: the dead child's -9 was an exit already handled (logged and due for a restart), not a
    failure of the stop."""
    caplog.set_level(logging.INFO, logger="pgtick.supervisor")
    supervisor = Supervisor(CHILD, 2, grace=10)
    stop = threading.Event()
    codes: list[int] = []
    running = threading.Thread(target=lambda: codes.append(supervisor.run(stop, [[], []])))
    running.start()
    try:
        for pause in (1.0, 2.0, 4.0, 8.0):  # the pause before each restart doubles while it dies young
            _kill_child_0(supervisor, pause)
        # Child 0 is dead, its restart 8 s away: the supervisor is stopped in that wait.
        stop.set()
        running.join(60)
    finally:
        stop.set()
        supervisor.kill()
        running.join(60)
    log = caplog.text
    assert codes == [0], f"supervisor exit code {codes} after a clean stop\n{log}"
