"""Identities this process presents to the database (worker id, scheduler owner, lease owner)."""

from __future__ import annotations

import os
import secrets
import socket


def new_claim_token() -> str:
    """The secret a worker process claims with (jobs.claim stores only its hash): the
    proof that a run is its own, which its worker id, visible to every operator, is not.
    Never logged or shown."""
    return secrets.token_urlsafe(32)


def new_worker_id() -> str:
    """Unique per process: host, pid and a random suffix (pids are reused)."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
