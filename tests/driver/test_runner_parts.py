"""The parts of ``pgtick run``'s main thread that need no database: waiting for the scheduler's
and the worker's threads once a stop signal has interrupted a wait for them."""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

import pytest

from pgtick import runner


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
