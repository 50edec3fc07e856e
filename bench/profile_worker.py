"""Where one worker process spends a no-op drain: per-thread cProfile of ``pgtick.worker.Worker``.

    .venv/bin/python bench/profile_worker.py [--jobs 10000] [--batch 10] [--concurrency 10]
                                             [--async] [--no-profile] [--self N] [--dsn DSN]

Queues ``--jobs`` no-op runs in a fresh database (embedded and throwaway unless ``--dsn``),
runs one Worker in this process until they are all COMPLETED (the no-op a plain function on a
job thread, or with ``--async`` an ``async def`` on the worker's event loop), and prints one
line: wall time, rate, Python CPU per job (all threads), the number of claims and rows per
claim, and the load average. With profiling on (the default) it then prints the claim loop's
profile by cumulative time: the share spent waiting for the claim, for the completer and for
finished jobs. With ``--self N`` it also prints the N functions with the most self time over
every thread of the worker (blocking waits such as ``SimpleQueue.get`` and ``lock.acquire``
included: they are threads waiting, not CPU).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import sys_pgtick
from bench.harness import Server, connect


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--async", dest="is_async", action="store_true", help="the no-op as an async def job")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--self", type=int, default=0, metavar="N", help="also the top N by self time")
    parser.add_argument("--dsn", help="a superuser DSN instead of an embedded server")
    args = parser.parse_args()

    from pgtick.app import App, Context
    from pgtick.worker import Worker

    server = Server(args.dsn)
    try:
        dsn = server.fresh_database("profile_worker")
        sys_pgtick.install(dsn)
        sys_pgtick.fill(dsn, args.jobs)
        app = App("profile")

        def noop(ctx: Context) -> None:
            return None

        async def async_noop(ctx: Context) -> None:
            return None

        app.job(sys_pgtick.KIND)(async_noop if args.is_async else noop)

        worker = Worker(app, dsn, worker_id="profile", concurrency=args.concurrency, batch_size=args.batch)
        profiles: list[cProfile.Profile] = []
        thread_run = threading.Thread.run

        def profiled_run(self: threading.Thread) -> None:
            if args.no_profile:
                return thread_run(self)
            profile = cProfile.Profile()
            profiles.append(profile)
            profile.enable()
            try:
                thread_run(self)
            finally:
                profile.disable()

        threading.Thread.run = profiled_run  # type: ignore[method-assign]
        claims: list[int] = []
        dispatch = worker._dispatch

        def counting_dispatch(rows: list[dict[str, Any]], want: int, began: float) -> bool:
            claims.append(len(rows))
            return dispatch(rows, want, began)

        worker._dispatch = counting_dispatch  # type: ignore[method-assign]
        stop = threading.Event()
        loop = threading.Thread(target=worker.run, args=(stop,), name="claim-loop")
        started, cpu = time.perf_counter(), time.process_time()
        loop.start()
        with connect(dsn) as conn:
            left = "SELECT count(*) FROM jobs.runs WHERE status <> 'COMPLETED'"
            while conn.execute(left).fetchone() != (0,):
                time.sleep(0.05)
        wall, cpu = time.perf_counter() - started, time.process_time() - cpu
        stop.set()
        loop.join()
        print(
            f"jobs={args.jobs} batch={args.batch} concurrency={args.concurrency} wall={wall:.2f}s"
            f" rate={args.jobs / wall:.0f}/s python_cpu_per_job={cpu / args.jobs * 1e6:.0f}us"
            f" claims={len(claims)} rows_per_claim={sum(claims) / max(1, len(claims)):.1f}"
            f" load={os.getloadavg()[0]:.1f}"
        )
        if profiles:  # the first thread started is the claim loop
            out = io.StringIO()
            pstats.Stats(profiles[0], stream=out).sort_stats("cumulative").print_stats(20)
            if args.self:
                pstats.Stats(*profiles, stream=out).sort_stats("tottime").print_stats(args.self)
            print(out.getvalue())
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
