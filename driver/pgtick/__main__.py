"""``python -m pgtick``: the same command line as ``pgtick``."""

from __future__ import annotations

from pgtick.cli import entry

if __name__ == "__main__":
    entry()
