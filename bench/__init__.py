"""pgtick benchmarks: one command (``bench/run.py``) runs every scenario side by side with
pgqueuer, procrastinate and bare SQL against one throwaway PostgreSQL, and prints one JSON
line per scenario plus a summary of the ratios the performance targets set."""

import sys
from pathlib import Path

# This checkout's pgtick, ahead of whichever one the environment installed (an editable install
# of another checkout, say): the commit and digest a run reports name this checkout, so this is
# the code it must measure. Worker processes started with multiprocessing inherit sys.path.
_DRIVER = str(Path(__file__).resolve().parent.parent / "driver")
_loaded = sys.modules.get("pgtick")
if _loaded is not None and not str(_loaded.__file__).startswith(_DRIVER):
    raise ImportError(f"bench measures {_DRIVER}, but pgtick was imported from {_loaded.__file__} first")
if sys.path[:1] != [_DRIVER]:
    sys.path.insert(0, _DRIVER)
