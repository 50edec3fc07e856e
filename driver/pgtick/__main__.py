"""``python -m pgtick``: the same command line as ``pgtick``."""

from __future__ import annotations

import sys

from pgtick.cli import main

if __name__ == "__main__":
    sys.exit(main())
