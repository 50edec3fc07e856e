"""pgtick for Django: add ``"pgtick.contrib.django"`` to ``INSTALLED_APPS``.

Settings (all optional but ``APP``)::

    PGTICK = {
        "APP": "shop.jobs:app",   # the pgtick.App with your jobs (module:attr)
        "DATABASE": "default",    # the Django database alias pgtick lives in
    }

* ``manage.py migrate`` installs or upgrades the ``jobs`` schema (the app's Django
  migration runs ``pgtick migrate``); ``manage.py pgtick_migrate`` does it alone.
* ``manage.py check --database default`` warns when the schema is missing
  (``pgtick.W001``) or pgtick migrations are pending (``pgtick.W002``); add
  ``--fail-level WARNING`` to fail on them. Every ``check`` fails (``pgtick.E001``) when
  ``PGTICK`` is not a dict or ``PGTICK["DATABASE"]`` is not in ``DATABASES`` or not
  PostgreSQL, and (``pgtick.E002``) when ``PGTICK["APP"]`` is set but does not load.
* ``manage.py pgtick_worker`` / ``pgtick_scheduler`` run a worker / the scheduler for
  ``PGTICK["APP"]``, like ``pgtick run --no-scheduler`` / ``--no-worker``. Job code may
  use the ORM: each job closes stale Django connections before and after it runs, and a
  job of ``isolation="process"`` sets Django up in its child process first (from the
  ``DJANGO_SETTINGS_MODULE`` that ``manage.py`` sets).
* ``pgtick.contrib.django.enqueue(kind, payload, ...)`` enqueues on Django's own
  connection (psycopg 3, Django >= 4.2), so inside ``transaction.atomic()`` the run
  commits or rolls back with everything else in the block. ``client()`` is a ``Client``
  that does the same for every method, and may be kept (it takes Django's connection of
  the moment at each call).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Unpack

import psycopg
from psycopg.conninfo import make_conninfo

from pgtick.app import App
from pgtick.client import Client, EnqueueOptions, Run

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper

__all__ = ["DjangoClient", "client", "database_alias", "dsn", "enqueue", "jobs_app"]


def _libpq_keywords() -> frozenset[str]:
    """Every connection parameter the installed libpq knows (ssl*, channel_binding,
    keepalives*, gssencmode, ...): what is carried from Django's connection settings into
    the worker's DSN. Django's own options (``pool``, ``server_side_binding``, ...) are not."""
    return frozenset(o.keyword.decode() for o in psycopg.pq.Conninfo.get_defaults())


def _settings() -> Mapping[str, Any]:
    """``settings.PGTICK`` (``{}`` when unset); ``ImproperlyConfigured`` when it is not a dict,
    rather than its ``APP`` and ``DATABASE`` taken as unset."""
    from django.conf import settings
    from django.core.exceptions import ImproperlyConfigured

    value = getattr(settings, "PGTICK", {})
    if not isinstance(value, Mapping):
        raise ImproperlyConfigured(
            f'PGTICK must be a dict such as {{"APP": "yourapp.jobs:app"}}, not {type(value).__name__}'
        )
    return value


def database_alias() -> str:
    """``PGTICK["DATABASE"]``, default ``"default"``."""
    return str(_settings().get("DATABASE", "default"))


def _postgresql(using: str | None) -> BaseDatabaseWrapper:
    """Django's connection for ``using`` (default: pgtick's alias); ``ImproperlyConfigured``
    when ``DATABASES`` has no such alias or its engine is not PostgreSQL."""
    from django.core.exceptions import ImproperlyConfigured
    from django.db import connections
    from django.utils.connection import ConnectionDoesNotExist

    alias = using or database_alias()
    try:
        wrapper = connections[alias]
    except ConnectionDoesNotExist:
        raise ImproperlyConfigured(
            f"database {alias!r} (PGTICK['DATABASE'] or --database) is not in DATABASES"
        ) from None
    if wrapper.vendor != "postgresql":
        raise ImproperlyConfigured(
            f"database {alias!r} is not PostgreSQL (ENGINE {wrapper.settings_dict.get('ENGINE')!r}):"
            " pgtick needs PostgreSQL"
        )
    return wrapper


def dsn(using: str | None = None) -> str:
    """A libpq DSN for the Django database ``using`` (default: pgtick's alias).
    ``ImproperlyConfigured`` when that database is missing or not PostgreSQL: an empty DSN
    would send libpq to its defaults, some other server."""
    params = _postgresql(using).get_connection_params()
    keywords = _libpq_keywords()
    return make_conninfo(**{k: str(v) for k, v in params.items() if k in keywords and v not in (None, "")})


def raw_connection(using: str | None = None) -> psycopg.Connection[Any]:
    """Django's own psycopg connection for ``using`` (opened if needed)."""
    wrapper = _postgresql(using)
    wrapper.ensure_connection()
    conn = wrapper.connection
    if not isinstance(conn, psycopg.Connection):
        raise RuntimeError(
            f"database {wrapper.alias!r} is not PostgreSQL on psycopg 3 (Django >= 4.2 needed)"
        )
    return conn


class DjangoClient(Client):
    """A ``Client`` over Django's connection for ``using``, taken at every call: Django's
    connections belong to a thread and are closed and reopened between requests, so a
    client kept for later (at module level, say) calls on the connection of the thread and
    the moment it is used. Each call joins the transaction in progress inside
    ``transaction.atomic()``, as its first statement too, or autocommits outside it, like
    the ORM; ``conn=`` names another connection."""

    def __init__(self, using: str | None = None) -> None:
        _postgresql(using)  # a missing or non-PostgreSQL alias is refused now
        # No connection of its own and none opened here: every call takes Django's connection
        # of the moment (``_connection``), so a client made at import time needs no database.
        super().__init__("")
        self.using = using

    @contextmanager
    def _connection(
        self, conn: psycopg.Connection[Any] | None, wake: bool = False
    ) -> Iterator[psycopg.Connection[Any]]:
        # As the caller's connection: Django leaves autocommit off and sends no BEGIN when a
        # block begins, and the client's own transaction there would commit on its own (an
        # enqueue's NOTIFY goes with the commit of the block or of Django's autocommit).
        ours = conn is None
        try:
            with super()._connection(raw_connection(self.using) if ours else conn) as joined:
                yield joined
        except (psycopg.OperationalError, psycopg.InterfaceError):
            # Told to Django as its own cursors tell it: at the end of the request it then
            # checks the connection and closes it if it is dead (a persistent connection,
            # CONN_MAX_AGE, would otherwise fail every call until its age ran out).
            if ours:
                _postgresql(self.using).errors_occurred = True
            raise


def client(using: str | None = None) -> Client:
    """A ``DjangoClient``: a ``Client`` over Django's connection for ``using``, at every
    call. Each call joins the transaction in progress (inside ``transaction.atomic()``) or
    autocommits (outside), like the ORM."""
    return DjangoClient(using)


def enqueue(
    kind: str,
    payload: Mapping[str, Any] | None = None,
    *,
    using: str | None = None,
    **options: Unpack[EnqueueOptions],
) -> Run:
    """``Client.enqueue`` on Django's connection: inside ``transaction.atomic()`` the run
    commits or rolls back with the block."""
    return DjangoClient(using).enqueue(kind, payload, **options)


def jobs_app() -> App:
    """The ``pgtick.App`` named by ``PGTICK["APP"]`` (``module:attr``)."""
    from django.core.exceptions import ImproperlyConfigured

    from pgtick.errors import UsageError
    from pgtick.runner import load_app

    target = _settings().get("APP")
    if not target:
        raise ImproperlyConfigured('set PGTICK = {"APP": "yourapp.jobs:app"} in settings')
    try:
        return load_app(str(target))
    except UsageError as exc:
        raise ImproperlyConfigured(f"PGTICK['APP']: {exc}") from exc
