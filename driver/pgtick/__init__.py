"""pgtick: a job scheduler that lives inside PostgreSQL."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _package_version

from pgtick.app import App, Context
from pgtick.client import AsyncClient, Client, Definition, Run

try:  # one source: the version in pyproject.toml, as installed
    __version__ = _package_version("pgtick")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["App", "AsyncClient", "Client", "Context", "Definition", "Run", "__version__"]
