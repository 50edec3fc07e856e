"""``pgtick run``: load an app, sync it to the database, run scheduler and worker."""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg

from pgtick import calls, migrate
from pgtick.app import App
from pgtick.db import connect
from pgtick.definitions import sync_app
from pgtick.errors import UsageError
from pgtick.execution import describe
from pgtick.identity import new_worker_id
from pgtick.scheduler import Scheduler
from pgtick.supervisor import StopSignals, group_scheduler
from pgtick.worker import Worker, claimable_kinds

log = logging.getLogger("pgtick.run")

#: Seconds the worker of `pgtick run` waits, at most, for the scheduler's first tick.
FIRST_TICK_WAIT = 10.0


def load_app(target: str) -> App:
    """Load ``module:attr``, ``path/to/file.py[:attr]`` or ``module`` (attr defaults to ``app``)."""
    module_part, _, attr = target.partition(":")
    attr = attr or "app"
    try:
        if module_part.endswith(".py") or "/" in module_part:
            path = Path(module_part).resolve()
            if not path.is_file():
                raise UsageError(f"app file not found: {module_part}")
            sys.path.insert(0, str(path.parent))
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or spec.loader is None:
                raise UsageError(f"cannot load app file {module_part}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            spec.loader.exec_module(module)
        else:
            if not all(part.isidentifier() for part in module_part.split(".")):
                raise UsageError(
                    f"{module_part!r} is not a module name: give module[:attr] or path/to/file.py[:attr]"
                )
            sys.path.insert(0, str(Path.cwd()))
            module = importlib.import_module(module_part)
    except UsageError:  # no app file or module name: nothing of the app ran
        raise
    except ModuleNotFoundError as exc:
        raise UsageError(f"cannot import app module {module_part!r}: {exc}") from exc
    except SyntaxError as exc:
        raise UsageError(f"{exc.filename}:{exc.lineno}: syntax error in the app: {exc.msg}") from exc
    except Exception as exc:  # the app's own code failed while it was imported
        raise UsageError(
            f"{_where_raised(exc)}: the app raised {describe(exc)} while it was imported"
        ) from exc
    app = getattr(module, attr, None)
    if not isinstance(app, App):
        raise UsageError(f"{target}: no pgtick.App named {attr!r} in {module_part}")
    return app


def _where_raised(exc: BaseException) -> str:
    """``file:line`` of the innermost frame of the traceback outside Python's own library and
    installed packages (the app's code), else of the innermost frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if "site-packages" not in f.filename and not f.filename.startswith(_STDLIB)]
    chosen = ours or frames
    return f"{chosen[-1].filename}:{chosen[-1].lineno}" if chosen else "the app"


_STDLIB = str(Path(os.__file__).parent)


@dataclass
class RunOptions:
    concurrency: int = 10
    batch_size: int | None = None
    claimers: int = 1  # claims in flight at once while there is a backlog
    tick_interval: float = 1.0
    poll_interval: float = 1.0
    heartbeat_interval: float = 5.0
    shutdown_grace: float = 30.0
    scheduler: bool = True
    worker: bool = True
    metrics_port: int | None = None
    metrics_bind: str = "0.0.0.0"  # the address the metrics endpoint listens on
    metrics_per_definition: bool = False
    listen: bool = True
    leadership: str = "auto"
    lease_ttl: float | None = None
    queues: list[str] | None = None  # claim only from these queues (None: all)
    owner: str | None = None  # the scheduler's and worker's id (None: a new one)


def check_login(conn: psycopg.Connection[Any], options: RunOptions) -> bool:
    """True when the login may write the app's schedules and retry policies (jobs_operator);
    a worker-only login may only work: UsageError unless the scheduler is off."""
    if calls.can_operate(conn):
        return True
    if options.scheduler:
        raise UsageError(
            "this login is not a member of jobs_operator: it cannot schedule or write the app's"
            " schedules and retry policies; pass --no-scheduler to only work with it"
        )
    return False


def check_schema(conn: psycopg.Connection[Any]) -> None:
    """Start only on a jobs schema this driver can work with: ``SchemaMismatch`` (run
    ``pgtick migrate``) when it is missing or older; a warning when it is newer."""
    newer = migrate.check_schema(conn)
    if newer is not None:
        log.warning("%s", newer)


#: Exit code of ``pgtick run`` when the worker or the scheduler stopped on an error it
#: could not go on from (after handing back what it held).
EXIT_FAILED = 1


def run_app(app: App, dsn: str, options: RunOptions, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or ``stop``); returns the process exit code: 0 after a
    stop, ``EXIT_FAILED`` when the worker or the scheduler failed (the other one is
    stopped too: a process that cannot do its whole job exits for its supervisor to
    restart it, rather than living on half idle)."""
    stop = stop or threading.Event()
    if options.worker:
        claimable_kinds(app)  # an app its worker cannot claim for: said before anything starts
    _install_signal_handlers(stop)
    with connect(dsn, application_name="pgtick-sync") as conn:
        check_schema(conn)
        if check_login(conn, options):
            sync_app(app, conn)
        else:
            log.info(
                "worker-only login: the app's schedules and retry policies are left as an operator wrote them"
            )
    if not app.has_database:
        app.use(dsn)  # app.enqueue in job code writes where this process works
    worker_id = options.owner or new_worker_id()
    threads: list[_Part] = []
    failures: list[str] = []
    listener = None
    if options.metrics_port is not None:
        from pgtick.metrics import serve_metrics

        # pgtick_leader says whether this process leads; the first child of a supervisor
        # that schedules says it for the supervisor, which serves no metrics of its own.
        leader = group_scheduler() or worker_id
        listener, _ = serve_metrics(
            options.metrics_port,
            dsn,
            leader,
            per_definition=options.metrics_per_definition,
            bind=options.metrics_bind,
        )
    scheduler: Scheduler | None = None
    worker: Worker | None = None
    if options.scheduler:
        scheduler = Scheduler(
            dsn,
            owner=worker_id,
            tick_interval=options.tick_interval,
            leadership=options.leadership,
            lease_ttl=options.lease_ttl,
        )
        threads.append(_thread(scheduler.run, stop, "pgtick-scheduler", failures))
    if options.worker:
        worker = Worker(
            app,
            dsn,
            worker_id=worker_id,
            concurrency=options.concurrency,
            batch_size=options.batch_size,
            claimers=options.claimers,
            poll_interval=options.poll_interval,
            heartbeat_interval=options.heartbeat_interval,
            shutdown_grace=options.shutdown_grace,
            listener=listener,
            listen=options.listen,
            queues=options.queues,
        )
        threads.append(_thread(worker.run, stop, "pgtick-worker", failures))
    try:
        for t in threads:
            t.start()
            if scheduler is not None and t.name == "pgtick-scheduler" and options.worker:
                # The scheduler's first tick settles a catch-up after downtime (it supersedes the
                # runs made ahead before the downtime) before this process's worker can claim
                # them; bounded, so a slow first tick delays the worker by FIRST_TICK_WAIT at most.
                deadline = time.monotonic() + FIRST_TICK_WAIT
                while not scheduler.first_tick_done.wait(0.1) and not stop.is_set():
                    if time.monotonic() > deadline:
                        break
        while any(t.is_alive() for t in threads):
            for t in threads:
                t.join(timeout=0.5)
    except KeyboardInterrupt:
        stop.set()
        for t in threads:
            if t.ident is not None:  # started (see _Part: not join(), which the interrupt may have spoilt)
                t.ended.wait()
    except SystemExit:  # the second signal: the worker ends its drain now and stops its job processes
        stop.set()
        _stop_now(worker, threads)
        raise
    if failures:
        log.error("stopped: %s failed (exit code %d)", " and ".join(failures), EXIT_FAILED)
        return EXIT_FAILED
    return 0


class _Part(threading.Thread):
    """The scheduler's or the worker's thread, with ``ended`` set once its target has returned.

    A wait for it after a signal interrupted a ``join()`` reads ``ended``, not ``join()`` or
    ``is_alive()``: on Python 3.11 an exception raised into ``join()`` (the second signal's
    SystemExit) can leave the thread marked stopped while it still runs, and every later
    ``join()`` then returns at once."""

    def __init__(self, run: Callable[[], None], name: str) -> None:
        super().__init__(target=run, name=name)
        self.ended = threading.Event()


def _thread(
    target: Callable[[threading.Event], None], stop: threading.Event, name: str, failures: list[str]
) -> _Part:
    """A thread running ``target(stop)``; if it raises, the others are stopped and ``name``
    is added to ``failures``."""

    def run() -> None:
        try:
            target(stop)
        except BaseException as exc:
            failures.append(name)
            stop.set()
            log.error("%s failed: %s", name, describe(exc), exc_info=exc)
        finally:
            part.ended.set()

    part = _Part(run, name)
    return part


#: Seconds a second signal waits, at most, for the worker to let its runs go and stop its job
#: processes before the process exits anyway.
STOP_NOW_WAIT = 10.0


def _stop_now(worker: Worker | None, threads: list[_Part]) -> None:
    """End the worker's drain at once (its runs in flight are left to the reaper) and wait a
    little for it, then for the threads to end; its job processes are killed either way: they
    ignore SIGTERM, and Python's exit would wait for them (multiprocessing joins its children)."""
    if worker is not None:
        worker.hurry()
    deadline = time.monotonic() + STOP_NOW_WAIT
    try:
        for t in threads:
            if t.ident is not None:  # started
                t.ended.wait(max(0.0, deadline - time.monotonic()))
    except SystemExit:  # a third signal: wait no more
        pass
    finally:
        if worker is not None:
            worker.processes.close()


def _install_signal_handlers(stop: threading.Event) -> None:
    if threading.current_thread() is not threading.main_thread():
        return
    signals = StopSignals()

    def handle(signum: int, frame: FrameType | None) -> None:
        if signals.is_repeat(signum):
            return
        if stop.is_set():
            log.warning("second signal: exiting now")
            raise SystemExit(1)
        stop.set()
        log.info("signal %s: stopping (claiming nothing more, draining)", signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
