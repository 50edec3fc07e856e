"""Identities this process presents to the database (worker id, scheduler owner, lease owner)."""

from __future__ import annotations

import os
import secrets
import socket


def new_worker_id() -> str:
    """Unique per process: host, pid and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
