"""``python -m pgtick`` and the ``pgtick`` command: the command line of ``pgtick.cli``.

The command line loads psycopg and the driver's modules before it reads its arguments; a
Ctrl-C meanwhile ends it as one while a command runs does (exit 130, nothing on stderr),
not with a traceback of the import it interrupted."""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from pgtick.cli import entry
    except KeyboardInterrupt:
        sys.exit(130)
    entry()


if __name__ == "__main__":
    main()
