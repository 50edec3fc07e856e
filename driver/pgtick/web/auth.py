"""Operator login, sessions and CSRF tokens for the dashboard.

The operator secret (a password or token chosen at start) is kept only as a
salted scrypt hash and compared in constant time. Sessions live in this
process's memory: a random id in an HttpOnly, SameSite=Strict cookie maps to
the CSRF token of that browser and, after a login, the operator's name. Every
POST must carry the session's CSRF token.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import NamedTuple

COOKIE = "pgtick_session"
#: A session unused this long is forgotten (the operator logs in again).
IDLE_SECONDS = 12 * 3600
#: At most this many sessions are kept; the least recently used goes first.
MAX_SESSIONS = 10_000

#: How many forms sent once (``Session.first_send``) a session remembers, the newest.
MAX_SENT_FORMS = 1000

_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}
#: The longest secret, in UTF-8 bytes: a login's password is hashed only up to this length, so
#: a longer secret could never be matched, and a longer password is refused outright.
MAX_SECRET_BYTES = 4096


@dataclass(frozen=True)
class Secret:
    """A salted scrypt hash of the operator secret; the secret itself is not kept."""

    salt: bytes
    digest: bytes

    @classmethod
    def from_plain(cls, plain: str) -> Secret:
        if len(plain) < 8:
            raise ValueError("the operator password must be at least 8 characters long")
        if len(plain.encode()) > MAX_SECRET_BYTES:
            raise ValueError(
                f"the operator password must be at most {MAX_SECRET_BYTES} bytes long,"
                f" got {len(plain.encode())}"
            )
        salt = secrets.token_bytes(16)
        return cls(salt, hashlib.scrypt(plain.encode(), salt=salt, **_SCRYPT))

    def matches(self, candidate: str) -> bool:
        """Whether candidate is the secret. One longer than any secret is hashed only as far
        as a secret may reach (a huge form field costs no more) and refused: its head alone
        must not pass for the secret."""
        encoded = candidate.encode()
        digest = hashlib.scrypt(encoded[:MAX_SECRET_BYTES], salt=self.salt, **_SCRYPT)
        return hmac.compare_digest(digest, self.digest) and len(encoded) <= MAX_SECRET_BYTES


class Flash(NamedTuple):
    """A message shown once on the next page; `link` is (path, text) of a page it names."""

    level: str
    message: str
    link: tuple[str, str] | None = None


@dataclass
class Session:
    id: str
    csrf: str
    operator: str | None = None
    flashes: list[Flash] = field(default_factory=list)
    seen: float = field(default_factory=time.monotonic)
    #: The forms of an action that is not idempotent sent so far, by the random id each was
    #: rendered with, and what each did (None while it is being done).
    sent: OrderedDict[str, int | None] = field(default_factory=OrderedDict)

    def first_send(self, form_id: str) -> bool:
        """Whether the form ``form_id`` comes for the first time; it is marked sent. (No await
        between the check and the mark: two copies sent at once cannot both pass.)"""
        if form_id in self.sent:
            return False
        self.sent[form_id] = None
        if len(self.sent) > MAX_SENT_FORMS:
            self.sent.popitem(last=False)
        return True

    def remember(self, form_id: str, run_id: int) -> None:
        """Record what the form ``form_id`` did (the run it queued), as sent."""
        self.sent[form_id] = run_id
        self.sent.move_to_end(form_id)
        if len(self.sent) > MAX_SENT_FORMS:
            self.sent.popitem(last=False)

    def flash(self, level: str, message: str, link: tuple[str, str] | None = None) -> None:
        self.flashes.append(Flash(level, message, link))

    def take_flashes(self) -> list[Flash]:
        taken, self.flashes = self.flashes, []
        return taken


class Sessions:
    """In-memory sessions, least recently used first."""

    def __init__(self) -> None:
        self._by_id: OrderedDict[str, Session] = OrderedDict()

    def get(self, session_id: str | None) -> Session | None:
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        now = time.monotonic()
        if now - session.seen > IDLE_SECONDS:
            del self._by_id[session_id]
            return None
        session.seen = now
        self._by_id.move_to_end(session_id)
        return session

    def new(self) -> Session:
        session = Session(secrets.token_urlsafe(32), secrets.token_urlsafe(32))
        self._by_id[session.id] = session
        if len(self._by_id) > MAX_SESSIONS:
            self._evict()
        return session

    def _evict(self) -> None:
        """Make room: the least recently used anonymous session goes first, so that requests
        without a cookie (a health check, a flood) never end an operator's session while an
        anonymous one is left; an operator's only when every session is an operator's."""
        anonymous = next((key for key, s in self._by_id.items() if s.operator is None), None)
        if anonymous is not None:
            del self._by_id[anonymous]
        else:
            self._by_id.popitem(last=False)

    def rotate(self, session: Session) -> Session:
        """A fresh id and CSRF token for a session whose privilege changes (login, logout)."""
        self._by_id.pop(session.id, None)
        fresh = self.new()
        fresh.flashes = session.flashes
        return fresh


def csrf_ok(session: Session | None, submitted: str | None) -> bool:
    if session is None or not submitted:
        return False
    return hmac.compare_digest(session.csrf.encode(), submitted.encode())
