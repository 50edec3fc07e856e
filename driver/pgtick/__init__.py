"""pgtick: a job scheduler that lives inside PostgreSQL.

``App``, ``Client`` and the rest load on first use (with psycopg), so that the ``pgtick``
command starts by reading its arguments, not by loading what it may not need."""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _package_version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgtick.app import App, Context
    from pgtick.client import AsyncClient, Client, Definition, Run
    from pgtick.errors import Snooze

try:  # one source: the version in pyproject.toml, as installed
    __version__ = _package_version("pgtick")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["App", "AsyncClient", "Client", "Context", "Definition", "Run", "Snooze", "__version__"]

_HOMES = {
    "App": "pgtick.app",
    "Context": "pgtick.app",
    "AsyncClient": "pgtick.client",
    "Client": "pgtick.client",
    "Definition": "pgtick.client",
    "Run": "pgtick.client",
    "Snooze": "pgtick.errors",
}


def __getattr__(name: str) -> Any:
    """A public name from its module, or a submodule (``pgtick.errors``), on first use."""
    home = _HOMES.get(name)
    if home is not None:
        value = getattr(importlib.import_module(home), name)
        globals()[name] = value
        return value
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
