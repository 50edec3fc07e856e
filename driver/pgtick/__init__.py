"""pgtick: a job scheduler that lives inside PostgreSQL."""

from __future__ import annotations

from pgtick.app import App, Context
from pgtick.client import AsyncClient, Client, Definition, Run

__version__ = "0.1.0"

__all__ = ["App", "AsyncClient", "Client", "Context", "Definition", "Run", "__version__"]
