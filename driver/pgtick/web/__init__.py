"""The web dashboard (``pgtick web``): see and steer schedules, queues and runs.

Needs the ``web`` extra (``pip install 'pgtick[web]'``).
"""

from __future__ import annotations

from pgtick.web.app import create_app
from pgtick.web.auth import Secret

__all__ = ["Secret", "create_app"]
