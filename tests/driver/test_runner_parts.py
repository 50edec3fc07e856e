"""The parts of ``pgtick run``'s main thread that need no database: its stop signals, and
waiting for the scheduler's and the worker's threads once a stop signal has interrupted a wait
for them."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

import pytest

from pgtick import runner, supervisor


def _exit_now(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(1)


def test_a_second_signal_still_waits_for_a_worker_thread_whose_join_it_interrupted() -> None:
    """The second stop signal raises SystemExit into the main thread while it joins the worker's
    thread. On Python 3.11 that interrupted join() marks the thread stopped although it still
    runs, so every later join() returns at once and the process went on to exit while the
    worker was still letting its runs go (its last steps then failed on an interpreter shutting
    down). The wait after the signal must still last until the thread has ended."""
    release = threading.Event()
    order: list[str] = []

    def target(stop: threading.Event) -> None:
        release.wait(60)
        order.append("the worker thread ended")

    part = runner._thread(target, threading.Event(), "pgtick-worker", [])
    part.start()
    previous = signal.signal(signal.SIGUSR1, _exit_now)
    try:
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        with pytest.raises(SystemExit):
            part.join(30)  # the main loop's join, which the signal interrupts
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert order == [], "the thread cannot have ended: it waits to be released"
    threading.Timer(0.5, release.set).start()
    runner._stop_now(None, [part])
    order.append("the wait returned")
    part.join(60)
    assert order == ["the worker thread ended", "the wait returned"], order


def _handler_under_test(install: str) -> tuple[threading.Event, list[str]]:
    """Install ``pgtick run``'s (``runner``) or the supervisor's stop handlers for SIGTERM and
    SIGINT in this process; the stop event and the supervisor's kills."""
    stop = threading.Event()
    killed: list[str] = []
    if install == "runner":
        runner._install_signal_handlers(stop)
    else:

        class Kills:
            def kill(self) -> None:
                killed.append("killed")

        supervisor._install_signal_handlers(stop, Kills())  # type: ignore[arg-type]
    return stop, killed


@pytest.mark.parametrize("install", ["runner", "supervisor"])
def test_the_stop_signal_delivered_twice_at_once_is_one_stop_and_a_later_one_is_the_second(
    install: str,
) -> None:
    """``timeout`` (without --foreground) sends SIGTERM to the process and then to its process
    group: the process gets it twice at once, each handled. That is one stop (drain), not the
    second signal that exits at once and leaves the runs in flight to the reaper; the same
    signal after the window, or another signal, is the second."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for later in (signal.SIGTERM, signal.SIGINT):
            stop, killed = _handler_under_test(install)
            signal.raise_signal(signal.SIGTERM)  # each handled before raise_signal returns
            signal.raise_signal(signal.SIGTERM)
            assert stop.is_set() and killed == []
            if later == signal.SIGTERM:
                threading.Event().wait(supervisor.REPEAT_WINDOW + 0.1)  # at least the window
            if install == "runner":
                with pytest.raises(SystemExit):
                    signal.raise_signal(later)
            else:
                signal.raise_signal(later)
                assert killed == ["killed"]
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
