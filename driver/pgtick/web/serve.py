"""Serving the dashboard with uvicorn: ``pgtick web`` and ``pgtick run --web``."""

from __future__ import annotations

import ipaddress
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from pgtick.errors import PgtickError, UsageError
from pgtick.web.auth import Secret
from pgtick.web.db import DEFAULT_TIMEOUT

log = logging.getLogger("pgtick.web")

DEFAULT_BIND = "127.0.0.1:8080"
PASSWORD_ENV = "PGTICK_WEB_PASSWORD"


def parse_bind(text: str, option: str = "--bind") -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) or ``:PORT`` (127.0.0.1)."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise UsageError(f"{option} must be HOST:PORT such as 127.0.0.1:8080, got {text!r}")
    host = host.strip("[]") or "127.0.0.1"
    try:
        port = int(port_text)
    except ValueError:
        raise UsageError(f"{option} port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"{option} port must be between 0 and 65535, got {port}")
    return host, port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def operator_secret(password_file: str | None) -> Secret | None:
    """The operator secret from --password-file or $PGTICK_WEB_PASSWORD (then removed from the
    environment so child processes do not inherit it); None: read-only."""
    plain: str | None = None
    if password_file:
        try:
            lines = Path(password_file).read_text(encoding="utf-8-sig").splitlines()
        except OSError as exc:
            raise UsageError(f"cannot read --password-file {password_file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise UsageError(f"--password-file {password_file} is not UTF-8 text") from None
        plain = lines[0].strip() if lines else ""
    else:
        plain = os.environ.pop(PASSWORD_ENV, None)
    if plain is None:
        return None
    try:
        return Secret.from_plain(plain)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


#: The names a browser on this machine reaches a loopback-bound dashboard by.
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


def listen(bind: str, option: str = "--bind") -> socket.socket:
    """The dashboard's listening socket, bound before anything is announced: an address
    that cannot be had (taken, not this machine's, a name that does not resolve) is one
    line naming the option."""
    host, port = parse_bind(bind, option)
    try:  # (IPv6 when the host is an IPv6 address, as uvicorn binds)
        return socket.create_server((host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    except OSError as exc:  # (without the address create_server appends: the line names it)
        reason = str(exc.strerror or exc).split(" (while attempting to bind")[0]
        raise PgtickError(f"{option} {bind}: cannot listen: {reason}") from None


def _config(
    dsn: str,
    bind: str,
    sock: socket.socket,
    secret: Secret | None,
    db_timeout: float,
    *,
    cookie_secure: bool = False,
    trust_proxy: bool = False,
) -> object:
    import uvicorn

    from pgtick.web.app import create_app

    host, _ = parse_bind(bind)
    # The address the socket holds, not the text given: 127.1 and a name that resolves to
    # the loopback are the loopback too, and get its guard against other Host names.
    address, port = sock.getsockname()[:2]  # (port: the one the system chose, for port 0)
    loopback = _is_loopback(address)
    if not loopback:
        log.warning(
            "dashboard bound to %s, reachable from other machines: put it behind TLS%s",
            host,
            "" if secret is None else " (the operator password crosses the network)",
        )
    print(
        f"pgtick: dashboard on http://{'[' + host + ']' if ':' in host else host}:{port}/ "
        f"({'operator login enabled' if secret else 'read-only: no operator password given'})",
        file=sys.stderr,
    )
    return uvicorn.Config(
        create_app(
            dsn,
            secret,
            # (and the loopback address it is bound to, 127.0.0.2 as well as 127.0.0.1)
            allowed_hosts=(*LOOPBACK_NAMES, host, address) if loopback else None,
            db_timeout=db_timeout,
            cookie_secure=cookie_secure,
            trust_proxy=trust_proxy,
        ),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        proxy_headers=False,
        server_header=False,
    )


class _Stop:
    """The stop signals (Ctrl-C, SIGTERM) of a dashboard served in the foreground, caught
    from before it announces itself until it has stopped. One that arrives while it starts
    is recorded and stops the server at its next check (uvicorn's ``should_exit``), never
    raised as KeyboardInterrupt into whatever code was running then: code that catches
    everything (or asyncio's own Ctrl-C handler, cancelling a task that absorbs it) let such
    a Ctrl-C pass, and the dashboard served on for ever. uvicorn handles the signals itself
    while it runs and gives back those it caught when it returns."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.server: Any = None

    def _caught(self, signum: int, frame: FrameType | None) -> None:
        self.signals.append(signum)
        if self.server is not None:
            self.server.should_exit = True

    @contextmanager
    def caught(self) -> Iterator[_Stop]:
        previous = {sig: signal.signal(sig, self._caught) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def serve(
    dsn: str,
    bind: str,
    secret: Secret | None,
    db_timeout: float = DEFAULT_TIMEOUT,
    *,
    cookie_secure: bool = False,
    trust_proxy: bool = False,
) -> int:
    """Serve in the foreground until interrupted; a request waits at most `db_timeout`
    seconds for the database; `cookie_secure` and `trust_proxy` as ``create_app`` takes
    them. A Ctrl-C at any moment, however early, ends it as a Ctrl-C
    (KeyboardInterrupt, once the server has stopped); a SIGTERM ends it with 0."""
    import uvicorn

    sock = listen(bind)
    stop = _Stop()
    with stop.caught(), sock:
        config = _config(
            dsn, bind, sock, secret, db_timeout, cookie_secure=cookie_secure, trust_proxy=trust_proxy
        )
        assert isinstance(config, uvicorn.Config)
        server = uvicorn.Server(config)
        stop.server = server
        if not stop.signals:
            server.run(sockets=[sock])
    if signal.SIGINT in stop.signals:
        raise KeyboardInterrupt
    return 0 if server.started or stop.signals else 1


def serve_in_thread(
    dsn: str, bind: str, secret: Secret | None, db_timeout: float = DEFAULT_TIMEOUT
) -> threading.Thread:
    """Serve from a daemon thread (beside ``pgtick run``); it ends with the process. The
    address is bound before the thread starts, so one that cannot be had is the caller's error."""
    import uvicorn

    sock = listen(bind, "--web")
    config = _config(dsn, bind, sock, secret, db_timeout)
    assert isinstance(config, uvicorn.Config)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="pgtick-web", daemon=True)
    thread.start()
    return thread
