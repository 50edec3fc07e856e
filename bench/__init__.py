"""pgtick benchmarks: one command (``bench/run.py``) runs every scenario side by side with
pgqueuer, procrastinate and bare SQL against one throwaway PostgreSQL, and prints one JSON
line per scenario plus a summary of the ratios the performance targets set."""
