"""pgtick: a job scheduler that lives inside PostgreSQL."""

from __future__ import annotations

__version__ = "0.1.0"
